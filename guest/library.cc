// Context-independent loading (cuLibrary*, cuKernel*) and the launch,
// occupancy and limit queries the CUDA runtime and libraries make, on top of
// the forwarded module and launch calls (capture and graphs: graph_build.cc,
// graph_edit.cc, graph_exec.cc).
//
// A library is a guest object: its image (the caller's, when it promises to
// keep it, else a copy) and the module it became in each context. It is
// loaded into a context on first use there, as the real driver does; cudart
// 13 loads its fatbins, and takes the kernel of its first launch, before any
// context exists. A kernel taken while a context is current is the function
// handle of the library's module there, so launching it as a CUfunction (as
// cudart does) costs nothing extra; cuKernel* calls made in another context
// look it up there again by name, and so do launches and cuFunc* calls in any
// context but the first one a library was loaded in (cuBLAS uses one kernel
// handle in every device's context). A kernel taken with no context current is a guest
// object that launches and the cuFunc* calls resolve in the current context
// (kernel_function).
#include <cuda.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

namespace {

}  // namespace

CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The same switch as the real driver's; with either mode, ivcuda loads a
  // library when it is asked to.
  const char* env = std::getenv("CUDA_MODULE_LOADING");
  *mode = env != nullptr && std::strcmp(env, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
  return CUDA_SUCCESS;
}

namespace {

// A kernel taken while no context was current (cudart does so before its
// first launch creates the primary context): its handle is this object, and
// it becomes a function in each context where it is used.
struct Deferred {
  std::string name;
  std::map<std::uint64_t, CUfunction> functions;  // context -> function
};

// A library: its image, and the module it became in each context that used
// it. The handle the caller gets is its address, dereferenced only after the
// registry has found it.
struct Library {
  std::vector<std::byte> copy;  // the image, unless the caller preserves it
  const void* image = nullptr;  // what cuModuleLoadData is given: copy's bytes or the caller's
  std::mutex mu;                // guards modules, deferred (with their functions) and dead
  std::map<std::uint64_t, CUmodule> modules;  // context -> module
  std::map<std::string, std::unique_ptr<Deferred>> deferred;  // by name
  bool dead = false;  // unloaded while another thread still held it
};

// Where a kernel handle came from: cuKernel* calls resolve it again in
// another context, and answer its name and library.
struct KernelOrigin {
  const Library* lib;
  std::uint64_t ctx;  // 0 for a Deferred kernel
  std::string name;  // empty for kernels cuLibraryEnumerateKernels found (no name crosses)
};

struct Registry {
  std::mutex mu;  // guards both maps
  std::unordered_map<const void*, std::shared_ptr<Library>> libs;
  std::unordered_map<std::uint64_t, KernelOrigin> kernels;  // function handle -> origin
};

// Deferred kernels alive, and the context the first library was loaded in.
// A kernel taken in that context and launched there is its own function;
// anywhere else (another device's context, a second context) launches look
// it up, since a CUkernel is context-independent.
std::atomic<std::uint64_t> g_deferred{0};
std::atomic<std::uint64_t> g_first_context{0};

// Never destroyed: cudart unloads its libraries from an atexit handler,
// which may run after static destructors.
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

std::shared_ptr<Library> find_library(const void* handle) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  auto it = r.libs.find(handle);
  return it == r.libs.end() ? nullptr : it->second;
}

// The library's module in the current context, loaded there on first use.
CUresult module_here(Library& lib, CUmodule* mod) {
  const std::uint64_t ctx = ivcuda::guest::current_ctx();
  if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lk(lib.mu);
  if (lib.dead) return CUDA_ERROR_INVALID_HANDLE;
  if (auto it = lib.modules.find(ctx); it != lib.modules.end()) {
    *mod = it->second;
    return CUDA_SUCCESS;
  }
  CUmodule m = nullptr;
  const CUresult st = cuModuleLoadData(&m, lib.image);
  if (st != CUDA_SUCCESS) return st;
  std::uint64_t none = 0;
  g_first_context.compare_exchange_strong(none, ctx, std::memory_order_relaxed);
  lib.modules.emplace(ctx, m);
  *mod = m;
  return CUDA_SUCCESS;
}

// Runs fn(lib, module) with the library's module in the current context. The
// host drops a context's modules when the context goes (a primary context
// released and retained again, as cudaDeviceReset does, keeps its handle):
// a module it no longer knows is forgotten and the library loaded again, once.
template <class Fn>
CUresult with_module(const void* handle, Fn&& fn) {
  const std::shared_ptr<Library> lib = find_library(handle);
  if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  for (int attempt = 0;; ++attempt) {
    CUmodule m = nullptr;
    if (const CUresult st = module_here(*lib, &m); st != CUDA_SUCCESS) return st;
    const CUresult st = fn(*lib, m);
    if (st != CUDA_ERROR_INVALID_HANDLE || attempt == 1) return st;
    std::lock_guard lk(lib->mu);
    if (auto it = lib->modules.find(ivcuda::guest::current_ctx()); it != lib->modules.end() && it->second == m)
      lib->modules.erase(it);
  }
}

void remember_kernel(CUfunction f, const Library& lib, const char* name) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  auto [it, fresh] = r.kernels.try_emplace(h(f), KernelOrigin{&lib, ivcuda::guest::current_ctx(), {}});
  // A name once given stays: cuKernelGetName handed out pointers into it.
  if (it->second.name.empty() && name != nullptr) it->second.name = name;
}

std::optional<KernelOrigin> kernel_origin(CUkernel k) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  auto it = r.kernels.find(h(k));
  if (it == r.kernels.end()) return std::nullopt;
  return it->second;
}

// The function a kernel stands for in the current context. A kernel is the
// function handle of its library's module in the context current when it
// was taken; in another context it is looked up again by name. Kernels the
// guest did not hand out (plain CUfunctions, which the CUDA runtime passes
// too) are their own function.
CUresult function_here(CUkernel k, CUfunction* f) {
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *f = reinterpret_cast<CUfunction>(k);
  const std::optional<KernelOrigin> o = kernel_origin(k);
  const std::uint64_t ctx = ivcuda::guest::current_ctx();
  if (o && o->ctx == 0) {
    // A Deferred kernel: its library owns it, and holding the library keeps
    // it alive.
    const std::shared_ptr<Library> lib = find_library(o->lib);
    if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    auto* d = reinterpret_cast<Deferred*>(k);
    {
      std::lock_guard lk(lib->mu);
      if (lib->dead) return CUDA_ERROR_INVALID_HANDLE;
      if (auto it = d->functions.find(ctx); it != d->functions.end()) {
        *f = it->second;
        return CUDA_SUCCESS;
      }
    }
    CUfunction fn = nullptr;
    const CUresult st =
        with_module(o->lib, [&](Library&, CUmodule m) { return cuModuleGetFunction(&fn, m, o->name.c_str()); });
    if (st != CUDA_SUCCESS) return st;
    std::lock_guard lk(lib->mu);
    d->functions[ctx] = fn;
    *f = fn;
    return CUDA_SUCCESS;
  }
  if (!o || o->ctx == ctx || ctx == 0 || o->name.empty()) return CUDA_SUCCESS;
  return with_module(o->lib, [&](Library&, CUmodule m) { return cuModuleGetFunction(f, m, o->name.c_str()); });
}

// With no context current there is no module to look the name up in: the
// kernel is a Deferred one, and an unknown name fails where it is first used.
CUresult deferred_kernel(CUkernel* k, const void* handle, const char* name) {
  const std::shared_ptr<Library> lib = find_library(handle);
  if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const Deferred* d;
  {
    std::lock_guard lk(lib->mu);
    if (lib->dead) return CUDA_ERROR_INVALID_HANDLE;
    auto& slot = lib->deferred[name];
    if (slot == nullptr) {
      slot = std::make_unique<Deferred>();
      slot->name = name;
      g_deferred.fetch_add(1, std::memory_order_relaxed);
    }
    d = slot.get();
  }
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  r.kernels.try_emplace(h(d), KernelOrigin{lib.get(), 0, name});
  *k = reinterpret_cast<CUkernel>(const_cast<Deferred*>(d));
  return CUDA_SUCCESS;
}

// The CU_LIBRARY_BINARY_IS_PRESERVED option; the host universal function
// table only matters to host-side function pointers, which do not cross.
CUresult library_options(CUlibraryOption* opts, void** values, unsigned n, bool* preserved) {
  *preserved = false;
  if (n != 0 && opts == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i) {
    if (opts[i] == CU_LIBRARY_BINARY_IS_PRESERVED) {
      // cuBLAS names the option with no values array: the real driver takes
      // that, and keeping a copy is the safe reading.
      *preserved = values != nullptr && values[i] != nullptr;
    } else if (opts[i] != CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

// Registers a library. Where a context is current it is loaded there at
// once, so that a bad image fails here as on the real driver; otherwise
// (cudart loads its fatbins before any context exists) on first use.
CUresult add_library(CUlibrary* out, std::shared_ptr<Library> lib) {
  if (Runtime::current() == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ivcuda::guest::current_ctx() != 0) {
    CUmodule m = nullptr;
    if (const CUresult st = module_here(*lib, &m); st != CUDA_SUCCESS) return st;
  }
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  const void* handle = lib.get();
  r.libs.emplace(handle, std::move(lib));
  *out = static_cast<CUlibrary>(const_cast<void*>(handle));
  return CUDA_SUCCESS;
}

}  // namespace

CUfunction ivcuda::guest::kernel_function(CUfunction f) noexcept {
  // Relaxed loads suffice: a program holding a Deferred handle got it after
  // the count went up, and one holding a kernel got it after a library was
  // loaded (the first context set).
  if (g_deferred.load(std::memory_order_relaxed) == 0) {
    const std::uint64_t first = g_first_context.load(std::memory_order_relaxed);
    if (first == 0 || ivcuda::guest::current_ctx() == first) return f;  // no library, or its first context
  }
  CUfunction out = f;
  const CUresult st = guard([&] { return function_here(reinterpret_cast<CUkernel>(f), &out); });
  return st == CUDA_SUCCESS ? out : f;
}

CUresult cuLibraryLoadData(CUlibrary* lib, const void* code, CUjit_option*, void**, unsigned int,
                           CUlibraryOption* opts, void** values, unsigned int nopts) {
  // JIT options tune compilation; the host compiles with defaults, which is
  // what every option's absence means.
  return guard([&] {
    if (lib == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
    bool preserved = false;
    if (const CUresult st = library_options(opts, values, nopts, &preserved); st != CUDA_SUCCESS) return st;
    auto l = std::make_shared<Library>();
    if (preserved) {
      l->image = code;
    } else {
      const std::span<const std::byte> image = ivcuda::guest::module_image(code);
      if (image.empty()) return CUDA_ERROR_INVALID_IMAGE;
      l->copy.assign(image.begin(), image.end());
      l->image = l->copy.data();
    }
    return add_library(lib, std::move(l));
  });
}

CUresult cuLibraryLoadFromFile(CUlibrary* lib, const char* path, CUjit_option*, void**, unsigned int,
                               CUlibraryOption* opts, void** values, unsigned int nopts) {
  return guard([&] {
    if (lib == nullptr || path == nullptr) return CUDA_ERROR_INVALID_VALUE;
    bool preserved = false;
    if (const CUresult st = library_options(opts, values, nopts, &preserved); st != CUDA_SUCCESS) return st;
    if (preserved) return CUDA_ERROR_INVALID_VALUE;  // as documented: there is no caller's copy to keep
    std::ifstream f(path, std::ios::binary);
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    auto l = std::make_shared<Library>();
    for (std::istreambuf_iterator<char> it(f), end; it != end; ++it) l->copy.push_back(static_cast<std::byte>(*it));
    if (l->copy.empty()) return CUDA_ERROR_INVALID_IMAGE;
    l->copy.push_back(std::byte{0});  // PTX text must end in NUL
    l->image = l->copy.data();
    return add_library(lib, std::move(l));
  });
}

CUresult cuLibraryUnload(CUlibrary handle) {
  return guard([&] {
    std::shared_ptr<Library> lib;
    {
      Registry& r = registry();
      std::lock_guard lk(r.mu);
      auto it = r.libs.find(handle);
      if (it == r.libs.end()) return CUDA_ERROR_INVALID_HANDLE;
      lib = std::move(it->second);
      r.libs.erase(it);
      std::erase_if(r.kernels, [&](const auto& k) { return k.second.lib == lib.get(); });
    }
    std::lock_guard lk(lib->mu);
    lib->dead = true;
    g_deferred.fetch_sub(lib->deferred.size(), std::memory_order_relaxed);
    // Modules of contexts already destroyed are gone on the host (invalid
    // handle): nothing is left to unload there.
    CUresult result = CUDA_SUCCESS;
    for (const auto& [ctx, m] : lib->modules) {
      const CUresult st = cuModuleUnload(m);
      if (st != CUDA_SUCCESS && st != CUDA_ERROR_INVALID_HANDLE && result == CUDA_SUCCESS) result = st;
    }
    lib->modules.clear();
    return result;
  });
}

CUresult cuLibraryGetModule(CUmodule* mod, CUlibrary lib) {
  return guard([&] {
    if (mod == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_module(lib, [&](Library&, CUmodule m) {
      *mod = m;
      return CUDA_SUCCESS;
    });
  });
}

CUresult cuLibraryGetKernel(CUkernel* k, CUlibrary lib, const char* name) {
  return guard([&] {
    if (k == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (ivcuda::guest::current_ctx() == 0) return deferred_kernel(k, lib, name);
    return with_module(lib, [&](Library& l, CUmodule m) {
      CUfunction f = nullptr;
      const CUresult st = cuModuleGetFunction(&f, m, name);
      if (st != CUDA_SUCCESS) return st;
      remember_kernel(f, l, name);
      *k = reinterpret_cast<CUkernel>(f);
      return CUDA_SUCCESS;
    });
  });
}

CUresult cuLibraryGetKernelCount(unsigned int* count, CUlibrary lib) {
  return guard([&] {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_module(lib, [&](Library&, CUmodule m) { return cuModuleGetFunctionCount(count, m); });
  });
}

CUresult cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int n, CUlibrary lib) {
  return guard([&] {
    if (kernels == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_module(lib, [&](Library& l, CUmodule m) {
      std::vector<CUfunction> fns(n);
      const CUresult st = cuModuleEnumerateFunctions(fns.data(), n, m);
      if (st != CUDA_SUCCESS) return st;
      for (unsigned i = 0; i < n; ++i) {
        remember_kernel(fns[i], l, nullptr);
        kernels[i] = reinterpret_cast<CUkernel>(fns[i]);
      }
      return CUDA_SUCCESS;
    });
  });
}

CUresult cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary lib, const char* name) {
  return guard([&] {
    return with_module(lib, [&](Library&, CUmodule m) { return cuModuleGetGlobal(dptr, bytes, m, name); });
  });
}

CUresult cuKernelGetFunction(CUfunction* f, CUkernel k) {
  return guard([&] {
    if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return function_here(k, f);
  });
}

CUresult cuKernelGetLibrary(CUlibrary* lib, CUkernel k) {
  return guard([&] {
    if (lib == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::optional<KernelOrigin> o = kernel_origin(k);
    if (!o) return CUDA_ERROR_INVALID_HANDLE;
    *lib = reinterpret_cast<CUlibrary>(const_cast<Library*>(o->lib));
    return CUDA_SUCCESS;
  });
}

CUresult cuKernelGetName(const char** name, CUkernel k) {
  return guard([&] {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    {
      Registry& r = registry();
      std::lock_guard lk(r.mu);
      auto it = r.kernels.find(h(k));
      if (it == r.kernels.end()) return CUDA_ERROR_INVALID_HANDLE;
      if (!it->second.name.empty()) {
        *name = it->second.name.c_str();
        return CUDA_SUCCESS;
      }
    }
    // An enumerated kernel: its function's name, from the host.
    CUfunction f = nullptr;
    if (const CUresult st = function_here(k, &f); st != CUDA_SUCCESS) return st;
    return cuFuncGetName(name, f);
  });
}

CUresult cuKernelGetAttribute(int* v, CUfunction_attribute a, CUkernel k, CUdevice) {
  return guard([&] {
    CUfunction f = nullptr;
    const CUresult st = function_here(k, &f);
    return st != CUDA_SUCCESS ? st : cuFuncGetAttribute(v, a, f);
  });
}

CUresult cuKernelSetAttribute(CUfunction_attribute a, int v, CUkernel k, CUdevice) {
  return guard([&] {
    CUfunction f = nullptr;
    const CUresult st = function_here(k, &f);
    return st != CUDA_SUCCESS ? st : cuFuncSetAttribute(f, a, v);
  });
}

// Like the attributes: the kernel's function in the current context (the
// device argument names the context's device, as the driver's does).
CUresult cuKernelSetCacheConfig(CUkernel k, CUfunc_cache config, CUdevice) {
  return guard([&] {
    CUfunction f = nullptr;
    const CUresult st = function_here(k, &f);
    return st != CUDA_SUCCESS ? st : cuFuncSetCacheConfig(f, config);
  });
}

CUresult cuKernelGetParamInfo(CUkernel k, size_t index, size_t* offset, size_t* size) {
  return guard([&] {
    CUfunction f = nullptr;
    const CUresult st = function_here(k, &f);
    return st != CUDA_SUCCESS ? st : cuFuncGetParamInfo(f, index, offset, size);
  });
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  return guard([&] {
    if (c == nullptr || (c->numAttrs != 0 && c->attrs == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    if (c->numAttrs > ivcuda::proto::kMaxLaunchAttrs) return CUDA_ERROR_INVALID_VALUE;
    // Attributes travel as plain values; ones that name objects (events,
    // access-policy windows) are refused rather than silently dropped.
    bool cooperative = false, plain = true;
    ivcuda::proto::LaunchAttr wire[ivcuda::proto::kMaxLaunchAttrs] = {};
    for (unsigned i = 0; i < c->numAttrs; ++i) {
      const CUlaunchAttribute& a = c->attrs[i];
      ivcuda::proto::LaunchAttr& w = wire[i];
      w.id = static_cast<std::uint32_t>(a.id);
      switch (a.id) {
        case CU_LAUNCH_ATTRIBUTE_IGNORE: break;
        case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
          cooperative = a.value.cooperative != 0;
          w.value[0] = static_cast<std::uint32_t>(a.value.cooperative);
          break;
        case CU_LAUNCH_ATTRIBUTE_PRIORITY:
          w.value[0] = static_cast<std::uint32_t>(a.value.priority);
          plain = false;
          break;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
          w.value[0] = a.value.clusterDim.x;
          w.value[1] = a.value.clusterDim.y;
          w.value[2] = a.value.clusterDim.z;
          plain = false;
          break;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
          w.value[0] = static_cast<std::uint32_t>(a.value.clusterSchedulingPolicyPreference);
          plain = false;
          break;
        case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
          w.value[0] = static_cast<std::uint32_t>(a.value.programmaticStreamSerializationAllowed);
          plain = false;
          break;
        case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
          w.value[0] = static_cast<std::uint32_t>(a.value.memSyncDomain);
          plain = false;
          break;
        case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
          w.value[0] = a.value.memSyncDomainMap.default_;
          w.value[1] = a.value.memSyncDomainMap.remote;
          plain = false;
          break;
        default:
          return ivcuda::guest::not_supported("cuLaunchKernelEx: launch attribute %d is not forwarded",
                                  static_cast<int>(a.id));
      }
    }
    const unsigned grid[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
    const unsigned block[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    if (plain)
      return ivcuda::guest::launch_kernel(f, grid, block, c->sharedMemBytes, c->hStream, params, extra, cooperative);
    return ivcuda::guest::launch_kernel(f, grid, block, c->sharedMemBytes, c->hStream, params, extra, cooperative,
                                        std::span<const ivcuda::proto::LaunchAttr>(wire, c->numAttrs));
  });
}

// Stream capture and its queries: graph_exec.cc.

// Ids: the handles are unique for the life of the process on the host, so
// they serve as ids (CUDA only promises uniqueness).
CUresult cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t c = ctx != nullptr ? h(ctx) : ivcuda::guest::current_ctx();
  if (c == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *id = c;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetId(CUstream s, unsigned long long* id) {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *id = h(s);
  return CUDA_SUCCESS;
}

// ---- occupancy and limits: answered by the host's driver

namespace {
CUresult occupancy(const ivcuda::proto::ReqOccupancy& r, std::int64_t* out) {
  return guard([&] {
    Runtime* rt = Runtime::current();
    if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult st;
    ivcuda::proto::RepValue rep{};
    st = rt->call<ivcuda::proto::Op::kOccupancy>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *out = rep.value;
    return st;
  });
}
}  // namespace

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, CUfunction f, int block, size_t smem,
                                                              unsigned int flags) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ivcuda::proto::ReqOccupancy r{};
  r.ctx = ivcuda::guest::current_ctx();
  r.function = h(ivcuda::guest::kernel_function(f));
  r.dynamic_smem = smem;
  r.block_size = block;
  r.flags = flags;
  r.kind = ivcuda::proto::kOccMaxActiveBlocks;
  std::int64_t v = 0;
  const CUresult st = occupancy(r, &v);
  if (st == CUDA_SUCCESS) *n = static_cast<int>(v);
  return st;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f, int block, size_t smem) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, block, smem, 0);
}

CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t* bytes, CUfunction f, int blocks, int block) {
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ivcuda::proto::ReqOccupancy r{};
  r.ctx = ivcuda::guest::current_ctx();
  r.function = h(ivcuda::guest::kernel_function(f));
  r.block_size = block;
  r.num_blocks = blocks;
  r.kind = ivcuda::proto::kOccAvailableDynamicSmem;
  std::int64_t v = 0;
  const CUresult st = occupancy(r, &v);
  if (st == CUDA_SUCCESS) *bytes = static_cast<size_t>(v);
  return st;
}

CUresult cuCtxGetLimit(size_t* value, CUlimit limit) {
  return guard([&] {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Runtime* rt = Runtime::current();
    if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult st;
    const std::uint64_t ctx = ivcuda::guest::current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    ivcuda::proto::RepValue rep{};
    st = rt->call<ivcuda::proto::Op::kCtxGetLimit>(ivcuda::proto::ReqLimit{ctx, 0, static_cast<std::int32_t>(limit), 0},
                                                  {}, &rep);
    if (st == CUDA_SUCCESS) *value = static_cast<size_t>(rep.value);
    return st;
  });
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  return guard([&] {
    Runtime* rt = Runtime::current();
    if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const std::uint64_t ctx = ivcuda::guest::current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    return rt->call<ivcuda::proto::Op::kCtxSetLimit>(
        ivcuda::proto::ReqLimit{ctx, value, static_cast<std::int32_t>(limit), 0});
  });
}
