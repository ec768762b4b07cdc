// Modules, functions and launches of the GPU test double. Kernels run as CPU versions
// looked up by entry name (kernels.cc), fed with parameters packed as the PTX lays them out.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels.h"
#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

struct JitOutputs {
  char* error_log = nullptr;
  std::size_t error_log_size = 0;
  char* info_log = nullptr;
  std::size_t info_log_size = 0;
};

// JIT options only matter to a compiler; the output options are honoured so that callers
// reading logs or timings see empty, well-formed results.
CUresult scan_jit_options(unsigned n, CUjit_option* options, void** values, JitOutputs* out) {
  if (n == 0) return CUDA_SUCCESS;
  if (options == nullptr || values == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i) {
    if (options[i] < 0 || options[i] >= CU_JIT_NUM_OPTIONS) return CUDA_ERROR_INVALID_VALUE;
    const auto as_size = [&] {
      return static_cast<std::size_t>(
          static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(values[i])));
    };
    switch (options[i]) {
      case CU_JIT_ERROR_LOG_BUFFER: out->error_log = static_cast<char*>(values[i]); break;
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: out->error_log_size = as_size(); break;
      case CU_JIT_INFO_LOG_BUFFER: out->info_log = static_cast<char*>(values[i]); break;
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: out->info_log_size = as_size(); break;
      default: break;
    }
  }
  return CUDA_SUCCESS;
}

void write_jit_outputs(unsigned n, CUjit_option* options, void** values, const JitOutputs& jo,
                       const std::string& error) {
  std::size_t error_used = 0;
  if (jo.error_log != nullptr && jo.error_log_size > 0) {
    std::snprintf(jo.error_log, jo.error_log_size, "%s", error.c_str());
    error_used = std::min(error.size() + (error.empty() ? 0 : 1), jo.error_log_size);
  }
  if (jo.info_log != nullptr && jo.info_log_size > 0) jo.info_log[0] = '\0';
  for (unsigned i = 0; i < n; ++i) {
    switch (options[i]) {
      case CU_JIT_WALL_TIME: {
        // A float travels in the pointer-sized slot itself.
        const float zero = 0.0f;
        values[i] = nullptr;
        std::memcpy(&values[i], &zero, sizeof zero);
        break;
      }
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        values[i] = reinterpret_cast<void*>(static_cast<std::uintptr_t>(error_used));
        break;
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        values[i] = nullptr;  // nothing logged
        break;
      default: break;
    }
  }
}

void free_module(State& s, Module& m) {
  for (const auto& [name, fn] : m.functions) s.functions.erase(fn);
  for (const auto& [name, base] : m.globals) {
    const auto it = s.allocations.find(base);
    if (it != s.allocations.end()) s.release(it);
  }
}

// Makes a module of `image` in ctx: globals in tracked memory (so that kernels, cuMemcpy*
// and cuMemGetAddressRange treat them like any allocation) and one function per entry.
CUresult instantiate(State& s, Handle ctx, PtxImage image, Handle* out) {
  Module m;
  m.ctx = ctx;
  m.image = std::move(image);
  for (const PtxGlobal& g : m.image.globals) {
    const std::size_t align = std::max<std::size_t>(g.align, alignof(std::max_align_t));
    const std::size_t bytes = std::max<std::size_t>((g.size + align - 1) / align * align, align);
    void* p = std::aligned_alloc(align, bytes);
    if (p == nullptr) {
      free_module(s, m);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    std::memset(p, 0, bytes);
    if (!g.init.empty()) std::memcpy(p, g.init.data(), std::min(g.init.size(), g.size));
    Allocation a;
    a.base = reinterpret_cast<std::uintptr_t>(p);
    a.size = std::max<std::size_t>(g.size, 1);
    a.kind = MemKind::kModuleGlobal;
    a.ctx = ctx;
    a.device = s.contexts.at(ctx).device;
    a.storage = p;
    s.allocations.emplace(a.base, a);
    m.globals.emplace(g.name, a.base);
  }
  const Handle mh = s.new_handle();
  for (std::size_t i = 0; i < m.image.entries.size(); ++i) {
    const Handle fh = s.new_handle();
    Function f;
    f.module = mh;
    f.entry = i;
    const std::size_t static_shared =
        std::min<std::size_t>(m.image.entries[i].static_shared, kDefaultSharedPerBlock);
    f.settable[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES] =
        kDefaultSharedPerBlock - static_cast<int>(static_shared);
    f.settable[CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT] = -1;
    s.functions.emplace(fh, f);
    m.functions.emplace(m.image.entries[i].name, fh);
  }
  s.modules.emplace(mh, std::move(m));
  *out = mh;
  return CUDA_SUCCESS;
}

CUresult load(CUmodule* out, const void* image, unsigned n, CUjit_option* options, void** values) {
  return guarded([&](State& s) -> CUresult {
    if (out == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    JitOutputs jo;
    if (const CUresult r = scan_jit_options(n, options, values, &jo); r != CUDA_SUCCESS) return r;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    PtxImage parsed;
    std::string why;
    if (const CUresult r = load_image(image, parsed, why); r != CUDA_SUCCESS) {
      log("module load failed: %s", why.c_str());
      write_jit_outputs(n, options, values, jo, "ivcuda GPU test double: " + why);
      return r;
    }
    Handle mh = 0;
    if (const CUresult r = instantiate(s, ctx, std::move(parsed), &mh); r != CUDA_SUCCESS) return r;
    write_jit_outputs(n, options, values, jo, "");
    *out = to_handle<CUmod_st>(mh);
    return CUDA_SUCCESS;
  });
}

// The library's module in the current context, made on first use there.
CUresult library_module(State& s, Handle lib, Handle* out) {
  Handle ctx = 0;
  if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
  Library& l = s.libraries.at(lib);
  // A destroyed context took its module along; the map entry is then stale.
  if (const auto it = l.modules.find(ctx);
      it != l.modules.end() && s.modules.contains(it->second)) {
    *out = it->second;
    return CUDA_SUCCESS;
  }
  if (const CUresult r = instantiate(s, ctx, l.image, out); r != CUDA_SUCCESS) return r;
  s.modules.at(*out).library = lib;
  l.modules[ctx] = *out;
  return CUDA_SUCCESS;
}

struct FunctionRef {
  Function* fn = nullptr;
  Module* module = nullptr;
  const PtxEntry* entry = nullptr;
};

// Accepts a CUkernel where a CUfunction is expected, as the driver does: it stands for its
// library's function in the current context.
CUresult lookup_function(State& s, CUfunction f, FunctionRef* out) {
  Handle h = from_handle(f);
  if (const auto k = s.kernels.find(h); k != s.kernels.end()) {
    Handle mod = 0;
    if (const CUresult r = library_module(s, k->second.library, &mod); r != CUDA_SUCCESS) return r;
    const Library& lib = s.libraries.at(k->second.library);
    h = s.modules.at(mod).functions.at(lib.image.entries[k->second.entry].name);
  }
  const auto it = s.functions.find(h);
  if (f == nullptr || it == s.functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  out->fn = &it->second;
  out->module = &s.modules.at(it->second.module);
  out->entry = &out->module->image.entries[it->second.entry];
  return CUDA_SUCCESS;
}

int function_attribute(const FunctionRef& r, CUfunction_attribute a) {
  switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return kMaxThreadsPerBlock;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: return static_cast<int>(r.entry->static_shared);
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: return 0;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: return 0;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: return 32;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: return r.module->image.target_sm;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: return 90;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: return 0;
    default: return r.fn->settable[a];
  }
}

// Packs kernelParams (or the `extra` buffer) as the PTX lays the parameters out.
CUresult pack_params(const PtxEntry& e, void** kernelParams, void** extra,
                     std::vector<unsigned char>* buf) {
  buf->assign(e.param_bytes, 0);
  if (kernelParams != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (kernelParams != nullptr) {
    for (std::size_t i = 0; i < e.params.size(); ++i) {
      if (kernelParams[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      std::memcpy(buf->data() + e.params[i].offset, kernelParams[i], e.params[i].size);
    }
    return CUDA_SUCCESS;
  }
  if (extra == nullptr) return e.params.empty() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  const void* data = nullptr;
  const std::size_t* size = nullptr;
  for (std::size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
      data = extra[i + 1];
    else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
      size = static_cast<const std::size_t*>(extra[i + 1]);
    else
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (data == nullptr || size == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The real driver refuses a longer buffer this way, and takes a shorter one (reading
  // past it); the double zero-fills instead of reading past.
  if (*size > e.param_bytes) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  std::memcpy(buf->data(), data, *size);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult ivcuda::gpu_double::pack_kernel_args(State& s, CUfunction f, void** params, void** extra,
                                              std::vector<unsigned char>* out) {
  FunctionRef fr;
  if (const CUresult r = lookup_function(s, f, &fr); r != CUDA_SUCCESS) return r;
  return pack_params(*fr.entry, params, extra, out);
}

CUresult ivcuda::gpu_double::kernel_arg_offsets(State& s, CUfunction f, std::vector<std::size_t>* out) {
  FunctionRef fr;
  if (const CUresult r = lookup_function(s, f, &fr); r != CUDA_SUCCESS) return r;
  out->clear();
  for (const PtxParam& p : fr.entry->params) out->push_back(p.offset);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  return load(module, image, 0, nullptr, nullptr);
}

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                    CUjit_option* options, void** optionValues) {
  return load(module, image, numOptions, options, optionValues);
}

CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return load(module, fatCubin, 0, nullptr, nullptr);
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.modules.find(from_handle(hmod));
    if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    free_module(s, it->second);
    s.modules.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = CU_MODULE_EAGER_LOADING;  // images are parsed completely at load
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  return guarded([&](State& s) -> CUresult {
    if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.modules.find(from_handle(hmod));
    if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    const auto fn = it->second.functions.find(std::string_view(name));
    if (fn == it->second.functions.end()) return CUDA_ERROR_NOT_FOUND;
    *hfunc = to_handle<CUfunc_st>(fn->second);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod,
                                      const char* name) {
  return guarded([&](State& s) -> CUresult {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.modules.find(from_handle(hmod));
    if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    const auto g = it->second.globals.find(std::string_view(name));
    if (g == it->second.globals.end()) return CUDA_ERROR_NOT_FOUND;
    if (dptr != nullptr) *dptr = g->second;
    if (bytes != nullptr) *bytes = s.allocations.at(g->second).size;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset,
                                    size_t* paramSize) {
  return guarded([&](State& s) -> CUresult {
    FunctionRef r;
    if (const CUresult e = lookup_function(s, func, &r); e != CUDA_SUCCESS) return e;
    if (paramIndex >= r.entry->params.size()) return CUDA_ERROR_INVALID_VALUE;
    if (paramOffset != nullptr) *paramOffset = r.entry->params[paramIndex].offset;
    if (paramSize != nullptr) *paramSize = r.entry->params[paramIndex].size;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
  return guarded([&](State& s) -> CUresult {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, hfunc, &r); e != CUDA_SUCCESS) return e;
    *name = r.entry->name.c_str();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuFuncGetModule(CUmodule* hmod, CUfunction hfunc) {
  return guarded([&](State& s) -> CUresult {
    if (hmod == nullptr) return CUDA_ERROR_INVALID_VALUE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, hfunc, &r); e != CUDA_SUCCESS) return e;
    *hmod = to_handle<CUmod_st>(r.fn->module);
    return CUDA_SUCCESS;
  });
}

// The double loads every function with its module: each is always loaded.
CUresult CUDAAPI cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction hfunc) {
  return guarded([&](State& s) -> CUresult {
    if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, hfunc, &r); e != CUDA_SUCCESS) return e;
    *state = CU_FUNCTION_LOADING_STATE_LOADED;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuFuncLoad(CUfunction hfunc) {
  return guarded([&](State& s) -> CUresult {
    FunctionRef r;
    return lookup_function(s, hfunc, &r);
  });
}

CUresult CUDAAPI cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  return guarded([&](State& s) -> CUresult {
    if (pi == nullptr || attrib < 0 || attrib >= CU_FUNC_ATTRIBUTE_MAX)
      return CUDA_ERROR_INVALID_VALUE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, hfunc, &r); e != CUDA_SUCCESS) return e;
    *pi = function_attribute(r, attrib);
    return CUDA_SUCCESS;
  });
}

namespace {
int max_active_blocks(const PtxEntry& e, int block_size, std::size_t dynamic_smem);
}  // namespace

// Occupancy from a simple SM model (2048 threads, 32 blocks and the opt-in
// shared memory per SM): plausible, monotonic answers for tests.
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, CUfunction func,
                                                                      int blockSize, size_t dynamicSMemSize,
                                                                      unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    if (numBlocks == nullptr || blockSize <= 0 || blockSize > kMaxThreadsPerBlock || flags > 1)
      return CUDA_ERROR_INVALID_VALUE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, func, &r); e != CUDA_SUCCESS) return e;
    *numBlocks = max_active_blocks(*r.entry, blockSize, dynamicSMemSize);
    return CUDA_SUCCESS;
  });
}

namespace {
int max_active_blocks(const PtxEntry& e, int block_size, std::size_t dynamic_smem) {
  const std::size_t smem = e.static_shared + dynamic_smem;
  if (block_size <= 0 || smem > static_cast<std::size_t>(kMaxSharedPerBlockOptin)) return 0;
  int blocks = std::min(32, 2048 / block_size);
  if (smem != 0) blocks = std::min<int>(blocks, static_cast<int>(kMaxSharedPerBlockOptin / smem));
  return blocks;
}
}  // namespace

// The search the driver documents: the block size (a multiple of the warp size, or the
// limit) with the most resident threads per SM, the largest on ties.
CUresult CUDAAPI cuOccupancyMaxPotentialBlockSizeWithFlags(int* minGridSize, int* blockSize, CUfunction func,
                                                           CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                           size_t dynamicSMemSize, int blockSizeLimit,
                                                           unsigned int flags) {
  const PtxEntry* entry = nullptr;
  const CUresult r0 = guarded([&](State& s) -> CUresult {
    if (minGridSize == nullptr || blockSize == nullptr || blockSizeLimit < 0 || flags > 1)
      return CUDA_ERROR_INVALID_VALUE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, func, &r); e != CUDA_SUCCESS) return e;
    entry = r.entry;
    return CUDA_SUCCESS;
  });
  if (r0 != CUDA_SUCCESS) return r0;
  // The callback is the caller's code: it runs outside the state lock.
  const int cap = blockSizeLimit > 0 ? std::min(blockSizeLimit, kMaxThreadsPerBlock) : kMaxThreadsPerBlock;
  int best = 0, best_blocks = 0, best_threads = 0;
  for (int aligned = (cap + 31) / 32 * 32; aligned > 0; aligned -= 32) {
    const int b = std::min(cap, aligned);
    const std::size_t smem = blockSizeToDynamicSMemSize != nullptr ? blockSizeToDynamicSMemSize(b) : dynamicSMemSize;
    int blocks = 0;
    {
      std::lock_guard lock(state().mu);
      blocks = max_active_blocks(*entry, b, smem);
    }
    if (blocks * b > best_threads) {
      best_threads = blocks * b;
      best = b;
      best_blocks = blocks;
    }
    if (best_threads == 2048) break;
  }
  *minGridSize = best_blocks * 132;
  *blockSize = best;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(int* minGridSize, int* blockSize, CUfunction func,
                                                  CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                  size_t dynamicSMemSize, int blockSizeLimit) {
  return cuOccupancyMaxPotentialBlockSizeWithFlags(minGridSize, blockSize, func, blockSizeToDynamicSMemSize,
                                                   dynamicSMemSize, blockSizeLimit, 0);
}

// Clusters of up to 8 blocks; as many as fit when every block of a cluster must be resident.
CUresult CUDAAPI cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func, const CUlaunchConfig* config) {
  return guarded([&](State& s) -> CUresult {
    if (numClusters == nullptr || config == nullptr || (config->numAttrs != 0 && config->attrs == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, func, &r); e != CUDA_SUCCESS) return e;
    if (const CUresult e = check_stream(s, config->hStream); e != CUDA_SUCCESS) return e;
    std::uint64_t cluster = 1;
    for (unsigned i = 0; i < config->numAttrs; ++i)
      if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
        const auto& d = config->attrs[i].value.clusterDim;
        cluster = std::uint64_t{d.x} * d.y * d.z;
      }
    const std::uint64_t threads = std::uint64_t{config->blockDimX} * config->blockDimY * config->blockDimZ;
    // Past 8 blocks only with the non-portable attribute, and never past 16 (an H100/H200's
    // limit); cuBLAS probes upwards until this error.
    const bool non_portable = r.fn->settable[CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED] != 0;
    if (cluster > (non_portable ? 16u : 8u)) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    if (cluster == 0 || threads == 0 || threads > kMaxThreadsPerBlock) return CUDA_ERROR_INVALID_VALUE;
    const int per_sm = max_active_blocks(*r.entry, static_cast<int>(threads), config->sharedMemBytes);
    *numClusters = static_cast<int>(std::uint64_t{132} * static_cast<std::uint64_t>(per_sm) / cluster);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, CUfunction func, int blockSize,
                                                             size_t dynamicSMemSize) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize, 0);
}

CUresult CUDAAPI cuOccupancyAvailableDynamicSMemPerBlock(size_t* dynamicSmemSize, CUfunction func, int numBlocks,
                                                         int blockSize) {
  return guarded([&](State& s) -> CUresult {
    if (dynamicSmemSize == nullptr || numBlocks <= 0 || blockSize <= 0 || blockSize > kMaxThreadsPerBlock)
      return CUDA_ERROR_INVALID_VALUE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, func, &r); e != CUDA_SUCCESS) return e;
    const std::size_t per_block = static_cast<std::size_t>(kMaxSharedPerBlockOptin) / static_cast<std::size_t>(numBlocks);
    *dynamicSmemSize = per_block > r.entry->static_shared ? per_block - r.entry->static_shared : 0;
    return CUDA_SUCCESS;
  });
}

// A preference the double has no cache to apply: checked, then accepted.
CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  return guarded([&](State& s) -> CUresult {
    FunctionRef r;
    if (const CUresult e = lookup_function(s, hfunc, &r); e != CUDA_SUCCESS) return e;
    if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  return guarded([&](State& s) -> CUresult {
    FunctionRef r;
    if (const CUresult e = lookup_function(s, hfunc, &r); e != CUDA_SUCCESS) return e;
    const int static_shared = static_cast<int>(r.entry->static_shared);
    switch (attrib) {
      case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if (value < 0 || value > kMaxSharedPerBlockOptin - static_shared)
          return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        if (value < -1 || value > 100) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
      case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
      case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
        if (value < 0 || value > 8) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        if (value != 0 && value != 1) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        if (value < 0 || value > CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING)
          return CUDA_ERROR_INVALID_VALUE;
        break;
      default: return CUDA_ERROR_INVALID_VALUE;  // read-only
    }
    r.fn->settable[attrib] = value;
    return CUDA_SUCCESS;
  });
}

namespace {

CUresult launch(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra,
                bool cooperative) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    FunctionRef fr;
    if (const CUresult r = lookup_function(s, f, &fr); r != CUDA_SUCCESS) return r;
    if (fr.module->ctx != ctx) return CUDA_ERROR_INVALID_HANDLE;
    if (const CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
    // Unlike copies, launches refuse a stream of another context (so does the real driver).
    if (const auto st = s.streams.find(from_handle(hStream));
        st != s.streams.end() && st->second.ctx != ctx)
      return CUDA_ERROR_INVALID_HANDLE;
    if (gridDimX == 0 || gridDimY == 0 || gridDimZ == 0 || gridDimX > 2147483647u ||
        gridDimY > 65535 || gridDimZ > 65535 || blockDimX == 0 || blockDimY == 0 ||
        blockDimZ == 0 || blockDimX > 1024 || blockDimY > 1024 || blockDimZ > 64 ||
        std::uint64_t{blockDimX} * blockDimY * blockDimZ > kMaxThreadsPerBlock)
      return CUDA_ERROR_INVALID_VALUE;
    const int dyn_limit = fr.fn->settable[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES];
    if (sharedMemBytes > static_cast<unsigned>(dyn_limit)) return CUDA_ERROR_INVALID_VALUE;
    std::vector<unsigned char> params;
    if (const CUresult r = pack_params(*fr.entry, kernelParams, extra, &params); r != CUDA_SUCCESS)
      return r;
    if (cooperative) {
      // Every block must be resident at once.
      const auto threads = static_cast<int>(blockDimX * blockDimY * blockDimZ);
      const std::uint64_t fit = std::uint64_t{132} *
                                static_cast<std::uint64_t>(max_active_blocks(*fr.entry, threads, sharedMemBytes));
      if (std::uint64_t{gridDimX} * gridDimY * gridDimZ > fit) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    if (!s.captures.empty()) {
      // The arguments are packed now: the caller's kernelParams are gone by replay time.
      auto packed = std::make_shared<const std::vector<unsigned char>>(params);
      auto node = [=]() -> CUresult {
        std::size_t n = packed->size();
        void* ex[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<unsigned char*>(packed->data()),
                      CU_LAUNCH_PARAM_BUFFER_SIZE, &n, CU_LAUNCH_PARAM_END};
        return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                      nullptr, n == 0 ? nullptr : ex, cooperative);
      };
      if (CUresult r = CUDA_SUCCESS; record_if_capturing(s, hStream, node, &r)) return r;
    }
    const CpuKernel kernel = find_cpu_kernel(fr.entry->name);
    if (kernel == nullptr) {
      log("no CPU implementation of kernel '%s'; add one to tests/gpu_double/kernels.cc",
          fr.entry->name.c_str());
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    const Module& mod = *fr.module;
    if (fr.entry->calls_malloc) s.heap_used = true;
    KernelEnv env{
        .entry = *fr.entry,
        .params = params.data(),
        .grid = {gridDimX, gridDimY, gridDimZ},
        .block = {blockDimX, blockDimY, blockDimZ},
        .reachable = [&](std::uintptr_t p, std::size_t n) { return s.find(p, n) != nullptr; },
        .global = [&](std::string_view name, std::size_t size) -> unsigned char* {
          const auto g = mod.globals.find(name);
          if (g == mod.globals.end() || s.allocations.at(g->second).size != size) return nullptr;
          return reinterpret_cast<unsigned char*>(g->second);
        },
    };
    const CUresult r = kernel(env);
    if (r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_MISALIGNED_ADDRESS) {
      // Launches are asynchronous: the fault surfaces from the next call on this device.
      log("kernel '%s' faulted: %s", fr.entry->name.c_str(),
          r == CUDA_ERROR_ILLEGAL_ADDRESS ? "memory outside every allocation"
                                          : "misaligned access");
      s.fault[static_cast<std::size_t>(s.contexts.at(ctx).device)] = r;
      return CUDA_SUCCESS;
    }
    if (r == CUDA_SUCCESS && kernel_time().count() > 0)
      s.busy_until[busy_key(ctx, hStream)] = std::chrono::steady_clock::now() + kernel_time();
    return r;
  });
}

}  // namespace

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void** kernelParams,
                                void** extra) {
  return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                kernelParams, extra, false);
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                           unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                           void** kernelParams) {
  return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                kernelParams, nullptr, true);
}

// ---- libraries (what cudart 12+/13 loads its fatbins through) ----------------------------

CUresult CUDAAPI cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jitOptions,
                                   void** jitOptionsValues, unsigned int numJitOptions,
                                   CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                   unsigned int numLibraryOptions) {
  return guarded([&](State& s) -> CUresult {
    if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
    JitOutputs jo;
    if (const CUresult r = scan_jit_options(numJitOptions, jitOptions, jitOptionsValues, &jo);
        r != CUDA_SUCCESS)
      return r;
    // Library options (CU_LIBRARY_BINARY_IS_PRESERVED, ...) change nothing here: the image
    // is parsed and copied at once.
    if (numLibraryOptions != 0 && (libraryOptions == nullptr || libraryOptionValues == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numLibraryOptions; ++i)
      if (libraryOptions[i] < 0 || libraryOptions[i] >= CU_LIBRARY_NUM_OPTIONS)
        return CUDA_ERROR_INVALID_VALUE;
    Library lib;
    std::string why;
    if (const CUresult r = load_image(code, lib.image, why); r != CUDA_SUCCESS) {
      log("library load failed: %s", why.c_str());
      write_jit_outputs(numJitOptions, jitOptions, jitOptionsValues, jo,
                        "ivcuda GPU test double: " + why);
      return r;
    }
    const Handle lh = s.new_handle();
    for (std::size_t i = 0; i < lib.image.entries.size(); ++i) {
      const Handle kh = s.new_handle();
      s.kernels.emplace(kh, Kernel{.library = lh, .entry = i});
      lib.kernels.emplace(lib.image.entries[i].name, kh);
    }
    write_jit_outputs(numJitOptions, jitOptions, jitOptionsValues, jo, "");
    s.libraries.emplace(lh, std::move(lib));
    *library = to_handle<CUlib_st>(lh);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary library) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.libraries.find(from_handle(library));
    if (it == s.libraries.end()) return CUDA_ERROR_INVALID_HANDLE;
    for (const auto& [ctx, mod] : it->second.modules) {
      if (const auto m = s.modules.find(mod); m != s.modules.end()) {
        free_module(s, m->second);
        s.modules.erase(m);
      }
    }
    for (const auto& [name, k] : it->second.kernels) s.kernels.erase(k);
    s.libraries.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library, const char* name) {
  return guarded([&](State& s) -> CUresult {
    if (pKernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.libraries.find(from_handle(library));
    if (it == s.libraries.end()) return CUDA_ERROR_INVALID_HANDLE;
    const auto k = it->second.kernels.find(std::string_view(name));
    if (k == it->second.kernels.end()) return CUDA_ERROR_NOT_FOUND;
    *pKernel = to_handle<CUkern_st>(k->second);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLibraryGetKernelCount(unsigned int* count, CUlibrary lib) {
  return guarded([&](State& s) -> CUresult {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.libraries.find(from_handle(lib));
    if (it == s.libraries.end()) return CUDA_ERROR_INVALID_HANDLE;
    *count = static_cast<unsigned>(it->second.kernels.size());
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int numKernels,
                                           CUlibrary lib) {
  return guarded([&](State& s) -> CUresult {
    if (kernels == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.libraries.find(from_handle(lib));
    if (it == s.libraries.end()) return CUDA_ERROR_INVALID_HANDLE;
    const auto& entries = it->second.image.entries;
    if (numKernels > entries.size()) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numKernels; ++i)
      kernels[i] = to_handle<CUkern_st>(it->second.kernels.at(entries[i].name));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLibraryGetModule(CUmodule* pMod, CUlibrary library) {
  return guarded([&](State& s) -> CUresult {
    if (pMod == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!s.libraries.contains(from_handle(library))) return CUDA_ERROR_INVALID_HANDLE;
    Handle mod = 0;
    if (const CUresult r = library_module(s, from_handle(library), &mod); r != CUDA_SUCCESS)
      return r;
    *pMod = to_handle<CUmod_st>(mod);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                    const char* name) {
  return guarded([&](State& s) -> CUresult {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!s.libraries.contains(from_handle(library))) return CUDA_ERROR_INVALID_HANDLE;
    Handle mod = 0;
    if (const CUresult r = library_module(s, from_handle(library), &mod); r != CUDA_SUCCESS)
      return r;
    const Module& m = s.modules.at(mod);
    const auto g = m.globals.find(std::string_view(name));
    if (g == m.globals.end()) return CUDA_ERROR_NOT_FOUND;
    if (dptr != nullptr) *dptr = g->second;
    if (bytes != nullptr) *bytes = s.allocations.at(g->second).size;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  return guarded([&](State& s) -> CUresult {
    if (pFunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!s.kernels.contains(from_handle(kernel))) return CUDA_ERROR_INVALID_HANDLE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, reinterpret_cast<CUfunction>(kernel), &r);
        e != CUDA_SUCCESS)
      return e;
    *pFunc = to_handle<CUfunc_st>(r.module->functions.at(r.entry->name));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuKernelGetLibrary(CUlibrary* pLib, CUkernel kernel) {
  return guarded([&](State& s) -> CUresult {
    if (pLib == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto k = s.kernels.find(from_handle(kernel));
    if (k == s.kernels.end()) return CUDA_ERROR_INVALID_HANDLE;
    *pLib = to_handle<CUlib_st>(k->second.library);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel hfunc) {
  return guarded([&](State& s) -> CUresult {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto k = s.kernels.find(from_handle(hfunc));
    if (k == s.kernels.end()) return CUDA_ERROR_INVALID_HANDLE;
    *name = s.libraries.at(k->second.library).image.entries[k->second.entry].name.c_str();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t* paramOffset,
                                      size_t* paramSize) {
  return guarded([&](State& s) -> CUresult {
    const auto k = s.kernels.find(from_handle(kernel));
    if (k == s.kernels.end()) return CUDA_ERROR_INVALID_HANDLE;
    const PtxEntry& e = s.libraries.at(k->second.library).image.entries[k->second.entry];
    if (paramIndex >= e.params.size()) return CUDA_ERROR_INVALID_VALUE;
    if (paramOffset != nullptr) *paramOffset = e.params[paramIndex].offset;
    if (paramSize != nullptr) *paramSize = e.params[paramIndex].size;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuKernelGetAttribute(int* pi, CUfunction_attribute attrib, CUkernel kernel,
                                      CUdevice dev) {
  {
    const CUresult r = guarded([&](State& s) -> CUresult {
      if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
      return s.kernels.contains(from_handle(kernel)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    });
    if (r != CUDA_SUCCESS) return r;
  }
  return cuFuncGetAttribute(pi, attrib, reinterpret_cast<CUfunction>(kernel));
}

CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel,
                                      CUdevice dev) {
  {
    const CUresult r = guarded([&](State& s) -> CUresult {
      if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
      return s.kernels.contains(from_handle(kernel)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    });
    if (r != CUDA_SUCCESS) return r;
  }
  return cuFuncSetAttribute(reinterpret_cast<CUfunction>(kernel), attrib, val);
}

// ---- module enumeration ----------------------------------------------------------------------

CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int* count, CUmodule mod) {
  return guarded([&](State& s) -> CUresult {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.modules.find(from_handle(mod));
    if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    *count = static_cast<unsigned>(it->second.image.entries.size());
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuModuleEnumerateFunctions(CUfunction* functions, unsigned int numFunctions, CUmodule mod) {
  return guarded([&](State& s) -> CUresult {
    if (functions == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.modules.find(from_handle(mod));
    if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    const auto& entries = it->second.image.entries;
    if (numFunctions > entries.size()) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numFunctions; ++i)
      functions[i] = to_handle<CUfunc_st>(it->second.functions.at(entries[i].name));
    return CUDA_SUCCESS;
  });
}

// The largest cluster a launch of the function could have: 8 blocks, 16 with the
// non-portable attribute (an H100/H200's limits), never more blocks than the grid holds.
CUresult CUDAAPI cuOccupancyMaxPotentialClusterSize(int* clusterSize, CUfunction func, const CUlaunchConfig* config) {
  return guarded([&](State& s) -> CUresult {
    if (clusterSize == nullptr || config == nullptr || (config->numAttrs != 0 && config->attrs == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    FunctionRef r;
    if (const CUresult e = lookup_function(s, func, &r); e != CUDA_SUCCESS) return e;
    if (const CUresult e = check_stream(s, config->hStream); e != CUDA_SUCCESS) return e;
    const std::uint64_t threads = std::uint64_t{config->blockDimX} * config->blockDimY * config->blockDimZ;
    if (threads == 0 || threads > kMaxThreadsPerBlock) return CUDA_ERROR_INVALID_VALUE;
    const bool non_portable = r.fn->settable[CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED] != 0;
    const std::uint64_t blocks = std::uint64_t{config->gridDimX} * config->gridDimY * config->gridDimZ;
    *clusterSize = static_cast<int>(std::min<std::uint64_t>(non_portable ? 16 : 8, std::max<std::uint64_t>(blocks, 1)));
    return CUDA_SUCCESS;
  });
}

// ---- tensor maps -----------------------------------------------------------------------------

// Checks what the driver documents for a tiled descriptor and writes a deterministic
// descriptor (the fields in order): there is no TMA unit to read it.
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                        cuuint32_t tensorRank, void* globalAddress, const cuuint64_t* globalDim,
                                        const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
                                        const cuuint32_t* elementStrides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                        CUtensorMapFloatOOBfill oobFill) {
  if (tensorMap == nullptr || tensorRank == 0 || tensorRank > 5 || globalDim == nullptr || boxDim == nullptr ||
      elementStrides == nullptr || (tensorRank > 1 && globalStrides == nullptr) ||
      reinterpret_cast<std::uintptr_t>(globalAddress) % 16 != 0 ||
      static_cast<unsigned>(tensorDataType) > CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B ||
      static_cast<unsigned>(interleave) > CU_TENSOR_MAP_INTERLEAVE_32B ||
      static_cast<unsigned>(swizzle) > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B ||
      static_cast<unsigned>(l2Promotion) > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
      static_cast<unsigned>(oobFill) > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)
    return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t i = 0; i < tensorRank; ++i) {
    if (globalDim[i] == 0 || globalDim[i] > (cuuint64_t{1} << 32) || boxDim[i] == 0 || boxDim[i] > 256 ||
        elementStrides[i] == 0 || elementStrides[i] > 8)
      return CUDA_ERROR_INVALID_VALUE;
    if (i + 1 < tensorRank && (globalStrides[i] % 16 != 0 || globalStrides[i] >= (cuuint64_t{1} << 40)))
      return CUDA_ERROR_INVALID_VALUE;
  }
  CUtensorMap m{};
  cuuint64_t* w = m.opaque;
  w[0] = reinterpret_cast<std::uintptr_t>(globalAddress);
  w[1] = (cuuint64_t{tensorRank} << 32) | static_cast<unsigned>(tensorDataType);
  w[2] = (cuuint64_t{static_cast<unsigned>(interleave)} << 24) | (cuuint64_t{static_cast<unsigned>(swizzle)} << 16) |
         (cuuint64_t{static_cast<unsigned>(l2Promotion)} << 8) | static_cast<unsigned>(oobFill);
  for (cuuint32_t i = 0; i < tensorRank; ++i) {
    w[3 + i] = globalDim[i];
    w[8 + i] = (cuuint64_t{boxDim[i]} << 32) | elementStrides[i];
    if (i + 1 < tensorRank && 13 + i < 16) w[13 + i] = globalStrides[i];
  }
  *tensorMap = m;
  return CUDA_SUCCESS;
}

namespace {

// What a tiled and an im2col descriptor share: the data type, the enums and the
// global shape, as cuda.h states their bounds.
bool tensor_common_ok(CUtensorMapDataType type, cuuint32_t rank, void* addr, const cuuint64_t* dims,
                      const cuuint64_t* strides, const cuuint32_t* elem, CUtensorMapInterleave interleave,
                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  if (rank == 0 || rank > 5 || dims == nullptr || elem == nullptr || (rank > 1 && strides == nullptr) ||
      reinterpret_cast<std::uintptr_t>(addr) % 16 != 0 ||
      static_cast<unsigned>(type) > CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B ||
      static_cast<unsigned>(interleave) > CU_TENSOR_MAP_INTERLEAVE_32B ||
      static_cast<unsigned>(swizzle) > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B ||
      static_cast<unsigned>(l2) > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
      static_cast<unsigned>(fill) > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)
    return false;
  for (cuuint32_t i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (cuuint64_t{1} << 32) || elem[i] == 0 || elem[i] > 8) return false;
    if (i + 1 < rank && (strides[i] % 16 != 0 || strides[i] >= (cuuint64_t{1} << 40))) return false;
  }
  return true;
}

}  // namespace

// An im2col descriptor (rank 3 to 5, a pixel box of rank - 2 corners in [-2^15, 2^15),
// up to 256 channels a pixel and 1024 pixels a column), written deterministically as the
// tiled one is.
CUresult CUDAAPI cuTensorMapEncodeIm2col(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                         cuuint32_t tensorRank, void* globalAddress, const cuuint64_t* globalDim,
                                         const cuuint64_t* globalStrides, const int* pixelBoxLowerCorner,
                                         const int* pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
                                         cuuint32_t pixelsPerColumn, const cuuint32_t* elementStrides,
                                         CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                         CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  if (tensorMap == nullptr || tensorRank < 3 || pixelBoxLowerCorner == nullptr || pixelBoxUpperCorner == nullptr ||
      channelsPerPixel == 0 || channelsPerPixel > 256 || pixelsPerColumn == 0 || pixelsPerColumn > 1024 ||
      !tensor_common_ok(tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
                        interleave, swizzle, l2Promotion, oobFill))
    return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t i = 0; i + 2 < tensorRank; ++i)
    if (pixelBoxLowerCorner[i] < -(1 << 15) || pixelBoxLowerCorner[i] >= (1 << 15) ||
        pixelBoxUpperCorner[i] < -(1 << 15) || pixelBoxUpperCorner[i] >= (1 << 15))
      return CUDA_ERROR_INVALID_VALUE;
  CUtensorMap m{};
  cuuint64_t* w = m.opaque;
  w[0] = reinterpret_cast<std::uintptr_t>(globalAddress);
  w[1] = (cuuint64_t{tensorRank} << 32) | (cuuint64_t{1} << 31) | static_cast<unsigned>(tensorDataType);
  w[2] = (cuuint64_t{channelsPerPixel} << 48) | (cuuint64_t{pixelsPerColumn} << 32) |
         (cuuint64_t{static_cast<unsigned>(interleave)} << 24) | (cuuint64_t{static_cast<unsigned>(swizzle)} << 16) |
         (cuuint64_t{static_cast<unsigned>(l2Promotion)} << 8) | static_cast<unsigned>(oobFill);
  for (cuuint32_t i = 0; i < tensorRank; ++i) {
    w[3 + i] = globalDim[i];
    w[8 + i] = elementStrides[i];
    if (i + 1 < tensorRank && 13 + i < 16) w[13 + i] = globalStrides[i];
  }
  for (cuuint32_t i = 0; i + 2 < tensorRank; ++i)
    w[8 + i] |= (cuuint64_t{static_cast<std::uint16_t>(pixelBoxLowerCorner[i])} << 48) |
                (cuuint64_t{static_cast<std::uint16_t>(pixelBoxUpperCorner[i])} << 32);
  *tensorMap = m;
  return CUDA_SUCCESS;
}

// The wide form as the H100's driver answers it (cuda.h says compute capability 10.0,
// the driver encodes one on 9.0 too): a pixel box of widths, W or W128 rows.
CUresult CUDAAPI cuTensorMapEncodeIm2colWide(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                             cuuint32_t tensorRank, void* globalAddress, const cuuint64_t* globalDim,
                                             const cuuint64_t* globalStrides, int pixelBoxLowerCornerWidth,
                                             int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel,
                                             cuuint32_t pixelsPerColumn, const cuuint32_t* elementStrides,
                                             CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
                                             CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                             CUtensorMapFloatOOBfill oobFill) {
  const int lower[3] = {pixelBoxLowerCornerWidth, 0, 0}, upper[3] = {pixelBoxUpperCornerWidth, 0, 0};
  if (static_cast<unsigned>(mode) > CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128) return CUDA_ERROR_INVALID_VALUE;
  const CUresult st = cuTensorMapEncodeIm2col(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim,
                                              globalStrides, lower, upper, channelsPerPixel, pixelsPerColumn,
                                              elementStrides, interleave, swizzle, l2Promotion, oobFill);
  if (st == CUDA_SUCCESS) tensorMap->opaque[1] |= cuuint64_t{1 + static_cast<unsigned>(mode)} << 28;
  return st;
}

// The address is the descriptor's first word (as the double writes descriptors).
CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* tensorMap, void* globalAddress) {
  if (tensorMap == nullptr || reinterpret_cast<std::uintptr_t>(globalAddress) % 16 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  tensorMap->opaque[0] = reinterpret_cast<std::uintptr_t>(globalAddress);
  return CUDA_SUCCESS;
}
