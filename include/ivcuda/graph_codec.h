// Graph node parameters between CUDA's structs and their wire form
// (proto::GraphNodeParams and what follows it), written once for both sides:
// the guest (guest/graph_build.cc, graph_edit.cc) encodes what the
// application gives and decodes what the worker answers; the worker
// (host-daemon/worker/graph_build.cc, graph_edit.cc) decodes what the guest
// sends and encodes what its driver answers.
//
// The codec converts; it judges nothing. Where the two sides differ it asks
// the caller: how a copy's end is placed (the guest's page-locked pointers
// are arena offsets, the worker's are its mapping of the arena), how a
// location's device is numbered (the application's ordinals, the worker's),
// and whether a wire number may become a CUDA enum (the guest takes the
// worker's word, the worker checks every number: wire_enum). The worker's
// checks of what the guest named stay in the worker, at the calls that need
// them (docs/security.md).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "ivcuda/proto.h"

namespace ivcuda::codec {

// A wire number as a CUDA enum, unchecked: for numbers the worker sent.
// The worker passes its own, checked conversion instead (wire_enum).
inline constexpr auto trusted_enum = [](std::uint64_t v, auto* out) {
  *out = static_cast<std::remove_reference_t<decltype(*out)>>(v);
  return true;
};

// ------------------------------------------------------------------ kernel nodes

// The launch shape of a kernel node (CUDA_KERNEL_NODE_PARAMS v1, v2 and v3
// share it). The function and the packed arguments are each side's own.
template <class K>
void kernel_to_wire(const K& k, proto::GraphNodeParams* p) {
  p->type = CU_GRAPH_NODE_TYPE_KERNEL;
  p->grid[0] = k.gridDimX;
  p->grid[1] = k.gridDimY;
  p->grid[2] = k.gridDimZ;
  p->block[0] = k.blockDimX;
  p->block[1] = k.blockDimY;
  p->block[2] = k.blockDimZ;
  p->shared_bytes = k.sharedMemBytes;
}

template <class K>
void kernel_from_wire(const proto::GraphNodeParams& p, K* k) {
  k->gridDimX = p.grid[0];
  k->gridDimY = p.grid[1];
  k->gridDimZ = p.grid[2];
  k->blockDimX = p.block[0];
  k->blockDimY = p.block[1];
  k->blockDimZ = p.block[2];
  k->sharedMemBytes = p.shared_bytes;
}

// ------------------------------------------------------------------ memset nodes

// CUDA_MEMSET_NODE_PARAMS v1, or v2 (cuGraphAddNode's, whose context stays behind).
template <class M>
void memset_to_wire(const M& m, proto::GraphNodeParams* p) {
  p->type = CU_GRAPH_NODE_TYPE_MEMSET;
  p->dst = m.dst;
  p->pitch = m.pitch;
  p->value = m.value;
  p->elem_size = m.elementSize;
  p->width = m.width;
  p->height = m.height;
}

inline CUDA_MEMSET_NODE_PARAMS memset_from_wire(const proto::GraphNodeParams& p) {
  return CUDA_MEMSET_NODE_PARAMS{.dst = p.dst, .pitch = p.pitch, .value = p.value, .elementSize = p.elem_size,
                                 .width = p.width, .height = p.height};
}

// ------------------------------------------------------------------ memcpy nodes

// A copy's geometry goes as it is; where each end's memory is, is the
// caller's to say. `end(type, device, host, &wire_end)` places one end
// (wire_end's geometry already written) and answers a CUresult.
template <class End>
CUresult copy_to_wire(const CUDA_MEMCPY3D& m, proto::GraphNodeParams* p, End&& end) {
  p->type = CU_GRAPH_NODE_TYPE_MEMCPY;
  p->src = proto::CopyEnd{.type = 0, .reserved = 0, .addr = 0, .x_bytes = m.srcXInBytes, .y = m.srcY, .z = m.srcZ,
                          .pitch = m.srcPitch, .height = m.srcHeight};
  p->dst_copy = proto::CopyEnd{.type = 0, .reserved = 0, .addr = 0, .x_bytes = m.dstXInBytes, .y = m.dstY,
                               .z = m.dstZ, .pitch = m.dstPitch, .height = m.dstHeight};
  p->width_bytes = m.WidthInBytes;
  p->copy_height = m.Height;
  p->depth = m.Depth;
  if (CUresult st = end(m.srcMemoryType, m.srcDevice, m.srcHost, &p->src); st != CUDA_SUCCESS) return st;
  return end(m.dstMemoryType, m.dstDevice, static_cast<const void*>(m.dstHost), &p->dst_copy);
}

// `end(wire_end, &type, &device, &host)` places one end in the caller's terms
// and answers a CUresult; the source end first.
template <class End>
CUresult copy_from_wire(const proto::GraphNodeParams& p, CUDA_MEMCPY3D* m, End&& end) {
  *m = CUDA_MEMCPY3D{};
  const void* src_host = nullptr;
  const void* dst_host = nullptr;
  if (CUresult st = end(p.src, &m->srcMemoryType, &m->srcDevice, &src_host); st != CUDA_SUCCESS) return st;
  if (CUresult st = end(p.dst_copy, &m->dstMemoryType, &m->dstDevice, &dst_host); st != CUDA_SUCCESS) return st;
  m->srcHost = src_host;
  m->dstHost = const_cast<void*>(dst_host);  // CUDA_MEMCPY3D's own constness
  m->srcXInBytes = p.src.x_bytes;
  m->srcY = p.src.y;
  m->srcZ = p.src.z;
  m->srcPitch = p.src.pitch;
  m->srcHeight = p.src.height;
  m->dstXInBytes = p.dst_copy.x_bytes;
  m->dstY = p.dst_copy.y;
  m->dstZ = p.dst_copy.z;
  m->dstPitch = p.dst_copy.pitch;
  m->dstHeight = p.dst_copy.height;
  m->WidthInBytes = p.width_bytes;
  m->Height = p.copy_height;
  m->Depth = p.depth;
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ memory allocation nodes

// An allocation node's pool properties and access descriptors as they follow
// GraphNodeParams: MemAllocNode, then MemAccess [access_count], at most
// kMaxDevices of them. `loc(location, &type, &id)` numbers a location's
// device for the wire and answers a CUresult. The size and the address
// travel in GraphNodeParams (width, dst), each side's to fill.
template <class Loc>
CUresult mem_alloc_to_wire(const CUDA_MEM_ALLOC_NODE_PARAMS& a, Loc&& loc, std::vector<std::byte>* out) {
  proto::MemAllocNode m{};
  m.prop.type = static_cast<proto::u32>(a.poolProps.allocType);
  m.prop.handle_types = static_cast<proto::u32>(a.poolProps.handleTypes);
  m.prop.usage = a.poolProps.usage;
  if (CUresult st = loc(a.poolProps.location, &m.prop.loc_type, &m.prop.loc_id); st != CUDA_SUCCESS) return st;
  m.max_size = a.poolProps.maxSize;
  m.access_count = static_cast<proto::u32>(a.accessDescCount < proto::kMaxDevices ? a.accessDescCount
                                                                                  : proto::kMaxDevices);
  out->assign(sizeof m + m.access_count * sizeof(proto::MemAccess), std::byte{0});
  std::memcpy(out->data(), &m, sizeof m);
  for (std::uint32_t i = 0; i < m.access_count; ++i) {
    proto::MemAccess x{};
    x.flags = static_cast<proto::u32>(a.accessDescs[i].flags);
    if (CUresult st = loc(a.accessDescs[i].location, &x.loc_type, &x.loc_id); st != CUDA_SUCCESS) return st;
    std::memcpy(out->data() + sizeof m + i * sizeof x, &x, sizeof x);
  }
  return CUDA_SUCCESS;
}

// The reverse, into `a` and descs [m.access_count]; `access` holds the
// MemAccess entries (the caller has checked that there are access_count).
// `as_enum(v, &e)` turns a wire number into an enum or answers false
// (CUDA_ERROR_INVALID_VALUE); `loc(type, id, &location)` answers a CUresult.
template <class AsEnum, class Loc>
CUresult mem_alloc_from_wire(const proto::MemAllocNode& m, std::span<const std::byte> access, AsEnum&& as_enum,
                             Loc&& loc, CUDA_MEM_ALLOC_NODE_PARAMS* a, CUmemAccessDesc* descs) {
  *a = CUDA_MEM_ALLOC_NODE_PARAMS{};
  if (!as_enum(m.prop.type, &a->poolProps.allocType) || !as_enum(m.prop.handle_types, &a->poolProps.handleTypes))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = loc(m.prop.loc_type, m.prop.loc_id, &a->poolProps.location); st != CUDA_SUCCESS) return st;
  a->poolProps.maxSize = m.max_size;
  a->poolProps.usage = m.prop.usage;
  for (std::uint32_t i = 0; i < m.access_count; ++i) {
    proto::MemAccess x;
    std::memcpy(&x, access.data() + i * sizeof x, sizeof x);
    descs[i] = CUmemAccessDesc{};
    if (!as_enum(x.flags, &descs[i].flags)) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult st = loc(x.loc_type, x.loc_id, &descs[i].location); st != CUDA_SUCCESS) return st;
  }
  a->accessDescs = m.access_count != 0 ? descs : nullptr;
  a->accessDescCount = m.access_count;
  return CUDA_SUCCESS;
}

}  // namespace ivcuda::codec
