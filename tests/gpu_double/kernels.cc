#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "arrays.h"
#include "state.h"

namespace ivcuda::gpu_double {
namespace {

// Spins of the emulated device are capped so that a wrong argument cannot hang a test run
// (the state lock is held while a kernel runs).
constexpr std::uint64_t kMaxSpinNs = 200'000'000;

CUresult mismatch(const KernelEnv& env) {
  log("the PTX parameter list of %s does not match its CPU implementation", env.entry.name.c_str());
  return CUDA_ERROR_NOT_SUPPORTED;
}

template <class T>
T* ptr(std::uint64_t p) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(p));
}

// Elements a guarded 1D kernel (`if (i < n)`) touches.
std::uint64_t active(const KernelEnv& env, std::int64_t n) {
  return n <= 0 ? 0 : std::min<std::uint64_t>(static_cast<std::uint64_t>(n), env.threads_x());
}

// What the GPU would report for `count` accesses of `elem` bytes from p: misaligned
// accesses fault before out-of-range ones are noticed.
CUresult access(const KernelEnv& env, std::uint64_t p, std::uint64_t count, std::size_t elem) {
  if (count == 0) return CUDA_SUCCESS;
  if (p % elem != 0) return CUDA_ERROR_MISALIGNED_ADDRESS;
  if (count > SIZE_MAX / elem ||
      !env.reachable(static_cast<std::uintptr_t>(p), static_cast<std::size_t>(count) * elem))
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  return CUDA_SUCCESS;
}

#define IVC_ACCESS(env, p, count, elem)                                                 \
  do {                                                                                  \
    if (const CUresult r_ = access(env, p, count, elem); r_ != CUDA_SUCCESS) return r_; \
  } while (0)

CUresult vec_add(KernelEnv& env) {
  std::uint64_t a = 0, b = 0, c = 0;
  int n = 0;
  if (!env.param(0, &a) || !env.param(1, &b) || !env.param(2, &c) || !env.param(3, &n))
    return mismatch(env);
  const std::uint64_t k = active(env, n);
  IVC_ACCESS(env, a, k, 4);
  IVC_ACCESS(env, b, k, 4);
  IVC_ACCESS(env, c, k, 4);
  for (std::uint64_t i = 0; i < k; ++i)
    ptr<float>(c)[i] = ptr<const float>(a)[i] + ptr<const float>(b)[i];
  return CUDA_SUCCESS;
}

CUresult fill_u32(KernelEnv& env) {
  std::uint64_t p = 0, n = 0;
  unsigned value = 0;
  if (!env.param(0, &p) || !env.param(1, &value) || !env.param(2, &n)) return mismatch(env);
  IVC_ACCESS(env, p, n, 4);
  std::fill_n(ptr<unsigned>(p), n, value);  // grid-stride loop: every element
  return CUDA_SUCCESS;
}

CUresult reduce_sum(KernelEnv& env) {
  std::uint64_t in = 0, out = 0;
  int n = 0;
  if (!env.param(0, &in) || !env.param(1, &out) || !env.param(2, &n)) return mismatch(env);
  const std::uint64_t k = n > 0 ? static_cast<std::uint64_t>(n) : 0;  // block-stride: all n
  IVC_ACCESS(env, in, k, 4);
  IVC_ACCESS(env, out, 1, 4);
  float sum = 0.0f;
  for (std::uint64_t i = 0; i < k; ++i) sum += ptr<const float>(in)[i];
  *ptr<float>(out) = sum;
  return CUDA_SUCCESS;
}

struct ScaleParams {  // the kernel's by-value struct, laid out as nvcc does
  float scale;
  int offset;
  double bias;
};
static_assert(sizeof(ScaleParams) == 16 && alignof(ScaleParams) == 8);

CUresult scale_struct(KernelEnv& env) {
  ScaleParams sp{};
  std::uint64_t data = 0;
  int n = 0;
  if (!env.param(0, &sp) || !env.param(1, &data) || !env.param(2, &n)) return mismatch(env);
  if (env.entry.params[0].align != alignof(ScaleParams)) return mismatch(env);
  const std::uint64_t k = active(env, n);
  IVC_ACCESS(env, data, k, 4);
  float* d = ptr<float>(data);
  for (std::uint64_t i = 0; i < k; ++i)
    d[i] = static_cast<float>(d[i] * sp.scale + static_cast<float>(sp.offset) + sp.bias);
  return CUDA_SUCCESS;
}

CUresult add_const(KernelEnv& env) {
  std::uint64_t data = 0;
  int n = 0;
  if (!env.param(0, &data) || !env.param(1, &n)) return mismatch(env);
  unsigned char* addend = env.global("ivc_const_addend", sizeof(float));
  unsigned char* count = env.global("ivc_launch_count", sizeof(unsigned));
  if (addend == nullptr || count == nullptr) return mismatch(env);
  const std::uint64_t k = active(env, n);
  IVC_ACCESS(env, data, k, 4);
  float add = 0.0f;
  std::memcpy(&add, addend, sizeof add);
  for (std::uint64_t i = 0; i < k; ++i) ptr<float>(data)[i] += add;
  unsigned launches = 0;  // thread 0 always exists, so every launch counts once
  std::memcpy(&launches, count, sizeof launches);
  ++launches;
  std::memcpy(count, &launches, sizeof launches);
  return CUDA_SUCCESS;
}

CUresult spin_ns(KernelEnv& env) {
  std::uint64_t ns = 0;
  if (!env.param(0, &ns)) return mismatch(env);
  if (!fuzzing()) std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(ns, kMaxSpinNs)));
  return CUDA_SUCCESS;
}

CUresult fault(KernelEnv& env) {
  std::uint64_t p = 0;
  if (!env.param(0, &p)) return mismatch(env);
  IVC_ACCESS(env, p, 1, sizeof(int));
  const int v = 42;
  std::memcpy(ptr<int>(p), &v, sizeof v);
  return CUDA_SUCCESS;
}

// ---- rt_features.cu (tests/runtime): one CPU version per kernel there ---------------------

struct RtfMixed {  // ivc_rtf_mixed, laid out as nvcc does
  char c;
  double d;
  short s;
  float f[3];
};
static_assert(sizeof(RtfMixed) == 32 && alignof(RtfMixed) == 8);
struct RtfArr {
  int v[7];
};
static_assert(sizeof(RtfArr) == 28);

CUresult rtf_params(KernelEnv& env) {
  RtfMixed m{};
  RtfArr a{};
  char c = 0;
  short sh = 0;
  unsigned char uc = 0;
  std::uint64_t in = 0, out = 0, u64 = 0;
  std::int64_t s64 = 0;
  float f = 0;
  double d = 0;
  int n = 0;
  if (!env.param(0, &m) || !env.param(1, &c) || !env.param(2, &a) || !env.param(3, &in) ||
      !env.param(4, &sh) || !env.param(5, &out) || !env.param(6, &s64) || !env.param(7, &uc) ||
      !env.param(8, &u64) || !env.param(9, &f) || !env.param(10, &d) || !env.param(11, &n))
    return mismatch(env);
  const std::uint64_t k = active(env, n);
  IVC_ACCESS(env, in, k, 8);
  IVC_ACCESS(env, out, k, 8);
  for (std::uint64_t i = 0; i < k; ++i)
    ptr<double>(out)[i] = ptr<const double>(in)[i] * d + f + static_cast<double>(s64) +
                          static_cast<double>(u64 & 0xffffu) + c + sh + uc + m.c + m.d + m.s +
                          m.f[i % 3] + a.v[i % 7];
  return CUDA_SUCCESS;
}

CUresult rtf_symbols(KernelEnv& env) {
  std::uint64_t out = 0;
  int n = 0;
  if (!env.param(0, &out) || !env.param(1, &n)) return mismatch(env);
  unsigned char* table = env.global("ivc_rtf_table", 64 * sizeof(float));
  unsigned char* coef = env.global("ivc_rtf_coef", 4 * sizeof(float));
  unsigned char* offset = env.global("ivc_rtf_offset", sizeof(int));
  unsigned char* hits = env.global("ivc_rtf_hits", sizeof(unsigned));
  if (table == nullptr || coef == nullptr || offset == nullptr || hits == nullptr)
    return mismatch(env);
  const std::uint64_t k = active(env, n);
  IVC_ACCESS(env, out, k, 4);
  float t[64], c[4];
  int off = 0;
  std::memcpy(t, table, sizeof t);
  std::memcpy(c, coef, sizeof c);
  std::memcpy(&off, offset, sizeof off);
  for (std::uint64_t i = 0; i < k; ++i) ptr<float>(out)[i] = t[i % 64] * c[i % 4] + static_cast<float>(off);
  unsigned h = 0;
  std::memcpy(&h, hits, sizeof h);
  ++h;
  std::memcpy(hits, &h, sizeof h);
  return CUDA_SUCCESS;
}

CUresult rtf_axpy(KernelEnv& env) {
  float a = 0;
  std::uint64_t x = 0, y = 0;
  int n = 0;
  if (!env.param(0, &a) || !env.param(1, &x) || !env.param(2, &y) || !env.param(3, &n))
    return mismatch(env);
  const std::uint64_t k = active(env, n);
  IVC_ACCESS(env, x, k, 4);
  IVC_ACCESS(env, y, k, 4);
  for (std::uint64_t i = 0; i < k; ++i) ptr<float>(y)[i] = a * ptr<const float>(x)[i] + ptr<float>(y)[i];
  return CUDA_SUCCESS;
}

CUresult rtf_iota(KernelEnv& env) {
  std::uint64_t p = 0;
  int base = 0, step = 0, n = 0;
  if (!env.param(0, &p) || !env.param(1, &base) || !env.param(2, &step) || !env.param(3, &n))
    return mismatch(env);
  const std::uint64_t k = n > 0 ? static_cast<std::uint64_t>(n) : 0;  // grid-stride: all n
  IVC_ACCESS(env, p, k, 4);
  for (std::uint64_t i = 0; i < k; ++i)  // int arithmetic wraps on the GPU; do it unsigned here
    ptr<int>(p)[i] = static_cast<int>(static_cast<unsigned>(base) + static_cast<unsigned>(i) * static_cast<unsigned>(step));
  return CUDA_SUCCESS;
}

CUresult rtf_twice_plus(KernelEnv& env) {
  std::uint64_t p = 0;
  int add = 0, n = 0;
  if (!env.param(0, &p) || !env.param(1, &add) || !env.param(2, &n)) return mismatch(env);
  const std::uint64_t k = active(env, n);
  IVC_ACCESS(env, p, k, 4);
  for (std::uint64_t i = 0; i < k; ++i)
    ptr<int>(p)[i] = static_cast<int>(2u * static_cast<unsigned>(ptr<int>(p)[i]) + static_cast<unsigned>(add));
  return CUDA_SUCCESS;
}

// Both phases of the cooperative kernel; the grid barrier between them is the launch order here.
CUresult rtf_coop(KernelEnv& env) {
  std::uint64_t a = 0, b = 0;
  int n = 0;
  if (!env.param(0, &a) || !env.param(1, &b) || !env.param(2, &n)) return mismatch(env);
  if (n <= 0) return CUDA_SUCCESS;
  const auto k = static_cast<std::uint64_t>(n);
  IVC_ACCESS(env, a, k, 4);
  IVC_ACCESS(env, b, k, 4);
  int* pa = ptr<int>(a);
  for (std::uint64_t i = 0; i < k; ++i) pa[i] = static_cast<int>(i) * 3 + 1;
  for (std::uint64_t i = 0; i < k; ++i) ptr<int>(b)[i] = pa[k - 1 - i] + pa[(i + 1) % k];
  return CUDA_SUCCESS;
}

// Device printf: a real driver writes the kernel's lines to its process's stdout at the next
// synchronisation; the double writes them at once (its launches are synchronous).
CUresult rtf_printf(KernelEnv& env) {
  int lines = 0;
  long long big = 0;
  double x = 0;
  if (!env.param(0, &lines) || !env.param(1, &big) || !env.param(2, &x)) return mismatch(env);
  for (int k = 0; k < lines; ++k)
    std::printf("ivc printf %d/%d: %lld %u 0x%x %.3f %c\n", k, lines, big + k,
                static_cast<unsigned>(k) * 7u, k * 255, x * k, 'a' + k);
  std::fflush(stdout);
  return CUDA_SUCCESS;
}

// The CPU may store the flag while the kernel runs: every access is atomic.
CUresult wait_flag(KernelEnv& env) {
  std::uint64_t flag = 0, out = 0, timeout_ns = 0;
  if (!env.param(0, &flag) || !env.param(1, &out) || !env.param(2, &timeout_ns)) return mismatch(env);
  IVC_ACCESS(env, flag, 1, 4);
  IVC_ACCESS(env, out, 1, 4);
  std::atomic_ref<unsigned> f(*ptr<unsigned>(flag));
  std::atomic_ref<unsigned> o(*ptr<unsigned>(out));
  // Capped like spins: a test that forgets the flag must not hang the double.
  constexpr std::uint64_t kMaxWaitNs = 30'000'000'000;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(fuzzing() ? 0 : std::min(timeout_ns, kMaxWaitNs));
  unsigned v = 0;
  while ((v = f.load(std::memory_order_acquire)) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      o.store(0xffffffffu, std::memory_order_release);
      return CUDA_SUCCESS;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  o.store(v + 1, std::memory_order_release);
  return CUDA_SUCCESS;
}

struct HeadArgs {  // ivc_head_args' by-value struct: 4 KiB, of which a launch may pass the head
  unsigned count;
  unsigned vals[1023];
};

CUresult head_args(KernelEnv& env) {
  std::uint64_t out = 0;
  HeadArgs a{};
  if (!env.param(0, &out) || !env.param(1, &a)) return mismatch(env);
  const std::uint64_t k = std::min<std::uint64_t>({a.count, 16, env.block[0]});
  IVC_ACCESS(env, out, k, 4);
  for (std::uint64_t i = 0; i < k; ++i) ptr<unsigned>(out)[i] = a.vals[i];
  return CUDA_SUCCESS;
}

CUresult inc_u32(KernelEnv& env) {
  std::uint64_t p = 0;
  if (!env.param(0, &p)) return mismatch(env);
  IVC_ACCESS(env, p, 1, 4);
  std::atomic_ref<unsigned>(*ptr<unsigned>(p)).fetch_add(1, std::memory_order_acq_rel);
  return CUDA_SUCCESS;
}

// link_main.cu, linked with link_lib.cu at run time (tests/programs/drv_link.cc).
CUresult link_apply(KernelEnv& env) {
  std::uint64_t data = 0;
  int n = 0;
  if (!env.param(0, &data) || !env.param(1, &n)) return mismatch(env);
  const std::uint64_t k = active(env, n);
  IVC_ACCESS(env, data, k, 4);
  for (std::uint64_t i = 0; i < k; ++i) ptr<float>(data)[i] = 2.0f * ptr<float>(data)[i] + 1.0f;
  return CUDA_SUCCESS;
}

// lib_nvrtc.cu (tests/libs) compiles this one at run time, to PTX and to a cubin.
CUresult rtc_axpb(KernelEnv& env) {
  std::uint64_t x = 0, y = 0;
  float a = 0, b = 0;
  int n = 0;
  if (!env.param(0, &x) || !env.param(1, &y) || !env.param(2, &a) || !env.param(3, &b) ||
      !env.param(4, &n))
    return mismatch(env);
  unsigned char* calls = env.global("ivc_rtc_calls", sizeof(unsigned));
  if (calls == nullptr) return mismatch(env);
  const std::uint64_t k = active(env, n);
  IVC_ACCESS(env, x, k, 4);
  IVC_ACCESS(env, y, k, 4);
  for (std::uint64_t i = 0; i < k; ++i) ptr<float>(y)[i] = a * ptr<const float>(x)[i] + b;
  unsigned c = 0;
  std::memcpy(&c, calls, sizeof c);
  ++c;
  std::memcpy(calls, &c, sizeof c);
  return CUDA_SUCCESS;
}

// Texture and surface test kernels (test_kernels.cu, rt_texture.cu): 2D float arrays (or
// pitched float memory) read point-sampled at unnormalised coordinates with clamp or border
// addressing, and written through a surface. Other texture setups are not emulated.
CUresult tex2d_read(KernelEnv& env) {
  std::uint64_t tex = 0, out = 0;
  int w = 0, h = 0, dx = 0, dy = 0;
  if (!env.param(0, &tex) || !env.param(1, &out) || !env.param(2, &w) || !env.param(3, &h) || !env.param(4, &dx) ||
      !env.param(5, &dy))
    return mismatch(env);
  const TexObj* t = find_object(tex, false);
  if (t == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;  // a garbage object faults on a GPU
  const unsigned char* base = nullptr;
  std::size_t tw = 0, th = 0, pitch = 0;
  if (t->res.resType == CU_RESOURCE_TYPE_ARRAY) {
    ArrayObj* a = find_array(reinterpret_cast<Handle>(t->res.res.array.hArray));
    // Sparse and deferred-mapping arrays keep their bytes in tiles (api_arrays.cc): not sampled here.
    if (a == nullptr || !a->dense() || a->desc.Format != CU_AD_FORMAT_FLOAT || a->desc.NumChannels != 1)
      return CUDA_ERROR_NOT_SUPPORTED;
    base = a->data.data();
    tw = a->desc.Width;
    th = a->rows();
    pitch = a->row_bytes();
  } else if (t->res.resType == CU_RESOURCE_TYPE_PITCH2D) {
    const auto& q = t->res.res.pitch2D;
    if (q.format != CU_AD_FORMAT_FLOAT || q.numChannels != 1) return CUDA_ERROR_NOT_SUPPORTED;
    IVC_ACCESS(env, q.devPtr, 1, 4);
    base = ptr<const unsigned char>(q.devPtr);
    tw = q.width;
    th = q.height;
    pitch = q.pitchInBytes;
  } else {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (t->tex.filterMode != CU_TR_FILTER_MODE_POINT || (t->tex.flags & CU_TRSF_NORMALIZED_COORDINATES) != 0)
    return CUDA_ERROR_NOT_SUPPORTED;
  const auto mode_x = t->tex.addressMode[0], mode_y = t->tex.addressMode[1];
  for (auto m : {mode_x, mode_y})
    if (m != CU_TR_ADDRESS_MODE_CLAMP && m != CU_TR_ADDRESS_MODE_BORDER) return CUDA_ERROR_NOT_SUPPORTED;
  const std::uint64_t nx = w > 0 ? std::min<std::uint64_t>(static_cast<std::uint64_t>(w), env.threads_x()) : 0;
  const std::uint64_t ny = h > 0 ? std::min<std::uint64_t>(static_cast<std::uint64_t>(h), std::uint64_t{env.grid[1]} * env.block[1]) : 0;
  if (nx == 0 || ny == 0) return CUDA_SUCCESS;
  IVC_ACCESS(env, out, static_cast<std::uint64_t>(w) * (ny - 1) + nx, 4);
  for (std::uint64_t y = 0; y < ny; ++y)
    for (std::uint64_t x = 0; x < nx; ++x) {
      // Texel (x + dx, y + dy): the point sample's floor of a texel centre.
      long long u = static_cast<long long>(x) + dx, v = static_cast<long long>(y) + dy;
      float value = 0.0f;
      const bool out_x = u < 0 || u >= static_cast<long long>(tw);
      const bool out_y = v < 0 || v >= static_cast<long long>(th);
      if ((out_x && mode_x == CU_TR_ADDRESS_MODE_BORDER) || (out_y && mode_y == CU_TR_ADDRESS_MODE_BORDER)) {
        value = t->tex.borderColor[0];
      } else {
        u = std::clamp<long long>(u, 0, static_cast<long long>(tw) - 1);
        v = std::clamp<long long>(v, 0, static_cast<long long>(th) - 1);
        std::memcpy(&value, base + static_cast<std::size_t>(v) * pitch + static_cast<std::size_t>(u) * 4, 4);
      }
      ptr<float>(out)[y * static_cast<std::uint64_t>(w) + x] = value;
    }
  return CUDA_SUCCESS;
}

CUresult surf2d_write(KernelEnv& env) {
  std::uint64_t surf = 0;
  int w = 0, h = 0;
  float base = 0;
  if (!env.param(0, &surf) || !env.param(1, &w) || !env.param(2, &h) || !env.param(3, &base)) return mismatch(env);
  const TexObj* t = find_object(surf, true);
  if (t == nullptr || t->res.resType != CU_RESOURCE_TYPE_ARRAY) return CUDA_ERROR_ILLEGAL_ADDRESS;
  ArrayObj* a = find_array(reinterpret_cast<Handle>(t->res.res.array.hArray));
  if (a == nullptr || !a->dense() || a->elem != 4) return CUDA_ERROR_NOT_SUPPORTED;
  const std::uint64_t nx = w > 0 ? std::min<std::uint64_t>(static_cast<std::uint64_t>(w), env.threads_x()) : 0;
  const std::uint64_t ny = h > 0 ? std::min<std::uint64_t>(static_cast<std::uint64_t>(h), std::uint64_t{env.grid[1]} * env.block[1]) : 0;
  // The default boundary mode traps: a write outside the array faults.
  if (nx > a->desc.Width || ny > a->rows()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  for (std::uint64_t y = 0; y < ny; ++y)
    for (std::uint64_t x = 0; x < nx; ++x) {
      const float v = base + static_cast<float>(x) + 1000.0f * static_cast<float>(y);
      std::memcpy(a->at(x * 4, y, 0), &v, 4);
    }
  return CUDA_SUCCESS;
}

// The worker's scrub kernels (host-daemon/worker/scrub_kernels.cu) and the
// residue probes of test_kernels.cu (drv_recycle --kernels, --heap): the
// double has no shared memory, local memory or device heap, so a kernel
// leaves nothing there and finds nothing; only the parameters are checked
// (and a kernel that calls malloc fixes the heap's size: api_context.cc).
CUresult scrub_words(KernelEnv& env) {
  unsigned words = 0;
  return env.param(0, &words) ? CUDA_SUCCESS : mismatch(env);
}
CUresult leave_residue(KernelEnv& env) {
  unsigned pattern = 0;
  return env.param(0, &pattern) ? CUDA_SUCCESS : mismatch(env);
}
CUresult find_residue(KernelEnv& env) {
  unsigned pattern = 0;
  std::uint64_t found = 0;
  if (!env.param(0, &pattern) || !env.param(1, &found)) return mismatch(env);
  IVC_ACCESS(env, found, 1, sizeof(unsigned));
  return CUDA_SUCCESS;
}

struct Registered {
  std::string_view name;
  CpuKernel fn;
};

constexpr Registered kKernels[] = {
    {"ivc_vec_add", vec_add},       {"ivc_fill_u32", fill_u32},
    {"ivc_reduce_sum", reduce_sum}, {"ivc_scale_struct", scale_struct},
    {"ivc_add_const", add_const},   {"ivc_spin_ns", spin_ns},
    {"ivc_fault", fault},
    {"ivc_wait_flag", wait_flag},   {"ivc_inc_u32", inc_u32},
    {"ivc_head_args", head_args},
    {"ivc_rtf_params", rtf_params}, {"ivc_rtf_symbols", rtf_symbols},
    {"ivc_rtf_axpy", rtf_axpy},     {"ivc_rtf_iota", rtf_iota},
    {"ivc_rtf_twice_plus", rtf_twice_plus}, {"ivc_rtf_coop", rtf_coop},
    {"ivc_rtf_printf", rtf_printf},
    {"ivc_rtc_axpb", rtc_axpb},     {"ivc_link_apply", link_apply},
    {"ivc_tex2d_read", tex2d_read}, {"ivc_surf2d_write", surf2d_write},
    {"ivcuda_scrub_shared", scrub_words}, {"ivcuda_scrub_local", scrub_words},
    {"ivc_leave_shared", leave_residue}, {"ivc_leave_local", leave_residue},
    {"ivc_leave_heap", leave_residue},
    {"ivc_find_shared", find_residue}, {"ivc_find_local", find_residue},
    {"ivc_find_heap", find_residue},
};

// Stands in for kernels the double has no CPU version of (a library's SASS) when
// IVCUDA_DOUBLE_UNKNOWN_KERNELS=skip: the launch does nothing, and says so once per name.
CUresult skip_unknown(KernelEnv& env) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> seen;
  std::lock_guard lock(mu);
  if (seen.insert(env.entry.name).second)
    log("no CPU version of kernel '%s': its launches do nothing (IVCUDA_DOUBLE_UNKNOWN_KERNELS=skip)",
        env.entry.name.c_str());
  return CUDA_SUCCESS;
}

}  // namespace

CpuKernel find_cpu_kernel(std::string_view name) {
  for (const auto& k : kKernels)
    if (k.name == name) return k.fn;
  return foreign_images_enabled() ? skip_unknown : nullptr;
}

}  // namespace ivcuda::gpu_double
