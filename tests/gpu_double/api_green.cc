// Green contexts of the GPU test double (CUDA 12.4+): SM resources, their splits and
// descriptors, green contexts over the device's primary context, their converted contexts and
// streams. The double runs every kernel on the CPU, so a green context's SMs are a number it
// keeps and reports, not a limit on anything it runs.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

// The granularity of a split: what CUDA documents for compute capability 9.0 (groups of at
// least 8 SMs, a multiple of 8), or with CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING 2 and 2.
constexpr unsigned kSmGranularity = 8;
constexpr unsigned kSmGranularityIgnoringCoscheduling = 2;
constexpr unsigned kSplitFlags =
    CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING | CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE;

// What a CUdevResource the double hands out carries in its _internal_padding: where it came from,
// and a checksum over that and the SM fields, so that a resource made up or edited by the caller
// no longer decodes (CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION where it is an input).
constexpr std::uint32_t kResourceMagic = 0x52475649;  // "IVGR"
struct Identity {
  std::uint32_t magic = 0;
  std::int32_t device = 0;
  std::uint64_t split = 0;      // the cuDevSmResourceSplitByCount call it came out of, or 0
  std::uint32_t index = 0;      // its place among that call's outputs (the remainder last)
  std::uint32_t splittable = 0; // from cuDeviceGetDevResource, cuCtxGetDevResource, cuGreenCtxGetDevResource
  std::uint64_t check = 0;
};
static_assert(sizeof(Identity) <= sizeof(CUdevResource::_internal_padding));

std::uint64_t checksum(const Identity& id, const CUdevSmResource& sm) {
  // FNV-1a over the fields, one at a time (no padding bytes involved).
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(id.magic);
  mix(static_cast<std::uint32_t>(id.device));
  mix(id.split);
  mix(id.index);
  mix(id.splittable);
  mix(sm.smCount);
  mix(sm.minSmPartitionSize);
  mix(sm.smCoscheduledAlignment);
  return h;
}

// Fills *out as a resource of `sms` SMs on `device`, made by the double.
void make_resource(CUdevResource* out, int device, unsigned sms, unsigned granularity, std::uint64_t split,
                   std::uint32_t index, bool splittable) {
  CUdevResource r;
  std::memset(&r, 0, sizeof r);
  r.type = CU_DEV_RESOURCE_TYPE_SM;
  r.sm.smCount = sms;
  r.sm.minSmPartitionSize = granularity;
  r.sm.smCoscheduledAlignment = granularity;
  Identity id;
  id.magic = kResourceMagic;
  id.device = device;
  id.split = split;
  id.index = index;
  id.splittable = splittable ? 1 : 0;
  id.check = checksum(id, r.sm);
  std::memcpy(r._internal_padding, &id, sizeof id);
  *out = r;
}

// The identity of a resource the double made, or false.
bool decode(const State& s, const CUdevResource& r, Identity* out) {
  Identity id;
  std::memcpy(&id, r._internal_padding, sizeof id);
  if (id.magic != kResourceMagic || id.device < 0 || id.device >= s.device_count || id.splittable > 1 ||
      id.check != checksum(id, r.sm))
    return false;
  const auto* rest = r._internal_padding + sizeof id;
  if (std::any_of(rest, std::end(r._internal_padding), [](unsigned char c) { return c != 0; })) return false;
  *out = id;
  return true;
}

// The answer of the three resource queries: `sms` SMs of `device`, splittable.
CUresult sm_resource(CUdevResource* resource, CUdevResourceType type, int device, unsigned sms) {
  if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  make_resource(resource, device, sms, kSmGranularity, 0, 0, true);
  return CUDA_SUCCESS;
}

bool special_stream(CUstream h) { return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD; }

// The green context's primary context, usable for work: CONTEXT_IS_DESTROYED after a reset
// of it, the device's sticky fault after a kernel fault.
CUresult green_work(State& s, const Green& g, Handle* primary) {
  *primary = s.primary[static_cast<std::size_t>(g.device)];
  if (!s.contexts.at(*primary).active) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return s.fault_of(*primary);
}

// A green context's event calls refuse a green context with a capturing stream, and end those
// captures, as cuda.h documents.
CUresult refuse_if_capturing(State& s, Handle green) {
  bool capturing = false;
  for (auto& [h, c] : s.captures)
    if (const auto st = s.streams.find(h); st != s.streams.end() && st->second.green == green) {
      c.invalidated = true;
      capturing = true;
    }
  return capturing ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

}  // namespace

// Whose a stream is: the context as the caller names it (a green context's converted context,
// for a stream of one) and its green context or 0; for the special streams the current
// context's (as made current, so a converted context stays one).
CUresult ivcuda::gpu_double::stream_owner(State& s, CUstream h, Handle* ctx, Handle* green) {
  if (special_stream(h)) {
    Handle work = 0;
    if (const CUresult r = current_context(s, &work); r != CUDA_SUCCESS) return r;
    *ctx = ctx_stack().back();
    *green = current_green(s);
    return CUDA_SUCCESS;
  }
  const auto it = s.streams.find(from_handle(h));
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (orphaned(it->second)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *green = it->second.green;
  *ctx = *green != 0 ? s.greens.at(*green).converted : it->second.ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetDevResource(CUdevice device, CUdevResource* resource, CUdevResourceType type) {
  return guarded([&](State& s) -> CUresult {
    if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (device < 0 || device >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    return sm_resource(resource, type, device, kSmCount);
  });
}

// A plain or primary context has the whole device; a green context's converted context its SMs.
CUresult CUDAAPI cuCtxGetDevResource(CUcontext hCtx, CUdevResource* resource, CUdevResourceType type) {
  return guarded([&](State& s) -> CUresult {
    if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle h = 0;
    if (const CUresult r = resolve_context(s, from_handle(hCtx), &h); r != CUDA_SUCCESS) return r;
    const int device = s.contexts.at(h).device;
    if (const auto g = s.converted.find(from_handle(hCtx)); g != s.converted.end())
      return sm_resource(resource, type, device, s.greens.at(g->second).sm_count);
    return sm_resource(resource, type, device, kSmCount);
  });
}

CUresult CUDAAPI cuGreenCtxGetDevResource(CUgreenCtx hCtx, CUdevResource* resource, CUdevResourceType type) {
  return guarded([&](State& s) -> CUresult {
    const auto g = s.greens.find(from_handle(hCtx));
    if (g == s.greens.end()) return CUDA_ERROR_INVALID_CONTEXT;
    if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return sm_resource(resource, type, g->second.device, g->second.sm_count);
  });
}

// Groups of max(granularity, minCount rounded up to it) SMs, as many as fit (or as asked for),
// and the rest as the remainder. Every output of one call shares a fresh split id; none of them
// can be split again.
CUresult CUDAAPI cuDevSmResourceSplitByCount(CUdevResource* result, unsigned int* nbGroups, const CUdevResource* input,
                                             CUdevResource* remaining, unsigned int useFlags, unsigned int minCount) {
  return guarded([&](State& s) -> CUresult {
    if (nbGroups == nullptr || input == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const CUdevResource in = *input;  // result or remaining may overlap it
    if (in.type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    Identity id;
    if (!decode(s, in, &id) || id.splittable == 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    // The H200's driver (580) refuses the two flags together.
    if ((useFlags & ~kSplitFlags) != 0 || useFlags == kSplitFlags) return CUDA_ERROR_INVALID_VALUE;
    if (minCount > in.sm.smCount) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    const unsigned granularity = (useFlags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING) != 0
                                     ? kSmGranularityIgnoringCoscheduling
                                     : kSmGranularity;
    // minCount <= smCount <= 132 here: no overflow in the rounding.
    const unsigned size = std::max(granularity, (minCount + granularity - 1) / granularity * granularity);
    const unsigned possible = in.sm.smCount / size;
    if (result == nullptr) {
      *nbGroups = possible;
      return CUDA_SUCCESS;
    }
    if (*nbGroups == 0) return CUDA_ERROR_INVALID_VALUE;  // an array of no groups (so says the driver)
    const unsigned n = std::min(*nbGroups, possible);
    const std::uint64_t split = s.next_split_id++;
    for (unsigned i = 0; i < n; ++i) make_resource(&result[i], id.device, size, granularity, split, i, false);
    if (remaining != nullptr)
      make_resource(remaining, id.device, in.sm.smCount - n * size, granularity, split, n, false);
    *nbGroups = n;
    return CUDA_SUCCESS;
  });
}

// One resource of any origin, or several outputs of one split; never no SMs at all. (The H200's
// driver, 580, also takes resources of different splits together; the double keeps cuda.h's rule.
// It takes an output named twice, as the driver does, counted twice, up to the device's SMs.)
CUresult CUDAAPI cuDevResourceGenerateDesc(CUdevResourceDesc* phDesc, CUdevResource* resources,
                                           unsigned int nbResources) {
  return guarded([&](State& s) -> CUresult {
    if (phDesc == nullptr || resources == nullptr || nbResources == 0) return CUDA_ERROR_INVALID_VALUE;
    std::vector<Identity> ids(nbResources);
    unsigned total = 0;
    for (unsigned i = 0; i < nbResources; ++i) {
      if (resources[i].type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
      if (!decode(s, resources[i], &ids[i])) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
      total = std::min(total + resources[i].sm.smCount, kSmCount);  // each at most 132: no overflow
    }
    if (nbResources > 1)
      for (unsigned i = 0; i < nbResources; ++i) {
        if (ids[i].split == 0 || ids[i].split != ids[0].split || ids[i].device != ids[0].device)
          return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
      }
    if (total == 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    const Handle h = s.new_handle();
    s.resource_descs[h] = ResourceDesc{.device = ids[0].device, .sm_count = total};
    *phDesc = to_handle<CUdevResourceDesc_st>(h);
    return CUDA_SUCCESS;
  });
}

// Retains the device's primary context (activating it, its memory charged, as
// cuDevicePrimaryCtxRetain does) and makes the converted context once; nothing becomes current.
CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    if (phCtx == nullptr || flags != CU_GREEN_CTX_DEFAULT_STREAM) return CUDA_ERROR_INVALID_VALUE;
    // (The H200's driver, 580, takes a NULL descriptor too; the double keeps to cuda.h.)
    const auto d = s.resource_descs.find(from_handle(desc));
    if (d == s.resource_descs.end()) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    if (d->second.device != dev) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = s.fault[static_cast<std::size_t>(dev)]; r != CUDA_SUCCESS) return r;
    const Handle g = s.new_handle();
    const Handle conv = s.new_handle();
    if (const CUresult r = retain_primary(s, dev); r != CUDA_SUCCESS) return r;
    s.greens[g] = Green{.device = dev, .sm_count = d->second.sm_count, .converted = conv, .id = s.next_green_id++};
    s.converted[conv] = g;
    *phCtx = to_handle<CUgreenCtx_st>(g);
    return CUDA_SUCCESS;
  });
}

// Releases the primary context's retain. The converted context goes with it (where it is still
// current it answers CONTEXT_IS_DESTROYED); streams made in it linger for cuStreamDestroy, their
// captures ended; what was allocated while it was current is the primary context's and stays.
CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx hCtx) {
  return guarded([&](State& s) -> CUresult {
    const Handle g = from_handle(hCtx);
    const auto it = s.greens.find(g);
    if (it == s.greens.end()) return CUDA_ERROR_INVALID_CONTEXT;
    const Green green = it->second;
    for (auto& [h, st] : s.streams) {
      if (st.green != g) continue;
      st.ctx = 0;  // orphaned: a reset of the primary context no longer takes it
      if (const auto c = s.captures.find(h); c != s.captures.end()) {
        if (c->second.own_graph) destroy_graph(s, c->second.graph);
        s.captures.erase(c);
      }
    }
    s.dead_converted[green.converted] = green.device;
    s.converted.erase(green.converted);
    s.greens.erase(it);
    // A caller that released the green context's retain itself finds the count at 0 already.
    (void)release_primary(s, green.device);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxFromGreenCtx(CUcontext* pContext, CUgreenCtx hCtx) {
  return guarded([&](State& s) -> CUresult {
    if (pContext == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.greens.find(from_handle(hCtx));
    if (it == s.greens.end()) return CUDA_ERROR_INVALID_CONTEXT;
    *pContext = to_handle<CUctx_st>(it->second.converted);
    return CUDA_SUCCESS;
  });
}

// A stream of the green context whatever is current (its ctx the primary context).
CUresult CUDAAPI cuGreenCtxStreamCreate(CUstream* phStream, CUgreenCtx greenCtx, unsigned int flags, int priority) {
  return guarded([&](State& s) -> CUresult {
    if (flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.greens.find(from_handle(greenCtx));
    if (it == s.greens.end()) return CUDA_ERROR_INVALID_CONTEXT;
    if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle primary = 0;
    if (const CUresult r = green_work(s, it->second, &primary); r != CUDA_SUCCESS) return r;
    const Handle h = s.new_handle();
    const int prio = std::clamp(priority, kGreatestStreamPriority, kLeastStreamPriority);
    s.streams[h] = Stream{.ctx = primary,
                          .flags = flags,
                          .priority = prio,
                          .id = s.next_stream_id++,
                          .attrs = {},
                          .green = it->first};
    *phStream = to_handle<CUstream_st>(h);
    return CUDA_SUCCESS;
  });
}

// The event completes when the latest work of the green context's streams does (its own
// streams, and the null streams, which it shares with its primary context here); the event must
// be one of the device's primary context (made while it or a converted context was current).
CUresult CUDAAPI cuGreenCtxRecordEvent(CUgreenCtx hCtx, CUevent hEvent) {
  return guarded([&](State& s) -> CUresult {
    const Handle g = from_handle(hCtx);
    const auto it = s.greens.find(g);
    if (it == s.greens.end()) return CUDA_ERROR_INVALID_CONTEXT;
    const auto ev = s.events.find(from_handle(hEvent));
    if (ev == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    Handle primary = 0;
    if (const CUresult r = green_work(s, it->second, &primary); r != CUDA_SUCCESS) return r;
    if (ev->second.ctx != primary) return CUDA_ERROR_INVALID_HANDLE;
    if (const CUresult r = refuse_if_capturing(s, g); r != CUDA_SUCCESS) return r;
    auto when = std::max({std::chrono::steady_clock::now(), busy_end(s, primary, nullptr),
                          busy_end(s, primary, CU_STREAM_PER_THREAD)});
    for (const auto& [h, st] : s.streams)
      if (st.green == g) when = std::max(when, busy_end(s, primary, to_handle<CUstream_st>(h)));
    ev->second.recorded = true;
    ev->second.when = when;
    return CUDA_SUCCESS;
  });
}

// Work runs at once in the double, so the event's work is done: as cuStreamWaitEvent, waiting is
// only checking. The event may be of any context or device.
CUresult CUDAAPI cuGreenCtxWaitEvent(CUgreenCtx hCtx, CUevent hEvent) {
  return guarded([&](State& s) -> CUresult {
    const Handle g = from_handle(hCtx);
    const auto it = s.greens.find(g);
    if (it == s.greens.end()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!s.events.contains(from_handle(hEvent))) return CUDA_ERROR_INVALID_HANDLE;
    Handle primary = 0;
    if (const CUresult r = green_work(s, it->second, &primary); r != CUDA_SUCCESS) return r;
    return refuse_if_capturing(s, g);
  });
}

// greenCtx NULL: the green context whose converted context is current.
CUresult CUDAAPI cuGreenCtxGetId(CUgreenCtx greenCtx, unsigned long long* greenCtxId) {
  return guarded([&](State& s) -> CUresult {
    if (greenCtxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle g = from_handle(greenCtx);
    if (greenCtx == nullptr) {
      Handle work = 0;
      if (const CUresult r = current_context(s, &work); r != CUDA_SUCCESS) return r;
      g = current_green(s);
    }
    const auto it = s.greens.find(g);
    if (it == s.greens.end()) return CUDA_ERROR_INVALID_CONTEXT;
    *greenCtxId = it->second.id;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamGetGreenCtx(CUstream hStream, CUgreenCtx* phCtx) {
  return guarded([&](State& s) -> CUresult {
    if (phCtx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    Handle green = 0;
    if (const CUresult r = stream_owner(s, hStream, &ctx, &green); r != CUDA_SUCCESS) return r;
    *phCtx = to_handle<CUgreenCtx_st>(green);
    return CUDA_SUCCESS;
  });
}
