// nvmlInit/nvmlShutdown, the library's state, the transport to libcuda.so.1
// and the system-wide queries.
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

#include "guest/nvml/internal.h"

namespace ivcuda::nvml {
namespace {

struct State {
  std::mutex mu;                       // init/shutdown
  unsigned refs = 0;                   // nvmlInit calls not yet matched by nvmlShutdown
  std::atomic<bool> ready{false};      // refs > 0, read without the lock
  std::atomic<QueryFn> send{nullptr};  // libcuda.so.1's ivcuda_nvml_query_v1
  std::atomic<unsigned> count{0};      // granted GPUs, as the worker said at nvmlInit
};

State& state() noexcept {
  static State s;
  return s;
}

std::array<nvmlDevice_st, kMaxDevices> make_handles() noexcept {
  std::array<nvmlDevice_st, kMaxDevices> h{};
  for (unsigned i = 0; i < kMaxDevices; ++i) h[i].index = i;
  return h;
}
std::array<nvmlDevice_st, kMaxDevices> g_handles = make_handles();

// The transport's failures, as NVML says them.
nvmlReturn_t from_transport(int cu) noexcept {
  switch (cu) {
    case 0: return NVML_SUCCESS;
    case 2: return NVML_ERROR_MEMORY;          // CUDA_ERROR_OUT_OF_MEMORY
    case 801: return NVML_ERROR_NOT_SUPPORTED; // CUDA_ERROR_NOT_SUPPORTED (a daemon without the op)
    default: return NVML_ERROR_UNKNOWN;
  }
}

nvmlReturn_t init(unsigned flags) noexcept {
  return guard([&]() -> nvmlReturn_t {
    if ((flags & ~unsigned{NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH}) != 0) return NVML_ERROR_INVALID_ARGUMENT;
    State& s = state();
    std::lock_guard lk(s.mu);
    if (s.refs > 0) {
      ++s.refs;
      return NVML_SUCCESS;
    }
    if (s.send.load() == nullptr) {
      // The process's libcuda.so.1, whichever the loader finds: NVML works
      // only through ivcuda's. Never closed: the transport lives in it.
      void* cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
      if (cuda == nullptr) return NVML_ERROR_LIBRARY_NOT_FOUND;
      void* sym = ::dlsym(cuda, kQuerySymbol);
      if (sym == nullptr) {
        ::dlclose(cuda);
        return NVML_ERROR_DRIVER_NOT_LOADED;  // not ivcuda's libcuda.so.1
      }
      s.send.store(reinterpret_cast<QueryFn>(sym));
    }
    // The worker loads the host's NVML; then the count of granted GPUs.
    nvml_wire::ReqNvml req{};
    nvml_wire::RepNvml rep{};
    req.fn = static_cast<std::uint32_t>(NvmlFn::kInit);
    req.device = nvml_wire::kNoDevice;
    if (s.send.load()(&req, &rep, nullptr) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;  // no daemon
    if (rep.ret != NVML_SUCCESS) return static_cast<nvmlReturn_t>(rep.ret);
    req.fn = static_cast<std::uint32_t>(NvmlFn::kDeviceCount);
    rep = {};
    if (const int cu = s.send.load()(&req, &rep, nullptr); cu != 0) return from_transport(cu);
    if (rep.ret != NVML_SUCCESS) return static_cast<nvmlReturn_t>(rep.ret);
    s.count.store(static_cast<unsigned>(std::min<std::uint64_t>(rep.val[0], kMaxDevices)));
    s.refs = 1;
    s.ready.store(true, std::memory_order_release);
    return NVML_SUCCESS;
  });
}

}  // namespace

bool initialized() noexcept { return state().ready.load(std::memory_order_acquire); }
unsigned device_count() noexcept { return state().count.load(); }
nvmlDevice_t handle_of(unsigned i) noexcept { return &g_handles[i]; }

nvmlReturn_t check_device(nvmlDevice_t d, unsigned* index) noexcept {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  // Compared as integers: a forged pointer is no element of the array, and
  // relational comparison of unrelated pointers is unspecified.
  const auto p = reinterpret_cast<std::uintptr_t>(d);
  const auto base = reinterpret_cast<std::uintptr_t>(g_handles.data());
  if (p < base || p >= base + sizeof g_handles || (p - base) % sizeof(nvmlDevice_st) != 0)
    return NVML_ERROR_INVALID_ARGUMENT;
  const auto i = static_cast<unsigned>((p - base) / sizeof(nvmlDevice_st));
  if (i >= device_count()) return NVML_ERROR_INVALID_ARGUMENT;
  *index = i;
  return NVML_SUCCESS;
}

nvmlReturn_t query(NvmlFn fn, int device, std::uint64_t arg0, std::uint64_t arg1, void* out, std::uint32_t cap,
                   nvml_wire::RepNvml* rep, const char* who) noexcept {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  nvml_wire::ReqNvml req{};
  req.fn = static_cast<std::uint32_t>(fn);
  req.device = device;
  req.arg0 = arg0;
  req.arg1 = arg1;
  req.out_cap = out == nullptr ? 0 : cap;
  *rep = {};
  if (const int cu = state().send.load()(&req, rep, out); cu != 0) return note_answer(who, from_transport(cu));
  const auto r = static_cast<nvmlReturn_t>(rep->ret);
  return r == NVML_SUCCESS ? r : note_answer(who, r);
}

nvmlReturn_t query_string(NvmlFn fn, int device, char* buf, unsigned length, const char* who) noexcept {
  if (buf == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  char tmp[256];
  nvml_wire::RepNvml rep{};
  const nvmlReturn_t r = query(fn, device, 0, 0, tmp, sizeof tmp, &rep, who);
  if (r != NVML_SUCCESS) return r;
  // The host's string, ended where it ends or where the bytes do.
  const std::size_t n = ::strnlen(tmp, std::min<std::size_t>(rep.out_len, sizeof tmp - 1));
  if (n + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(buf, tmp, n);
  buf[n] = '\0';
  return NVML_SUCCESS;
}

int default_answer(int code, const char* name) noexcept {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  note_default(name);
  return note_answer(name, static_cast<nvmlReturn_t>(code));
}

}  // namespace ivcuda::nvml

using namespace ivcuda::nvml;

extern "C" {

nvmlReturn_t nvmlInit_v2(void) { return init(0); }
// The first generation differed only in how it treated GPUs the caller may
// not use; a guest sees none of those.
nvmlReturn_t nvmlInit(void) { return init(0); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return init(flags); }

nvmlReturn_t nvmlShutdown(void) {
  return guard([]() -> nvmlReturn_t {
    State& s = state();
    std::lock_guard lk(s.mu);
    if (s.refs == 0) return NVML_ERROR_UNINITIALIZED;
    if (--s.refs == 0) s.ready.store(false, std::memory_order_release);
    return NVML_SUCCESS;
  });
}

nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  return query_string(NvmlFn::kSystemDriverVersion, nvml_wire::kNoDevice, version, length);
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  return query_string(NvmlFn::kSystemNvmlVersion, nvml_wire::kNoDevice, version, length);
}

static nvmlReturn_t cuda_driver_version(int* v) noexcept {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (v == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  nvml_wire::RepNvml rep{};
  const nvmlReturn_t r = query(NvmlFn::kSystemCudaDriverVersion, nvml_wire::kNoDevice, 0, &rep);
  if (r == NVML_SUCCESS) *v = static_cast<int>(rep.val[0]);
  return r;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* cudaDriverVersion) { return cuda_driver_version(cudaDriverVersion); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* cudaDriverVersion) {
  return cuda_driver_version(cudaDriverVersion);
}

// S-class units (the Quadro Plex enclosures): a guest has none.
nvmlReturn_t nvmlUnitGetCount(unsigned int* unitCount) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (unitCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *unitCount = 0;
  return NVML_SUCCESS;
}

}  // extern "C"
