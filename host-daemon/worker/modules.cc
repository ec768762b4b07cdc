// Modules and their functions and globals: images are checked
// (host-daemon/worker/image_check.h) before the driver sees them. The guest side is
// guest/modules.cc (and guest/library.cc for libraries).
#include <cstring>
#include <string>

#include "host-daemon/worker/image_check.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/worker/worker_internal.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

CUresult Worker::on_ModuleLoad(Call& c) {
  const auto r = c.req<ReqModuleLoad>();
  CtxEntry* ctx = nullptr;
  if (CUresult st = use_ctx(r.ctx, &ctx); st != CUDA_SUCCESS) return st;
  if (r.bytes == 0 || !arena_range(r.arena_off, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (full(modules_, cfg_.limits.modules, "module")) return CUDA_ERROR_OUT_OF_MEMORY;
  // Copy the image out before the driver parses it: the guest could change
  // it under the parser otherwise. The NUL keeps a PTX image terminated.
  std::vector<char> image(r.bytes + 1);
  std::memcpy(image.data(), arena_ptr(r.arena_off), r.bytes);
  image[r.bytes] = '\0';
  // The driver takes the image without a length and believes its own size
  // fields: every extent it declares must lie within the copy.
  const auto v = check_image(std::as_bytes(std::span(image)));
  if (!v.ok) {
    IVLOG_WARN("guest %u: module image of %llu bytes refused: %s", cfg_.guest_id,
               static_cast<unsigned long long>(r.bytes), v.why.c_str());
    return CUDA_ERROR_INVALID_IMAGE;
  }
  // Its code and globals count against the guest's quota, as the image
  // declares them (image_check.h).
  Charge charge = quota_.take(v.device_bytes);
  if (!charge) return CUDA_ERROR_OUT_OF_MEMORY;
  CUmodule m = nullptr;
  const CUresult st = cu_.cuModuleLoadData(&m, image.data());
  if (st != CUDA_SUCCESS) return st;
  ModuleEntry e;
  e.real = m;
  e.ctx = r.ctx;
  e.charge = std::move(charge);
  c.set_reply(RepHandle{modules_.insert(std::move(e))});
  return CUDA_SUCCESS;
}

CUresult Worker::on_ModuleUnload(Call& c) {
  const auto r = c.req<ReqHandle>();
  ModuleEntry* m = modules_.find(r.handle);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuModuleUnload(m->real);
  for (auto& [name, f] : m->functions) funcs_.erase(f);
  for (auto g : m->globals) ranges_.erase(g);
  modules_.erase(r.handle);
  return st;
}

namespace {
// Validates a name sent after a ReqModuleName.
bool read_name(std::span<const std::byte> tail, std::uint32_t len, std::string* out) {
  if (len == 0 || len > kNameMax || tail.size() != len) return false;
  out->assign(reinterpret_cast<const char*>(tail.data()), len);
  return out->find('\0') == std::string::npos;
}

}  // namespace

CUresult Worker::on_ModuleGetFunction(Call& c) {
  const auto r = c.req<ReqModuleName>();
  std::string name;
  if (!read_name(c.tail<ReqModuleName>(), r.name_len, &name)) return CUDA_ERROR_INVALID_VALUE;
  ModuleEntry* m = modules_.find(r.module);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
  std::uint64_t h;
  if (auto it = m->functions.find(name); it != m->functions.end()) {
    h = it->second;
  } else {
    CUfunction f = nullptr;
    CUresult st = cu_.cuModuleGetFunction(&f, m->real, name.c_str());
    if (st != CUDA_SUCCESS) return st;
    FuncEntry e;
    e.real = f;
    e.module = r.module;
    // The guest packs kernel arguments by these offsets and sizes: CUDA's
    // void** kernelParams carries no sizes of its own.
    // The driver reads kernelParams[i] for every parameter the function
    // has, so the list must be complete: it ends where the driver says
    // "index out of range" (INVALID_VALUE) and nowhere else. A function with
    // more parameters than the protocol carries is refused.
    for (size_t i = 0;; ++i) {
      size_t off = 0, size = 0;
      st = cu_.cuFuncGetParamInfo(f, i, &off, &size);
      if (st == CUDA_ERROR_INVALID_VALUE) break;
      if (st != CUDA_SUCCESS) return st;
      if (IVCUDA_RULE("kernel-params-complete") && i == kMaxParams) {
        IVLOG_WARN("guest %u: kernel %s has more than %u parameters; refused", cfg_.guest_id, name.c_str(),
                   kMaxParams);
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      if (off > kMaxParamBytes || size > kMaxParamBytes - off) return CUDA_ERROR_INVALID_IMAGE;
      e.params.push_back({static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(size)});
      e.param_bytes = std::max(e.param_bytes, static_cast<std::uint32_t>(off + size));
    }
    h = funcs_.insert(std::move(e));
    m = modules_.find(r.module);
    m->functions.emplace(name, h);
  }
  const FuncEntry* f = funcs_.find(h);
  RepFunction rep{};
  rep.function = h;
  rep.param_count = static_cast<std::uint32_t>(f->params.size());
  rep.param_bytes = f->param_bytes;
  c.set_reply(rep);
  c.append(f->params.data(), f->params.size() * sizeof(ParamSlot));
  return CUDA_SUCCESS;
}

CUresult Worker::on_ModuleGetGlobal(Call& c) {
  const auto r = c.req<ReqModuleName>();
  std::string name;
  if (!read_name(c.tail<ReqModuleName>(), r.name_len, &name)) return CUDA_ERROR_INVALID_VALUE;
  ModuleEntry* m = modules_.find(r.module);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
  CUdeviceptr d = 0;
  size_t bytes = 0;
  const CUresult st = cu_.cuModuleGetGlobal(&d, &bytes, m->real, name.c_str());
  if (st != CUDA_SUCCESS) return st;
  if (ranges_.find(d) == ranges_.end()) {
    ranges_[d] = DevRange{bytes, m->ctx, RangeKind::kGlobal};
    m->globals.push_back(d);
  }
  c.set_reply(RepRange{d, bytes});
  return CUDA_SUCCESS;
}

CUresult Worker::on_FuncGetAttribute(Call& c) {
  const auto r = c.req<ReqFuncAttr>();
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(modules_.find(f->module)->ctx); st != CUDA_SUCCESS) return st;
  CUfunction_attribute attrib;
  if (!wire_enum(r.attrib, &attrib)) return CUDA_ERROR_INVALID_VALUE;
  int v = 0;
  const CUresult st = cu_.cuFuncGetAttribute(&v, attrib, f->real);
  c.set_reply(RepValue{v});
  return st;
}

CUresult Worker::on_FuncSetAttribute(Call& c) {
  const auto r = c.req<ReqFuncAttr>();
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(modules_.find(f->module)->ctx); st != CUDA_SUCCESS) return st;
  CUfunction_attribute attrib;
  if (!wire_enum(r.attrib, &attrib)) return CUDA_ERROR_INVALID_VALUE;
  return cu_.cuFuncSetAttribute(f->real, attrib, r.value);
}

CUresult Worker::on_FuncSetCacheConfig(Call& c) {
  const auto r = c.req<ReqFuncCache>();
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(modules_.find(f->module)->ctx); st != CUDA_SUCCESS) return st;
  CUfunc_cache config;
  if (!wire_enum(r.config, &config)) return CUDA_ERROR_INVALID_VALUE;
  return cu_.cuFuncSetCacheConfig(f->real, config);
}

CUresult Worker::on_ModuleEnumerate(Call& c) {
  const auto r = c.req<ReqHandle>();
  ModuleEntry* m = modules_.find(r.handle);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
  unsigned n = 0;
  CUresult st = cu_.cuModuleGetFunctionCount(&n, m->real);
  if (st != CUDA_SUCCESS) return st;
  std::vector<CUfunction> fs(n);
  if (n != 0 && (st = cu_.cuModuleEnumerateFunctions(fs.data(), n, m->real)) != CUDA_SUCCESS) return st;
  // Names, not handles: the guest looks each one up by name, which also
  // teaches it the function's parameter layout.
  c.set_reply(RepValue{n});
  const std::size_t room = c.ch.cpl.max_payload();
  for (CUfunction f : fs) {
    const char* name = nullptr;
    if ((st = cu_.cuFuncGetName(&name, f)) != CUDA_SUCCESS) return st;
    const std::size_t len = name != nullptr ? std::strlen(name) : 0;
    if (len == 0 || len > kNameMax) return CUDA_ERROR_NOT_SUPPORTED;
    if (c.out.size() + sizeof(std::uint32_t) + len > room) {
      IVLOG_WARN("guest %u: module has too many kernel names for one reply", cfg_.guest_id);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    const auto len32 = static_cast<std::uint32_t>(len);
    c.append(&len32, sizeof len32);
    c.append(name, len);
  }
  return CUDA_SUCCESS;
}

// cuFuncGetName / cuFuncGetModule / cuFuncIsLoaded / cuFuncLoad. Every
// function the guest holds was looked up by name in one of its modules, so
// the name comes from the worker's own books.
CUresult Worker::on_FuncMisc(Call& c) {
  const auto r = c.req<ReqFuncMisc>();
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  ModuleEntry* m = modules_.find(f->module);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  switch (r.kind) {
    case kFuncName:
      for (const auto& [name, h] : m->functions) {
        if (h != r.function) continue;
        c.set_reply(RepValue{static_cast<std::int64_t>(name.size())});
        c.append(name.data(), name.size());
        return CUDA_SUCCESS;
      }
      return CUDA_ERROR_INVALID_HANDLE;
    case kFuncModule: c.set_reply(RepValue{static_cast<std::int64_t>(f->module)}); return CUDA_SUCCESS;
    case kFuncIsLoaded: {
      if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
      CUfunctionLoadingState state = CU_FUNCTION_LOADING_STATE_UNLOADED;
      const CUresult st = cu_.cuFuncIsLoaded(&state, f->real);
      c.set_reply(RepValue{static_cast<std::int64_t>(state)});
      return st;
    }
    case kFuncLoad:
      if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
      return cu_.cuFuncLoad(f->real);
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace ivcuda::host
