// Kernel launches (plain, cooperative, with attributes), occupancy and tensor
// maps: parameters are laid out from the function's own description, never
// from the guest's word. The guest side is guest/launch.cc.
#include <cstring>

#include "host-daemon/worker/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

CUresult Worker::on_Launch(Call& c) { return launch(c, false); }

CUresult Worker::on_LaunchCooperative(Call& c) { return launch(c, true); }

CUresult Worker::launch(Call& c, bool cooperative) {
  return launch_with(c.req<ReqLaunch>(), c.tail<ReqLaunch>(), {}, cooperative);
}

CUresult Worker::on_LaunchEx(Call& c) {
  const auto r = c.req<ReqLaunchEx>();
  const auto tail = c.tail<ReqLaunchEx>();
  if (r.attr_count > kMaxLaunchAttrs || tail.size() < r.attr_count * sizeof(LaunchAttr))
    return CUDA_ERROR_INVALID_VALUE;
  CUlaunchAttribute attrs[kMaxLaunchAttrs] = {};
  for (std::uint32_t i = 0; i < r.attr_count; ++i) {
    LaunchAttr a;
    std::memcpy(&a, tail.data() + i * sizeof(LaunchAttr), sizeof a);
    CUlaunchAttribute& out = attrs[i];
    if (!wire_enum(a.id, &out.id)) return CUDA_ERROR_INVALID_VALUE;
    // Only attributes whose values are plain numbers: anything naming an
    // object (events, access-policy windows) would need translating.
    switch (a.id) {
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
        out.value.clusterDim.x = a.value[0];
        out.value.clusterDim.y = a.value[1];
        out.value.clusterDim.z = a.value[2];
        break;
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        if (!wire_enum(a.value[0], &out.value.clusterSchedulingPolicyPreference)) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE: out.value.cooperative = static_cast<int>(a.value[0]); break;
      case CU_LAUNCH_ATTRIBUTE_PRIORITY: out.value.priority = static_cast<int>(a.value[0]); break;
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
        out.value.programmaticStreamSerializationAllowed = static_cast<int>(a.value[0]);
        break;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
        if (!wire_enum(a.value[0], &out.value.memSyncDomain)) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
        out.value.memSyncDomainMap.default_ = static_cast<unsigned char>(a.value[0]);
        out.value.memSyncDomainMap.remote = static_cast<unsigned char>(a.value[1]);
        break;
      case CU_LAUNCH_ATTRIBUTE_IGNORE: break;
      default: return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  return launch_with(r.launch, tail.subspan(r.attr_count * sizeof(LaunchAttr)),
                     std::span<const CUlaunchAttribute>(attrs, r.attr_count), false);
}

CUresult Worker::launch_with(const ReqLaunch& r, std::span<const std::byte> params,
                             std::span<const CUlaunchAttribute> attrs, bool cooperative) {
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (r.param_bytes != f->param_bytes || params.size() != f->param_bytes) return CUDA_ERROR_INVALID_VALUE;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  // Offsets were bounded by param_bytes when the function was looked up, and
  // the list holds every parameter the driver will read.
  constexpr std::size_t kOnStack = 64;
  void* on_stack[kOnStack];
  std::vector<void*> on_heap;
  void** argv = on_stack;
  if (f->params.size() > kOnStack) {
    on_heap.resize(f->params.size());
    argv = on_heap.data();
  }
  for (std::size_t i = 0; i < f->params.size(); ++i)
    argv[i] = const_cast<std::byte*>(params.data()) + f->params[i].offset;
  void** args = f->params.empty() ? nullptr : argv;
  if (!attrs.empty()) {
    CUlaunchConfig cfg{};
    cfg.gridDimX = r.grid[0];
    cfg.gridDimY = r.grid[1];
    cfg.gridDimZ = r.grid[2];
    cfg.blockDimX = r.block[0];
    cfg.blockDimY = r.block[1];
    cfg.blockDimZ = r.block[2];
    cfg.sharedMemBytes = r.shared_bytes;
    cfg.hStream = s;
    cfg.attrs = const_cast<CUlaunchAttribute*>(attrs.data());
    cfg.numAttrs = static_cast<unsigned>(attrs.size());
    return cu_.cuLaunchKernelEx(&cfg, f->real, args, nullptr);
  }
  if (cooperative)
    return cu_.cuLaunchCooperativeKernel(f->real, r.grid[0], r.grid[1], r.grid[2], r.block[0], r.block[1],
                                         r.block[2], r.shared_bytes, s, args);
  return cu_.cuLaunchKernel(f->real, r.grid[0], r.grid[1], r.grid[2], r.block[0], r.block[1], r.block[2],
                            r.shared_bytes, s, args, nullptr);
}

CUresult Worker::on_Occupancy(Call& c) {
  const auto r = c.req<ReqOccupancy>();
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(modules_.find(f->module)->ctx); st != CUDA_SUCCESS) return st;
  RepValue rep{};
  CUresult st;
  if (r.kind == kOccMaxActiveBlocks) {
    int n = 0;
    st = cu_.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&n, f->real, r.block_size, r.dynamic_smem, r.flags);
    rep.value = n;
  } else if (r.kind == kOccAvailableDynamicSmem) {
    size_t bytes = 0;
    st = cu_.cuOccupancyAvailableDynamicSMemPerBlock(&bytes, f->real, r.num_blocks, r.block_size);
    rep.value = static_cast<std::int64_t>(bytes);
  } else if (r.kind == kOccMaxPotentialBlockSize) {
    // The guest runs a per-block-size shared-memory callback itself; without
    // one the driver's own search answers.
    int grid = 0, block = 0;
    st = cu_.cuOccupancyMaxPotentialBlockSizeWithFlags(&grid, &block, f->real, nullptr, r.dynamic_smem,
                                                       r.block_size, r.flags);
    rep.value = static_cast<std::int64_t>((static_cast<std::uint64_t>(static_cast<std::uint32_t>(grid)) << 32) |
                                          static_cast<std::uint32_t>(block));
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  c.set_reply(rep);
  return st;
}

namespace {

// A cluster question's launch configuration, from the guest's unpacked one
// into `attrs` (two at most: the cluster's shape and its scheduling policy).
bool cluster_config(const ReqOccCluster& r, CUstream s, CUlaunchAttribute (&attrs)[2], CUlaunchConfig* cfg) {
  *cfg = CUlaunchConfig{};
  cfg->gridDimX = r.grid[0];
  cfg->gridDimY = r.grid[1];
  cfg->gridDimZ = r.grid[2];
  cfg->blockDimX = r.block[0];
  cfg->blockDimY = r.block[1];
  cfg->blockDimZ = r.block[2];
  cfg->sharedMemBytes = r.shared_bytes;
  cfg->hStream = s;
  cfg->attrs = attrs;
  if (r.cluster[0] != 0 || r.cluster[1] != 0 || r.cluster[2] != 0) {
    attrs[cfg->numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[cfg->numAttrs].value.clusterDim.x = r.cluster[0];
    attrs[cfg->numAttrs].value.clusterDim.y = r.cluster[1];
    attrs[cfg->numAttrs].value.clusterDim.z = r.cluster[2];
    ++cfg->numAttrs;
  }
  if (r.policy != 0) {
    attrs[cfg->numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    if (!wire_enum(r.policy, &attrs[cfg->numAttrs].value.clusterSchedulingPolicyPreference)) return false;
    ++cfg->numAttrs;
  }
  return true;
}

}  // namespace

// cuOccupancyMaxActiveClusters (max_size false) or
// cuOccupancyMaxPotentialClusterSize (true), asked of the function's own context.
CUresult Worker::on_OccupancyCluster_ask(Call& c, bool max_size) {
  const auto r = c.req<ReqOccCluster>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  CUlaunchAttribute attrs[2]{};
  CUlaunchConfig cfg;
  if (!cluster_config(r, s, attrs, &cfg)) return CUDA_ERROR_INVALID_VALUE;
  int n = 0;
  const CUresult st = max_size ? cu_.cuOccupancyMaxPotentialClusterSize(&n, f->real, &cfg)
                               : cu_.cuOccupancyMaxActiveClusters(&n, f->real, &cfg);
  c.set_reply(RepValue{n});
  return st;
}

CUresult Worker::on_OccupancyCluster(Call& c) { return on_OccupancyCluster_ask(c, false); }

CUresult Worker::on_OccupancyClusterSize(Call& c) { return on_OccupancyCluster_ask(c, true); }

namespace {

// What every tensor map descriptor names, each enum through its range.
struct TensorEnums {
  CUtensorMapDataType type;
  CUtensorMapInterleave interleave;
  CUtensorMapSwizzle swizzle;
  CUtensorMapL2promotion l2;
  CUtensorMapFloatOOBfill fill;
};
template <class Req>
bool tensor_enums(const Req& r, TensorEnums* e) {
  return wire_enum(r.data_type, &e->type) && wire_enum(r.interleave, &e->interleave) &&
         wire_enum(r.swizzle, &e->swizzle) && wire_enum(r.l2_promotion, &e->l2) && wire_enum(r.oob_fill, &e->fill);
}

// The descriptor the driver wrote, back to the guest.
template <class Call>
CUresult reply_map(Call& c, const CUtensorMap& map) {
  RepTensorMap rep{};
  static_assert(sizeof map == sizeof rep);
  std::memcpy(&rep, &map, sizeof rep);
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Worker::on_TensorMapEncodeTiled(Call& c) {
  const auto r = c.req<ReqTensorMap>();
  if (r.ctx != 0)
    if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  // The descriptor is plain data the guest gets back: the driver validates
  // the layout; only the array bounds are ours to check.
  if (r.rank == 0 || r.rank > kTensorMaxRank) return CUDA_ERROR_INVALID_VALUE;
  TensorEnums e;
  if (!tensor_enums(r, &e)) return CUDA_ERROR_INVALID_VALUE;
  CUtensorMap map{};
  const CUresult st = cu_.cuTensorMapEncodeTiled(&map, e.type, r.rank, reinterpret_cast<void*>(r.global_address),
                                                 r.global_dim, r.global_strides, r.box_dim, r.element_strides,
                                                 e.interleave, e.swizzle, e.l2, e.fill);
  return st != CUDA_SUCCESS ? st : reply_map(c, map);
}

// cuTensorMapEncodeIm2col and its wide form. As for a tiled descriptor, the
// driver validates the layout; the arrays' bounds are ours, and only the
// rank's worth of each is given to it.
CUresult Worker::on_TensorMapEncodeIm2col(Call& c) {
  const auto r = c.req<ReqTensorMapIm2col>();
  if (r.ctx != 0)
    if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.rank < 3 || r.rank > kTensorMaxRank || r.wide > 1) return CUDA_ERROR_INVALID_VALUE;
  TensorEnums e;
  CUtensorMapIm2ColWideMode mode;
  if (!tensor_enums(r, &e) || !wire_enum(r.mode, &mode)) return CUDA_ERROR_INVALID_VALUE;
  CUtensorMap map{};
  void* addr = reinterpret_cast<void*>(r.global_address);
  const CUresult st =
      r.wide != 0 ? cu_.cuTensorMapEncodeIm2colWide(&map, e.type, r.rank, addr, r.global_dim, r.global_strides,
                                                     r.lower_width, r.upper_width, r.channels_per_pixel,
                                                     r.pixels_per_column, r.element_strides, e.interleave, mode,
                                                     e.swizzle, e.l2, e.fill)
                  : cu_.cuTensorMapEncodeIm2col(&map, e.type, r.rank, addr, r.global_dim, r.global_strides,
                                                r.lower_corner, r.upper_corner, r.channels_per_pixel,
                                                r.pixels_per_column, r.element_strides, e.interleave, e.swizzle,
                                                e.l2, e.fill);
  return st != CUDA_SUCCESS ? st : reply_map(c, map);
}

// The guest's descriptor is plain data the driver rewrites; whatever it holds
// describes memory only to the GPU, in the guest's own context.
CUresult Worker::on_TensorMapReplaceAddress(Call& c) {
  const auto r = c.req<ReqTensorMapReplace>();
  if (r.ctx != 0)
    if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUtensorMap map{};
  static_assert(sizeof map == sizeof r.words);
  std::memcpy(&map, r.words, sizeof map);
  const CUresult st = cu_.cuTensorMapReplaceAddress(&map, reinterpret_cast<void*>(r.global_address));
  return st != CUDA_SUCCESS ? st : reply_map(c, map);
}

}  // namespace ivcuda::host
