#include "kernels.h"

#include <algorithm>
#include <chrono>
#include <thread>

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
  std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(ns, kMaxSpinNs)));
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

struct Registered {
  std::string_view name;
  CpuKernel fn;
};

constexpr Registered kKernels[] = {
    {"ivc_vec_add", vec_add},       {"ivc_fill_u32", fill_u32},
    {"ivc_reduce_sum", reduce_sum}, {"ivc_scale_struct", scale_struct},
    {"ivc_add_const", add_const},   {"ivc_spin_ns", spin_ns},
    {"ivc_fault", fault},
};

}  // namespace

CpuKernel find_cpu_kernel(std::string_view name) {
  for (const auto& k : kKernels)
    if (k.name == name) return k.fn;
  return nullptr;
}

}  // namespace ivcuda::gpu_double
