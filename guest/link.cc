// The JIT linker (cuLinkCreate / AddData / AddFile / Complete / Destroy):
// relocatable device code linked at run time (Numba, CuPy with -rdc, programs
// that link PTX with their own device libraries). The host's driver links
// (host-daemon/worker/link.cc, which checks every input and the output); this side
// keeps what the application handed cuLinkCreate - its option arrays, which
// the driver's outputs (log lengths, wall time) are written back into for the
// linker's life, and its log buffers - reads files itself, and holds the
// linked image until cuLinkDestroy, as the driver does.
#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <span>
#include <unordered_set>
#include <vector>

#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "ivcuda/link_options.h"
#include "guest/family.h"

namespace {

struct Link {
  std::uint64_t host = 0;
  // The application's arrays (they must stay valid while the linker lives
  // when output options are among them) and where its outputs go.
  unsigned n = 0;
  CUjit_option* opts = nullptr;
  void** vals = nullptr;
  char* info = nullptr;
  std::size_t info_cap = 0;
  char* error = nullptr;
  std::size_t error_cap = 0;
  std::vector<char> output;  // the linked image, the application's until cuLinkDestroy
  bool complete = false;
};

struct Links {
  std::mutex mu;
  std::unordered_set<Link*> live;
};
Links& links() {
  static auto* l = new Links;
  return *l;
}

Link* find(CUlinkState s) {
  auto* l = reinterpret_cast<Link*>(s);
  std::lock_guard lk(links().mu);
  return links().live.count(l) != 0 ? l : nullptr;
}

// Writes a reply's logs and wall time into the application's buffers and option values.
void answer_outputs(Link& l, const proto::RepLink& rep, const std::vector<std::byte>& extra) {
  if (std::uint64_t{rep.info_len} + rep.error_len > extra.size()) return;
  const auto put_log = [](char* buf, std::size_t cap, const std::byte* text, std::size_t len) -> std::size_t {
    if (buf == nullptr || cap == 0) return 0;
    const std::size_t n = std::min(len, cap - 1);
    if (n != 0) std::memcpy(buf, text, n);
    buf[n] = '\0';
    return n == 0 ? 0 : n + 1;
  };
  const std::size_t info = put_log(l.info, l.info_cap, extra.data(), rep.info_len);
  const std::size_t error = put_log(l.error, l.error_cap, extra.data() + rep.info_len, rep.error_len);
  for (unsigned i = 0; i < l.n; ++i) {
    switch (l.opts[i]) {
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: l.vals[i] = reinterpret_cast<void*>(std::uintptr_t{info}); break;
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: l.vals[i] = reinterpret_cast<void*>(std::uintptr_t{error}); break;
      case CU_JIT_WALL_TIME: std::memcpy(&l.vals[i], &rep.wall_ms, sizeof rep.wall_ms); break;
      default: break;
    }
  }
}

CUresult add(Link& l, int type, const void* data, std::size_t size, const char* name) {
  NEED_RT();
  NEED_CTX();
  if (data == nullptr || size == 0 || type < 0 || type >= CU_JIT_NUM_INPUT_TYPES) return CUDA_ERROR_INVALID_VALUE;
  if (l.complete) return CUDA_ERROR_INVALID_VALUE;
  if (type == CU_JIT_INPUT_NVVM || type == CU_JIT_INPUT_LIBRARY)
    return ivcuda::guest::not_supported("cuLinkAddData: input type %d (NVVM IR, libraries of host objects) is not "
                                        "forwarded; add PTX, cubins or fatbins", type);
  const std::size_t name_len = name == nullptr ? 0 : std::strlen(name);
  if (name_len > proto::kNameMax) return CUDA_ERROR_INVALID_VALUE;
  return ivcuda::guest::with_arena_block(rt, ctx, size, [&](std::uint64_t off) {
    std::memcpy(rt->bar() + off, data, size);
    proto::ReqLink r{};
    r.ctx = ctx;
    r.link = l.host;
    r.kind = proto::kLinkAdd;
    r.input_type = static_cast<proto::u32>(type);
    r.bytes = size;
    r.arena_off = off;
    r.name_len = static_cast<proto::u32>(name_len);
    proto::RepLink rep{};
    std::vector<std::byte> extra;
    const CUresult st =
        rt->call<Op::kLink>(r, std::as_bytes(std::span(name == nullptr ? "" : name, name_len)), &rep, &extra);
    answer_outputs(l, rep, extra);
    return st;
  });
}

}  // namespace

CUresult cuLinkCreate(unsigned int n, CUjit_option* opts, void** vals, CUlinkState* out) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (out == nullptr || (n != 0 && (opts == nullptr || vals == nullptr))) return CUDA_ERROR_INVALID_VALUE;
    auto l = std::make_unique<Link>();
    l->n = n;
    l->opts = opts;
    l->vals = vals;
    std::vector<proto::LinkOption> wire;
    for (unsigned i = 0; i < n; ++i) {
      const auto v = reinterpret_cast<std::uintptr_t>(vals[i]);
      switch (opts[i]) {
        case CU_JIT_INFO_LOG_BUFFER: l->info = static_cast<char*>(vals[i]); break;
        case CU_JIT_ERROR_LOG_BUFFER: l->error = static_cast<char*>(vals[i]); break;
        case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: l->info_cap = static_cast<unsigned>(v); break;
        case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: l->error_cap = static_cast<unsigned>(v); break;
        case CU_JIT_WALL_TIME:
        case CU_JIT_TARGET_FROM_CUCONTEXT:  // the host's context is the target anyway
          break;
        default:
          if (opts[i] < 0 || opts[i] >= CU_JIT_NUM_OPTIONS) return CUDA_ERROR_INVALID_VALUE;
          if (proto::forwarded_link_option(static_cast<proto::u32>(opts[i]))) {
            if (wire.size() == proto::kLinkMaxOptions) return CUDA_ERROR_INVALID_VALUE;
            wire.push_back({static_cast<proto::u32>(opts[i]), static_cast<proto::u32>(v)});
            break;
          }
          ivcuda::guest::log_once("linkopts", "cuLinkCreate: JIT option %d is not forwarded; the host links "
                                  "with the driver's default for it", static_cast<int>(opts[i]));
      }
    }
    proto::ReqLink r{};
    r.ctx = ctx;
    r.kind = proto::kLinkCreate;
    r.count = static_cast<proto::u32>(wire.size());
    proto::RepLink rep{};
    const CUresult st = rt->call<Op::kLink>(r, std::as_bytes(std::span(wire)), &rep);
    if (st != CUDA_SUCCESS) return st;
    l->host = rep.link;
    // Nothing logged yet: the outputs say so from the start.
    answer_outputs(*l, proto::RepLink{}, {});
    std::lock_guard lk(links().mu);
    links().live.insert(l.get());
    *out = reinterpret_cast<CUlinkState>(l.release());
    return CUDA_SUCCESS;
  });
}

CUresult cuLinkAddData(CUlinkState s, CUjitInputType type, void* data, size_t size, const char* name,
                       unsigned int n, CUjit_option* opts, void** vals) {
  return guard([&] {
    Link* l = find(s);
    if (l == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (n != 0 && (opts == nullptr || vals == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    if (n != 0)
      ivcuda::guest::log_once("linkinputopts", "cuLinkAddData: per-input JIT options are not forwarded; the "
                              "linker's own options apply");
    return add(*l, ivcuda::guest::internal::raw_enum(type), data, size, name);
  });
}

CUresult cuLinkAddFile(CUlinkState s, CUjitInputType type, const char* path, unsigned int n, CUjit_option* opts,
                       void** vals) {
  return guard([&] {
    Link* l = find(s);
    if (l == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (path == nullptr || (n != 0 && (opts == nullptr || vals == nullptr))) return CUDA_ERROR_INVALID_VALUE;
    std::ifstream f(path, std::ios::binary);
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (bytes.empty()) return CUDA_ERROR_INVALID_IMAGE;
    const int t = ivcuda::guest::internal::raw_enum(type);
    if (t == CU_JIT_INPUT_PTX) bytes.push_back('\0');
    return add(*l, t, bytes.data(), bytes.size(), path);
  });
}

CUresult cuLinkComplete(CUlinkState s, void** cubin, size_t* size) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    Link* l = find(s);
    if (l == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (cubin == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!l->complete) {
      proto::ReqLink r{};
      r.ctx = ctx;
      r.link = l->host;
      r.kind = proto::kLinkComplete;
      proto::RepLink rep{};
      std::vector<std::byte> extra;
      const CUresult st = rt->call<Op::kLink>(r, {}, &rep, &extra);
      answer_outputs(*l, rep, extra);
      if (st != CUDA_SUCCESS) return st;
      if (rep.size == 0) return CUDA_ERROR_INVALID_IMAGE;
      std::vector<char> image(rep.size);
      const CUresult rd = ivcuda::guest::with_arena_block(rt, ctx, image.size(), [&](std::uint64_t off) {
        proto::ReqLink q{};
        q.ctx = ctx;
        q.link = l->host;
        q.kind = proto::kLinkRead;
        q.bytes = image.size();
        q.arena_off = off;
        const CUresult st2 = rt->call<Op::kLink>(q);
        if (st2 == CUDA_SUCCESS) std::memcpy(image.data(), rt->bar() + off, image.size());
        return st2;
      });
      if (rd != CUDA_SUCCESS) return rd;
      l->output = std::move(image);
      l->complete = true;
    }
    *cubin = l->output.data();
    if (size != nullptr) *size = l->output.size();
    return CUDA_SUCCESS;
  });
}

CUresult cuLinkDestroy(CUlinkState s) {
  return guard([&] {
    NEED_RT();
    Link* l = nullptr;
    {
      std::lock_guard lk(links().mu);
      auto* p = reinterpret_cast<Link*>(s);
      if (links().live.erase(p) == 0) return CUDA_ERROR_INVALID_HANDLE;
      l = p;
    }
    std::unique_ptr<Link> gone(l);
    proto::ReqLink r{};
    r.ctx = current_ctx();
    r.link = l->host;
    r.kind = proto::kLinkDestroy;
    return rt->call<Op::kLink>(r);
  });
}
