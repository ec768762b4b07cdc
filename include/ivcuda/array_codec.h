// CUDA arrays' descriptors and texture objects' descriptors between CUDA's
// structs and their wire form (proto.h's ArrayDesc, RepArrayQuery, ResDesc,
// TexDesc, ViewDesc), written once for guest/arrays.cc and
// host-daemon/worker/arrays.cc.
//
// As in ivcuda/graph_codec.h the codec only converts. Reading the wire, each
// side says how a number becomes a CUDA enum (`as_enum(v, &e)`, false: not
// one): the guest takes the worker's word (codec::trusted_enum), the worker
// checks the guest's (wire_enum). Handles are each side's own, and so are the
// worker's checks of the memory and arrays a descriptor names.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "ivcuda/graph_codec.h"  // trusted_enum
#include "ivcuda/proto.h"

namespace ivcuda::codec {

// ------------------------------------------------------------------ array descriptors

inline proto::ArrayDesc array_desc_to_wire(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  return proto::ArrayDesc{.width = d.Width, .height = d.Height, .depth = d.Depth,
                          .format = static_cast<proto::u32>(d.Format), .channels = d.NumChannels, .flags = d.Flags,
                          .reserved = 0};
}

// A 2D descriptor is a 3D one without depth or flags.
inline proto::ArrayDesc array_desc_to_wire(const CUDA_ARRAY_DESCRIPTOR& d) {
  CUDA_ARRAY3D_DESCRIPTOR d3{};
  d3.Width = d.Width;
  d3.Height = d.Height;
  d3.Format = d.Format;
  d3.NumChannels = d.NumChannels;
  return array_desc_to_wire(d3);
}

template <class AsEnum>
bool array_desc_from_wire(const proto::ArrayDesc& w, CUDA_ARRAY3D_DESCRIPTOR* d, AsEnum&& as_enum) {
  *d = CUDA_ARRAY3D_DESCRIPTOR{.Width = w.width, .Height = w.height, .Depth = w.depth, .Format = {},
                               .NumChannels = w.channels, .Flags = w.flags};
  return as_enum(w.format, &d->Format);
}

template <class AsEnum>
bool array_desc_from_wire(const proto::ArrayDesc& w, CUDA_ARRAY_DESCRIPTOR* d, AsEnum&& as_enum) {
  CUDA_ARRAY3D_DESCRIPTOR d3;
  const bool ok = array_desc_from_wire(w, &d3, as_enum);
  *d = CUDA_ARRAY_DESCRIPTOR{};
  d->Width = d3.Width;
  d->Height = d3.Height;
  d->Format = d3.Format;
  d->NumChannels = d3.NumChannels;
  return ok;
}

// A sparse-properties query's reply (its descriptor and sizes zero).
inline proto::RepArrayQuery sparse_to_wire(const CUDA_ARRAY_SPARSE_PROPERTIES& p) {
  return proto::RepArrayQuery{.desc = {}, .size = 0, .alignment = 0, .tile_width = p.tileExtent.width,
                              .tile_height = p.tileExtent.height, .tile_depth = p.tileExtent.depth,
                              .miptail_first_level = p.miptailFirstLevel, .miptail_size = p.miptailSize,
                              .sparse_flags = p.flags, .reserved = 0};
}

inline CUDA_ARRAY_SPARSE_PROPERTIES sparse_from_wire(const proto::RepArrayQuery& w) {
  return CUDA_ARRAY_SPARSE_PROPERTIES{
      .tileExtent = {.width = w.tile_width, .height = w.tile_height, .depth = w.tile_depth},
      .miptailFirstLevel = w.miptail_first_level, .miptailSize = w.miptail_size, .flags = w.sparse_flags,
      .reserved = {}};
}

// ------------------------------------------------------------------ texture and surface objects

// A resource descriptor; `handle` stands for an array or mipmapped array (the
// host handle the guest holds: never the driver's). False for a type that
// has no wire form.
inline bool resource_to_wire(const CUDA_RESOURCE_DESC& d, std::uint64_t handle, proto::ResDesc* w) {
  *w = proto::ResDesc{};
  w->type = static_cast<proto::u32>(d.resType);
  w->flags = d.flags;
  switch (d.resType) {
    case CU_RESOURCE_TYPE_ARRAY:
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
      w->handle = handle;
      return true;
    case CU_RESOURCE_TYPE_LINEAR:
      w->dptr = d.res.linear.devPtr;
      w->format = static_cast<proto::u32>(d.res.linear.format);
      w->channels = d.res.linear.numChannels;
      w->size_bytes = d.res.linear.sizeInBytes;
      return true;
    case CU_RESOURCE_TYPE_PITCH2D:
      w->dptr = d.res.pitch2D.devPtr;
      w->format = static_cast<proto::u32>(d.res.pitch2D.format);
      w->channels = d.res.pitch2D.numChannels;
      w->width = d.res.pitch2D.width;
      w->height = d.res.pitch2D.height;
      w->pitch = d.res.pitch2D.pitchInBytes;
      return true;
    default:
      return false;
  }
}

// The reverse. `array(w, d)` fills an array's or mipmapped array's handle in
// the caller's terms and answers a CUresult; memory is taken as it is (the
// worker has checked it first). CUDA_ERROR_INVALID_VALUE for a type or
// format that is no enum of CUDA's.
template <class AsEnum, class Array>
CUresult resource_from_wire(const proto::ResDesc& w, CUDA_RESOURCE_DESC* d, AsEnum&& as_enum, Array&& array) {
  *d = CUDA_RESOURCE_DESC{};
  if (!as_enum(w.type, &d->resType)) return CUDA_ERROR_INVALID_VALUE;
  d->flags = w.flags;
  switch (d->resType) {
    case CU_RESOURCE_TYPE_ARRAY:
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
      return array(w, d);
    case CU_RESOURCE_TYPE_LINEAR:
      d->res.linear.devPtr = w.dptr;
      d->res.linear.numChannels = w.channels;
      d->res.linear.sizeInBytes = w.size_bytes;
      return as_enum(w.format, &d->res.linear.format) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    case CU_RESOURCE_TYPE_PITCH2D:
      d->res.pitch2D.devPtr = w.dptr;
      d->res.pitch2D.numChannels = w.channels;
      d->res.pitch2D.width = w.width;
      d->res.pitch2D.height = w.height;
      d->res.pitch2D.pitchInBytes = w.pitch;
      return as_enum(w.format, &d->res.pitch2D.format) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

inline proto::TexDesc texture_desc_to_wire(const CUDA_TEXTURE_DESC& t) {
  proto::TexDesc w{};
  for (int i = 0; i < 3; ++i) w.address[i] = static_cast<proto::u32>(t.addressMode[i]);
  w.filter = static_cast<proto::u32>(t.filterMode);
  w.flags = t.flags;
  w.max_anisotropy = t.maxAnisotropy;
  w.mipmap_filter = static_cast<proto::u32>(t.mipmapFilterMode);
  w.mipmap_bias = t.mipmapLevelBias;
  w.min_mipmap_clamp = t.minMipmapLevelClamp;
  w.max_mipmap_clamp = t.maxMipmapLevelClamp;
  for (int i = 0; i < 4; ++i) w.border[i] = t.borderColor[i];
  return w;
}

template <class AsEnum>
bool texture_desc_from_wire(const proto::TexDesc& w, CUDA_TEXTURE_DESC* t, AsEnum&& as_enum) {
  *t = CUDA_TEXTURE_DESC{};
  for (int i = 0; i < 3; ++i)
    if (!as_enum(w.address[i], &t->addressMode[i])) return false;
  if (!as_enum(w.filter, &t->filterMode) || !as_enum(w.mipmap_filter, &t->mipmapFilterMode)) return false;
  t->flags = w.flags;
  t->maxAnisotropy = w.max_anisotropy;
  t->mipmapLevelBias = w.mipmap_bias;
  t->minMipmapLevelClamp = w.min_mipmap_clamp;
  t->maxMipmapLevelClamp = w.max_mipmap_clamp;
  for (int i = 0; i < 4; ++i) t->borderColor[i] = w.border[i];
  return true;
}

inline proto::ViewDesc view_desc_to_wire(const CUDA_RESOURCE_VIEW_DESC& v) {
  return proto::ViewDesc{.format = static_cast<proto::u32>(v.format), .reserved = 0, .width = v.width,
                         .height = v.height, .depth = v.depth, .first_level = v.firstMipmapLevel,
                         .last_level = v.lastMipmapLevel, .first_layer = v.firstLayer, .last_layer = v.lastLayer};
}

template <class AsEnum>
bool view_desc_from_wire(const proto::ViewDesc& w, CUDA_RESOURCE_VIEW_DESC* v, AsEnum&& as_enum) {
  *v = CUDA_RESOURCE_VIEW_DESC{.format = {}, .width = w.width, .height = w.height, .depth = w.depth,
                               .firstMipmapLevel = w.first_level, .lastMipmapLevel = w.last_level,
                               .firstLayer = w.first_layer, .lastLayer = w.last_layer, .reserved = {}};
  return as_enum(w.format, &v->format);
}

}  // namespace ivcuda::codec
