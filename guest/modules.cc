// Modules and their functions and globals (cuModuleLoad*, cuModuleGet*,
// cuModuleEnumerateFunctions, cuFunc*). Images travel through the arena; the
// host checks them before its driver sees them (host-daemon/worker/modules.cc).
// Libraries are guest/library.cc.
#include <cuda.h>
#include <elf.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "guest/errors.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/export_tables.h"
#include "guest/graphs.h"
#include "guest/family.h"

namespace {

CUresult load_module(CUmodule* mod, const void* image, size_t bytes) {
  NEED_RT();
  NEED_CTX();
  if (mod == nullptr || image == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  // Images go through the arena (ivcuda::guest::with_arena_block).
  proto::RepHandle rep{};
  const CUresult st = ivcuda::guest::with_arena_block(rt, ctx, bytes, [&](std::uint64_t off) {
    proto::ReqModuleLoad r{};
    r.ctx = ctx;
    r.bytes = bytes;
    r.arena_off = off;
    std::memcpy(rt->bar() + off, image, bytes);
    return rt->call<Op::kModuleLoad>(r, {}, &rep);
  });
  if (st == CUDA_SUCCESS) *mod = reinterpret_cast<CUmodule>(rep.handle);
  return st;
}

// Size of a module image handed to cuModuleLoadData without a length:
// PTX text (NUL-terminated), an ELF cubin, or a fatbin (header + payload).
size_t image_size(const void* image) {
  const auto* b = static_cast<const unsigned char*>(image);
  std::uint32_t magic;
  std::memcpy(&magic, b, 4);
  if (magic == 0x464c457fu) {
    // ELF: the file ends where its last table, section or segment ends.
    // (nvcc puts the section headers last, NVRTC the program headers.)
    Elf64_Ehdr eh;
    std::memcpy(&eh, b, sizeof eh);
    std::uint64_t end = std::max<std::uint64_t>(eh.e_ehsize, eh.e_shoff + std::uint64_t{eh.e_shentsize} * eh.e_shnum);
    end = std::max(end, eh.e_phoff + std::uint64_t{eh.e_phentsize} * eh.e_phnum);
    for (unsigned i = 0; eh.e_shentsize >= sizeof(Elf64_Shdr) && i < eh.e_shnum; ++i) {
      Elf64_Shdr sh;
      std::memcpy(&sh, b + eh.e_shoff + std::uint64_t{i} * eh.e_shentsize, sizeof sh);
      if (sh.sh_type != SHT_NOBITS) end = std::max(end, sh.sh_offset + sh.sh_size);
    }
    for (unsigned i = 0; eh.e_phentsize >= sizeof(Elf64_Phdr) && i < eh.e_phnum; ++i) {
      Elf64_Phdr ph;
      std::memcpy(&ph, b + eh.e_phoff + std::uint64_t{i} * eh.e_phentsize, sizeof ph);
      end = std::max(end, ph.p_offset + ph.p_filesz);
    }
    return end;
  }
  if (magic == 0xba55ed50u) {  // fatbin: u32 magic, u16 version, u16 header size, u64 payload size
    std::uint16_t hsize;
    std::uint64_t payload;
    std::memcpy(&hsize, b + 6, 2);
    std::memcpy(&payload, b + 8, 8);
    return hsize + payload;
  }
  if (magic == 0x466243b1u) return 0;  // a fatbin wrapper: handled by the caller
  return std::strlen(static_cast<const char*>(image)) + 1;
}

}  // namespace

std::span<const std::byte> ivcuda::guest::module_image(const void* image) noexcept {
  if (image == nullptr) return {};
  size_t n = image_size(image);
  if (n == 0) {  // a fatbin wrapper: see cuModuleLoadData
    std::memcpy(&image, static_cast<const char*>(image) + 8, sizeof image);
    if (image == nullptr) return {};
    n = image_size(image);
  }
  return {static_cast<const std::byte*>(image), n};
}

// =================================================================== modules

CUresult cuModuleLoadData(CUmodule* mod, const void* image) {
  return guard([&] {
    if (image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const size_t n = image_size(image);
    if (n == 0) {
      // A fatbin wrapper (as nvcc embeds it): u32 magic, u32 version, the
      // fatbin's address.
      const void* fatbin;
      std::memcpy(&fatbin, static_cast<const char*>(image) + 8, sizeof fatbin);
      return load_module(mod, fatbin, image_size(fatbin));
    }
    return load_module(mod, image, n);
  });
}

CUresult cuModuleLoadDataEx(CUmodule* mod, const void* image, unsigned int n, CUjit_option* opts, void** vals) {
  // The host compiles with the driver's defaults. Options that only tune
  // code generation are accepted as hints; the outputs a program may read
  // (logs, wall time) are answered as "empty" so it never reads garbage.
  if (n != 0 && (opts == nullptr || vals == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned int i = 0; i < n; ++i) {
    switch (opts[i]) {
      case CU_JIT_WALL_TIME: {
        const float zero = 0.0f;
        std::memcpy(&vals[i], &zero, sizeof zero);
        break;
      }
      case CU_JIT_INFO_LOG_BUFFER:
      case CU_JIT_ERROR_LOG_BUFFER:
        break;  // filled below, once the sizes are known
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: {
        const CUjit_option buf = opts[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ? CU_JIT_INFO_LOG_BUFFER
                                                                               : CU_JIT_ERROR_LOG_BUFFER;
        const auto size = reinterpret_cast<std::uintptr_t>(vals[i]);
        for (unsigned int j = 0; j < n; ++j)
          if (opts[j] == buf && vals[j] != nullptr && size > 0) static_cast<char*>(vals[j])[0] = '\0';
        vals[i] = nullptr;  // bytes written
        break;
      }
      case CU_JIT_MAX_REGISTERS:
      case CU_JIT_THREADS_PER_BLOCK:
      case CU_JIT_OPTIMIZATION_LEVEL:
      case CU_JIT_TARGET_FROM_CUCONTEXT:
      case CU_JIT_TARGET:
      case CU_JIT_FALLBACK_STRATEGY:
      case CU_JIT_GENERATE_DEBUG_INFO:
      case CU_JIT_LOG_VERBOSE:
      case CU_JIT_GENERATE_LINE_INFO:
      case CU_JIT_CACHE_MODE:
        break;
      default:
        ivcuda::guest::log_once("jitopts", "cuModuleLoadDataEx: JIT option %d is not forwarded; the host "
                                "compiles with the driver's defaults", static_cast<int>(opts[i]));
    }
  }
  return cuModuleLoadData(mod, image);
}

CUresult cuModuleLoadFatBinary(CUmodule* mod, const void* fatbin) { return cuModuleLoadData(mod, fatbin); }

CUresult cuModuleLoad(CUmodule* mod, const char* path) {
  return guard([&] {
    if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::ifstream f(path, std::ios::binary);
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (data.empty()) return CUDA_ERROR_INVALID_IMAGE;
    data.push_back('\0');  // PTX text must end in NUL
    return load_module(mod, data.data(), data.size());
  });
}

CUresult cuModuleUnload(CUmodule mod) {
  return guard([&] {
    NEED_RT();
    return rt->call<Op::kModuleUnload>(proto::ReqHandle{current_ctx(), h(mod)});
  });
}

namespace {
// The module calls that carry a name: validated here, sent after the struct.
template <Op op>
CUresult module_name_call(CUmodule mod, const char* name, typename proto::OpTraits<op>::Reply* rep,
                          std::vector<std::byte>* extra = nullptr) {
  NEED_RT();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const size_t n = strnlen(name, proto::kNameMax + 1);
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  if (n > proto::kNameMax) {
    ivcuda::guest::log_once("longname", "a kernel or global name longer than %u bytes is not looked up",
                            proto::kNameMax);
    return CUDA_ERROR_NOT_FOUND;
  }
  proto::ReqModuleName r{};
  r.ctx = current_ctx();
  r.module = h(mod);
  r.name_len = static_cast<std::uint32_t>(n);
  return rt->call<op>(r, {reinterpret_cast<const std::byte*>(name), n}, rep, extra);
}
}  // namespace

CUresult cuModuleGetFunction(CUfunction* f, CUmodule mod, const char* name) {
  return guard([&] {
    NEED_RT();
    if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepFunction rep{};
    std::vector<std::byte> extra;
    const CUresult st = module_name_call<Op::kModuleGetFunction>(mod, name, &rep, &extra);
    if (st != CUDA_SUCCESS) return st;
    if (extra.size() != rep.param_count * sizeof(proto::ParamSlot)) return CUDA_ERROR_UNKNOWN;
    ivcuda::guest::FuncInfo info;
    info.params.resize(rep.param_count);
    if (!extra.empty()) std::memcpy(info.params.data(), extra.data(), extra.size());  // kernels without parameters
    info.param_bytes = rep.param_bytes;
    {
      std::lock_guard lk(rt->books_mu);
      rt->funcs[rep.function] = std::move(info);
    }
    *f = reinterpret_cast<CUfunction>(rep.function);
    return CUDA_SUCCESS;
  });
}

CUresult cuModuleGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUmodule mod, const char* name) {
  return guard([&] {
    NEED_RT();
    proto::RepRange rep{};
    const CUresult st = module_name_call<Op::kModuleGetGlobal>(mod, name, &rep);
    if (st != CUDA_SUCCESS) return st;
    bool fresh;
    {
      std::lock_guard lk(rt->books_mu);
      fresh = rt->dev_allocs.emplace(rep.base, rep.size).second;
    }
    if (fresh) (void)rt->reserve_device_range(rep.base, rep.size);
    if (dptr != nullptr) *dptr = rep.base;
    if (bytes != nullptr) *bytes = rep.size;
    return CUDA_SUCCESS;
  });
}

// ---- enumeration: the host's driver names a module's kernels, each is then
// looked up as cuModuleGetFunction looks one up.
namespace {
// Names of a module's kernels, as the host's driver enumerates them.
CUresult module_function_names(CUmodule mod, std::vector<std::string>* names) {
  NEED_RT();
  if (mod == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  proto::RepValue rep{};
  std::vector<std::byte> extra;
  const CUresult st = rt->call<Op::kModuleEnumerate>(proto::ReqHandle{current_ctx(), h(mod)}, {}, &rep, &extra);
  if (st != CUDA_SUCCESS) return st;
  std::size_t at = 0;
  for (std::int64_t i = 0; i < rep.value; ++i) {
    std::uint32_t len = 0;
    if (extra.size() - at < sizeof len) return CUDA_ERROR_UNKNOWN;
    std::memcpy(&len, extra.data() + at, sizeof len);
    at += sizeof len;
    if (len == 0 || extra.size() - at < len) return CUDA_ERROR_UNKNOWN;
    names->emplace_back(reinterpret_cast<const char*>(extra.data() + at), len);
    at += len;
  }
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuModuleGetFunctionCount(unsigned int* count, CUmodule mod) {
  return guard([&] {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::string> names;
    const CUresult st = module_function_names(mod, &names);
    if (st == CUDA_SUCCESS) *count = static_cast<unsigned>(names.size());
    return st;
  });
}

CUresult cuModuleEnumerateFunctions(CUfunction* fns, unsigned int n, CUmodule mod) {
  return guard([&] {
    if (fns == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::string> names;
    CUresult st = module_function_names(mod, &names);
    if (st != CUDA_SUCCESS) return st;
    if (n > names.size()) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; ++i)
      if ((st = cuModuleGetFunction(&fns[i], mod, names[i].c_str())) != CUDA_SUCCESS) return st;
    return CUDA_SUCCESS;
  });
}

CUresult ivcuda::guest::for_each_module_function(CUmodule mod, void (*cb)(void*, CUfunction), void* user) noexcept {
  return guard([&] {
    if (cb == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::string> names;
    CUresult st = module_function_names(mod, &names);
    if (st != CUDA_SUCCESS) return st;
    for (const auto& name : names) {
      CUfunction f = nullptr;
      if ((st = cuModuleGetFunction(&f, mod, name.c_str())) != CUDA_SUCCESS) return st;
      cb(user, f);
    }
    return CUDA_SUCCESS;
  });
}

CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t* offset, size_t* size) {
  return guard([&] {
    NEED_RT();
    if (offset == nullptr || size == nullptr) return CUDA_ERROR_INVALID_VALUE;
    f = ivcuda::guest::kernel_function(f);
    std::lock_guard lk(rt->books_mu);
    auto it = rt->funcs.find(h(f));
    if (it == rt->funcs.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (index >= it->second.params.size()) return CUDA_ERROR_INVALID_VALUE;
    *offset = it->second.params[index].offset;
    *size = it->second.params[index].size;
    return CUDA_SUCCESS;
  });
}

namespace {
// IVCUDA_FUNC_ATTR_ANSWERS=off sends every cuFuncGetAttribute (tests compare).
bool fixed_func_attrs() {
  static const bool on = ivcuda::guest::switched_on("IVCUDA_FUNC_ATTR_ANSWERS");
  return on;
}
}  // namespace

// The attributes a loaded function keeps for its life - the first eight
// (threads per block, static shared, constant and local sizes, registers,
// PTX and binary versions, the L1 cache mode) - cross once per function and
// are answered here after that: cudart's cudaFuncGetAttributes asks all of
// them at every call, and CUB's dispatch asks on every algorithm it runs.
// The rest may be set (cuFuncSetAttribute, cuKernelSetAttribute for every
// context at once): they always cross.
CUresult cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction f) {
  return guard([&] {
    NEED_RT();
    if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
    f = ivcuda::guest::kernel_function(f);
    const bool fixed = a >= 0 && a < ivcuda::guest::FuncInfo::kFixedAttrs && fixed_func_attrs();
    if (fixed) {
      std::lock_guard lk(rt->books_mu);
      auto it = rt->funcs.find(h(f));
      if (it != rt->funcs.end() && (it->second.fixed_known >> a & 1u) != 0) {
        *v = it->second.fixed_attr[static_cast<std::size_t>(a)];
        return CUDA_SUCCESS;
      }
    }
    proto::ReqFuncAttr r{current_ctx(), h(f), static_cast<std::int32_t>(a), 0};
    proto::RepValue rep{};
    const CUresult st = rt->call<Op::kFuncGetAttribute>(r, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    *v = static_cast<int>(rep.value);
    if (fixed) {
      std::lock_guard lk(rt->books_mu);
      if (auto it = rt->funcs.find(h(f)); it != rt->funcs.end()) {
        it->second.fixed_attr[static_cast<std::size_t>(a)] = *v;
        it->second.fixed_known |= 1u << a;
      }
    }
    return CUDA_SUCCESS;
  });
}

CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int value) {
  return guard([&] {
    NEED_RT();
    f = ivcuda::guest::kernel_function(f);
    proto::ReqFuncAttr r{current_ctx(), h(f), static_cast<std::int32_t>(a), value};
    return rt->call<Op::kFuncSetAttribute>(r);
  });
}

CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache config) {
  return guard([&] {
    NEED_RT();
    f = ivcuda::guest::kernel_function(f);
    return rt->call<Op::kFuncSetCacheConfig>(
        proto::ReqFuncCache{current_ctx(), h(f), static_cast<std::uint32_t>(config), 0});
  });
}

// ==================================================== a function's name, module, loading state

namespace {
CUresult func_misc(CUfunction f, std::uint32_t kind, std::int64_t* value, std::vector<std::byte>* extra) {
  return guard([&] {
    NEED_RT();
    f = ivcuda::guest::kernel_function(f);
    if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    proto::RepValue rep{};
    const CUresult st = rt->call<Op::kFuncMisc>(proto::ReqFuncMisc{h(f), kind, 0}, {}, &rep, extra);
    if (st == CUDA_SUCCESS && value != nullptr) *value = rep.value;
    return st;
  });
}
}  // namespace

// The name stays valid for the process: cuFuncGetName's pointer is the
// driver's, which outlives the call too.
CUresult cuFuncGetName(const char** name, CUfunction f) {
  return guard([&] {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    static std::mutex mu;
    static auto* names = new std::map<std::uint64_t, std::string>;  // never destroyed: atexit callers
    {
      std::lock_guard lk(mu);
      if (auto it = names->find(h(f)); it != names->end()) {
        *name = it->second.c_str();
        return CUDA_SUCCESS;
      }
    }
    std::int64_t len = 0;
    std::vector<std::byte> extra;
    if (const CUresult st = func_misc(f, proto::kFuncName, &len, &extra); st != CUDA_SUCCESS) return st;
    if (len <= 0 || static_cast<std::size_t>(len) != extra.size()) return CUDA_ERROR_UNKNOWN;
    std::lock_guard lk(mu);
    auto [it, fresh] = names->try_emplace(h(f), reinterpret_cast<const char*>(extra.data()), extra.size());
    *name = it->second.c_str();
    return CUDA_SUCCESS;
  });
}

CUresult cuFuncGetModule(CUmodule* mod, CUfunction f) {
  if (mod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::int64_t v = 0;
  const CUresult st = func_misc(f, proto::kFuncModule, &v, nullptr);
  if (st == CUDA_SUCCESS) *mod = reinterpret_cast<CUmodule>(static_cast<std::uintptr_t>(v));
  return st;
}

CUresult cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction f) {
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::int64_t v = 0;
  const CUresult st = func_misc(f, proto::kFuncIsLoaded, &v, nullptr);
  if (st == CUDA_SUCCESS) *state = static_cast<CUfunctionLoadingState>(v);
  return st;
}

CUresult cuFuncLoad(CUfunction f) { return func_misc(f, proto::kFuncLoad, nullptr, nullptr); }
