// The JIT linker (cuLinkCreate / AddData / Complete / Destroy): relocatable
// device code linked at run time. The guest side is guest/link.cc, which keeps
// the application's option arrays and log buffers and reads files itself; here
// every input is checked (host-daemon/worker/image_check.h) before the driver sees it,
// and so is the linked output before it goes back to the guest.
#include <cstring>
#include <string>

#include "host-daemon/worker/image_check.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/worker/worker_internal.h"
#include "ivcuda/link_options.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

namespace {

// What one linker may take of the guest's inputs (the driver holds its own
// copies of them until cuLinkDestroy).
constexpr std::uint64_t kLinkInputLimit = 1ull << 30;

}  // namespace

CUresult Worker::on_Link(Call& c) {
  const auto r = c.req<ReqLink>();
  const auto tail = c.tail<ReqLink>();
  // The reply of an add or a complete: the logs as they stand.
  const auto reply_logs = [&c](const LinkEntry& l, std::uint64_t handle, std::uint64_t size) {
    RepLink rep{};
    rep.link = handle;
    rep.size = size;
    rep.info_len = static_cast<std::uint32_t>(::strnlen(l.info_log.get(), kLinkLogBytes));
    rep.error_len = static_cast<std::uint32_t>(::strnlen(l.error_log.get(), kLinkLogBytes));
    rep.wall_ms = l.wall_ms;
    c.set_reply(rep);
    c.append(l.info_log.get(), rep.info_len);
    c.append(l.error_log.get(), rep.error_len);
  };
  if (r.kind == kLinkCreate) {
    if (r.count > kLinkMaxOptions || tail.size() != r.count * sizeof(LinkOption)) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
    if (full(links_, cfg_.limits.links, "linker")) return CUDA_ERROR_OUT_OF_MEMORY;
    LinkEntry e;
    e.info_log = std::make_unique<char[]>(kLinkLogBytes);
    e.error_log = std::make_unique<char[]>(kLinkLogBytes);
    // The driver writes its outputs (the logs' lengths, the wall time) into
    // these arrays for as long as the linker lives: they live in the entry.
    std::vector<CUjit_option> opts{CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                                   CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_WALL_TIME};
    std::vector<void*> vals{e.info_log.get(), reinterpret_cast<void*>(std::uintptr_t{kLinkLogBytes}),
                            e.error_log.get(), reinterpret_cast<void*>(std::uintptr_t{kLinkLogBytes}), nullptr};
    for (std::uint32_t i = 0; i < r.count; ++i) {
      LinkOption o;
      std::memcpy(&o, tail.data() + i * sizeof o, sizeof o);
      if (!forwarded_link_option(o.option)) return CUDA_ERROR_INVALID_VALUE;
      opts.push_back(static_cast<CUjit_option>(o.option));
      vals.push_back(reinterpret_cast<void*>(std::uintptr_t{o.value}));
    }
    e.opts = std::move(opts);
    e.vals = std::move(vals);
    CUlinkState s = nullptr;
    const CUresult st = cu_.cuLinkCreate(static_cast<unsigned>(e.opts.size()), e.opts.data(), e.vals.data(), &s);
    if (st != CUDA_SUCCESS) return st;
    e.real = s;
    RepLink rep{};
    rep.link = links_.insert(std::move(e));
    c.set_reply(rep);
    return CUDA_SUCCESS;
  }
  LinkEntry* l = links_.find(r.link);
  if (l == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  switch (r.kind) {
    case kLinkAdd: {
      if (l->output != nullptr) return CUDA_ERROR_INVALID_VALUE;  // already complete
      if (r.bytes == 0 || !arena_range(r.arena_off, r.bytes) || tail.size() != r.name_len || r.name_len > kNameMax)
        return CUDA_ERROR_INVALID_VALUE;
      if (r.input_type >= CU_JIT_NUM_INPUT_TYPES) return CUDA_ERROR_INVALID_VALUE;
      if (r.input_type == CU_JIT_INPUT_NVVM || r.input_type == CU_JIT_INPUT_LIBRARY) {
        // LTO IR, and archives of host objects whose device code sits in
        // sections the image check does not look into: not forwarded.
        IVLOG_WARN("guest %u: a linker input of type %u refused (NVVM IR and libraries are not forwarded)",
                   cfg_.guest_id, r.input_type);
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      if (r.bytes > kLinkInputLimit - l->input_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
      if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
      // A private copy, terminated: the guest could change the arena under the parser.
      std::vector<char> data(r.bytes + 1);
      std::memcpy(data.data(), arena_ptr(r.arena_off), r.bytes);
      data[r.bytes] = '\0';
      const auto v = check_link_input(std::as_bytes(std::span(data)), r.input_type);
      if (!v.ok) {
        IVLOG_WARN("guest %u: linker input of %llu bytes refused: %s", cfg_.guest_id,
                   static_cast<unsigned long long>(r.bytes), v.why.c_str());
        return CUDA_ERROR_INVALID_IMAGE;
      }
      std::string name(reinterpret_cast<const char*>(tail.data()), tail.size());
      if (name.find('\0') != std::string::npos) return CUDA_ERROR_INVALID_VALUE;
      // PTX goes with its NUL; binaries with their own length.
      const size_t size = r.input_type == CU_JIT_INPUT_PTX ? data.size() : r.bytes;
      const CUresult st = cu_.cuLinkAddData(l->real, static_cast<CUjitInputType>(r.input_type), data.data(), size,
                                            name.empty() ? nullptr : name.c_str(), 0, nullptr, nullptr);
      std::memcpy(&l->wall_ms, &l->vals[4], sizeof l->wall_ms);
      if (st == CUDA_SUCCESS) l->input_bytes += r.bytes;  // the driver keeps its own copy
      reply_logs(*l, r.link, 0);
      return st;
    }
    case kLinkComplete: {
      if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
      if (l->output == nullptr) {
        void* out = nullptr;
        size_t bytes = 0;
        const CUresult st = cu_.cuLinkComplete(l->real, &out, &bytes);
        std::memcpy(&l->wall_ms, &l->vals[4], sizeof l->wall_ms);
        if (st != CUDA_SUCCESS) {
          reply_logs(*l, r.link, 0);
          return st;
        }
        // The driver's own output, but it goes back to a guest that will load it
        // here again: it must be what the checks accept.
        std::vector<char> copy(bytes + 1);
        std::memcpy(copy.data(), out, bytes);
        copy[bytes] = '\0';
        if (const auto v = check_image(std::as_bytes(std::span(copy))); !v.ok || bytes == 0) {
          IVLOG_WARN("guest %u: the linker's output fails the image check: %s", cfg_.guest_id, v.why.c_str());
          return CUDA_ERROR_INVALID_IMAGE;
        }
        l->output = out;
        l->output_bytes = bytes;
      }
      reply_logs(*l, r.link, l->output_bytes);
      return CUDA_SUCCESS;
    }
    case kLinkRead: {
      if (l->output == nullptr || r.bytes != l->output_bytes || !arena_range(r.arena_off, r.bytes))
        return CUDA_ERROR_INVALID_VALUE;
      std::memcpy(arena_ptr(r.arena_off), l->output, l->output_bytes);
      RepLink rep{};
      rep.link = r.link;
      rep.size = l->output_bytes;
      c.set_reply(rep);
      return CUDA_SUCCESS;
    }
    case kLinkDestroy: {
      const CUresult st = cu_.cuLinkDestroy(l->real);
      links_.erase(r.link);
      return st;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

void Worker::destroy_links() noexcept {
  std::vector<std::uint64_t> all;
  links_.for_each([&](std::uint64_t h, LinkEntry& l) {
    cu_.cuLinkDestroy(l.real);
    all.push_back(h);
  });
  for (auto h : all) links_.erase(h);
}

}  // namespace ivcuda::host
