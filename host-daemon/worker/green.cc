// Green contexts: partitions of a granted GPU's SMs (cuDeviceGetDevResource,
// cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc, cuGreenCtxCreate and
// the calls on a green context). The guest side is guest/green.cc.
//
// A CUdevResource is a value the application holds, with 92 bytes of the
// driver's own internals in it. The guest gets the driver's images as they
// are, and the worker takes back only images it gave out (issued_resources_):
// a guest cannot hand the driver internals it made up. A green context's
// converted context (cuCtxFromGreenCtx) is a context in ctxs_ like any other,
// marked with its green context; what the guest makes while it is current is
// booked under it, and stays usable in the device's primary context once the
// green context is gone (use_ctx), where the driver keeps it.
#include <algorithm>
#include <cstring>
#include <string_view>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"
#include "host-daemon/worker/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

static_assert(sizeof(CUdevResource) == kResourceBytes, "CUdevResource's ABI changed: see proto.h");

bool Worker::issue_resource(const CUdevResource& r) {
  std::string image(reinterpret_cast<const char*>(&r), sizeof r);
  if (issued_resources_.count(image) != 0) return true;
  if (issued_resources_.size() >= cfg_.limits.resources) {
    if (errors_logged_++ < 100)
      IVLOG_WARN("guest %u: %zu device resources handed out, the limit (--object-limits resources=N); refused",
                 cfg_.guest_id, issued_resources_.size());
    return false;
  }
  issued_resources_.insert(std::move(image));
  return true;
}

bool Worker::issued_resource(std::span<const std::byte> image) const {
  return image.size() == kResourceBytes &&
         issued_resources_.find(std::string_view(reinterpret_cast<const char*>(image.data()), image.size())) !=
             issued_resources_.end();
}

CUresult Worker::on_Green(Call& c) {
  const auto r = c.req<ReqGreen>();
  const auto tail = c.tail<ReqGreen>();
  RepGreen rep{};
  // One resource image back to the guest, remembered.
  const auto give = [&](const CUdevResource& res) {
    if (!issue_resource(res)) return CUDA_ERROR_OUT_OF_MEMORY;
    rep.count = 1;
    c.set_reply(rep);
    c.append(&res, sizeof res);
    return CUDA_SUCCESS;
  };
  CUdevResourceType type = CU_DEV_RESOURCE_TYPE_INVALID;
  switch (r.kind) {
    case kGreenDeviceResource:
    case kGreenCtxResource:
    case kGreenOwnResource: {
      if (!wire_enum(r.type, &type)) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
      CUdevResource res{};
      CUresult st;
      if (r.kind == kGreenDeviceResource) {
        if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
        st = cu_.cuDeviceGetDevResource(devices_[dev_index(r.device)], &res, type);
      } else if (r.kind == kGreenCtxResource) {
        CtxEntry* ce = nullptr;
        if (st = use_ctx(r.ctx, &ce); st != CUDA_SUCCESS) return st;
        st = cu_.cuCtxGetDevResource(ce->real, &res, type);
      } else {
        GreenEntry* g = greens_.find(r.handle);
        if (g == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
        st = cu_.cuGreenCtxGetDevResource(g->real, &res, type);
      }
      return st != CUDA_SUCCESS ? st : give(res);
    }
    case kGreenSplit: {
      if (tail.size() != kResourceBytes) return CUDA_ERROR_INVALID_VALUE;
      if (IVCUDA_RULE("green-issued-resources") && !issued_resource(tail))
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
      if (r.count > kGreenMaxGroups || r.want_remaining > 1) return CUDA_ERROR_INVALID_VALUE;
      // The groups and the rest come back in one reply: it must fit the ring (--ring-size).
      if (sizeof(RepGreen) + (std::size_t{r.count} + r.want_remaining) * kResourceBytes > c.ch.cpl.max_payload())
        return CUDA_ERROR_INVALID_VALUE;
      CUdevResource in{};
      std::memcpy(&in, tail.data(), sizeof in);
      std::vector<CUdevResource> groups(std::max<std::uint32_t>(r.count, 1));
      CUdevResource rest{};
      unsigned n = r.count;
      const CUresult st = cu_.cuDevSmResourceSplitByCount(r.count != 0 ? groups.data() : nullptr, &n, &in,
                                                          r.want_remaining != 0 ? &rest : nullptr, r.flags,
                                                          r.min_count);
      if (st != CUDA_SUCCESS) return st;
      const unsigned n_asked = n;
      if (r.count == 0) n = 0;  // the answer is how many groups there would be (rep.count), none made
      else n = std::min<unsigned>(n, r.count);
      for (unsigned i = 0; i < n; ++i)
        if (!issue_resource(groups[i])) return CUDA_ERROR_OUT_OF_MEMORY;
      if (r.want_remaining != 0 && !issue_resource(rest)) return CUDA_ERROR_OUT_OF_MEMORY;
      rep.count = r.count == 0 ? n_asked : n;
      rep.remaining = r.want_remaining;
      c.set_reply(rep);
      c.append(groups.data(), n * sizeof(CUdevResource));
      if (r.want_remaining != 0) c.append(&rest, sizeof rest);
      return CUDA_SUCCESS;
    }
    case kGreenDesc: {
      if (r.count == 0 || r.count > kGreenMaxGroups + 1 || tail.size() != std::size_t{r.count} * kResourceBytes)
        return CUDA_ERROR_INVALID_VALUE;
      std::vector<CUdevResource> in(r.count);
      for (std::uint32_t i = 0; i < r.count; ++i) {
        const auto image = tail.subspan(std::size_t{i} * kResourceBytes, kResourceBytes);
        if (IVCUDA_RULE("green-issued-resources") && !issued_resource(image))
          return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
        std::memcpy(&in[i], image.data(), kResourceBytes);
      }
      if (full(resource_descs_, cfg_.limits.resource_descs, "resource descriptor")) return CUDA_ERROR_OUT_OF_MEMORY;
      CUdevResourceDesc d = nullptr;
      const CUresult st = cu_.cuDevResourceGenerateDesc(&d, in.data(), r.count);
      if (st != CUDA_SUCCESS) return st;
      rep.handle = resource_descs_.insert(d);
      c.set_reply(rep);
      return CUDA_SUCCESS;
    }
    case kGreenCreate: {
      if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
      // No descriptor: the driver takes that too (and makes the green context on every SM).
      const CUdevResourceDesc none = nullptr;
      const CUdevResourceDesc* d = r.handle == 0 ? &none : resource_descs_.find(r.handle);
      if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
      // Flags the driver may grow later are the worker's to judge first.
      if ((r.flags & ~unsigned{CU_GREEN_CTX_DEFAULT_STREAM}) != 0) return CUDA_ERROR_INVALID_VALUE;
      if (full(greens_, cfg_.limits.green_contexts, "green context") || full(ctxs_, cfg_.limits.contexts, "context"))
        return CUDA_ERROR_OUT_OF_MEMORY;
      Charge ch = context_charge();
      if (!ch) return CUDA_ERROR_OUT_OF_MEMORY;
      CUgreenCtx g = nullptr;
      CUresult st = cu_.cuGreenCtxCreate(&g, *d, devices_[dev_index(r.device)], r.flags);
      if (st != CUDA_SUCCESS) return st;
      CUcontext converted = nullptr;
      if (st = cu_.cuCtxFromGreenCtx(&converted, g); st != CUDA_SUCCESS) {
        cu_.cuGreenCtxDestroy(g);
        return st;
      }
      CtxEntry ce;
      ce.real = converted;
      ce.device = r.device;
      const std::uint64_t ctx = ctxs_.insert(std::move(ce));
      const std::uint64_t green = greens_.insert(GreenEntry{g, ctx, r.device, std::move(ch)});
      ctxs_.find(ctx)->green = green;
      rep.handle = green;
      rep.ctx = ctx;
      c.set_reply(rep);
      return CUDA_SUCCESS;
    }
    default: break;
  }
  // The calls on a green context.
  GreenEntry* g = greens_.find(r.handle);
  if (g == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  switch (r.kind) {
    case kGreenDestroy: {
      const CUresult st = cu_.cuGreenCtxDestroy(g->real);
      if (st != CUDA_SUCCESS) return st;
      CtxEntry* ce = ctxs_.find(g->ctx);
      if (current_ == ce->real) current_ = nullptr;
      ce->real = nullptr;  // its objects now go to the primary context (use_ctx)
      greens_.erase(r.handle);
      return CUDA_SUCCESS;
    }
    case kGreenStreamCreate: {
      if ((r.flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) return CUDA_ERROR_INVALID_VALUE;
      if (full(streams_, cfg_.limits.streams, "stream")) return CUDA_ERROR_OUT_OF_MEMORY;
      CUstream s = nullptr;
      const CUresult st = cu_.cuGreenCtxStreamCreate(&s, g->real, r.flags, r.priority);
      if (st != CUDA_SUCCESS) return st;
      rep.value = streams_.insert(StreamEntry{s, g->ctx});
      c.set_reply(rep);
      return CUDA_SUCCESS;
    }
    case kGreenRecordEvent:
    case kGreenWaitEvent: {
      EventEntry* e = events_.find(r.event);
      if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      return r.kind == kGreenRecordEvent ? cu_.cuGreenCtxRecordEvent(g->real, e->real)
                                         : cu_.cuGreenCtxWaitEvent(g->real, e->real);
    }
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

// At the guest's end, before its contexts go: each green context the guest
// left, so that the driver releases the primary retain it holds.
void Worker::destroy_greens() noexcept {
  std::vector<std::uint64_t> all;
  greens_.for_each([&](std::uint64_t h, GreenEntry& g) {
    cu_.cuGreenCtxDestroy(g.real);
    if (CtxEntry* ce = ctxs_.find(g.ctx); ce != nullptr) ce->real = nullptr;
    all.push_back(h);
  });
  for (auto h : all) greens_.erase(h);
  current_ = nullptr;
  issued_resources_.clear();
}

}  // namespace ivcuda::host
