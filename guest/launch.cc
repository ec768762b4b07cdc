// Kernel launches (cuLaunchKernel, cooperative launches, cuLaunchKernelEx's
// attributes go through guest/library.cc's cuLaunchKernelEx), occupancy
// queries and tensor maps. Parameters are packed here from the function's
// own description (FuncInfo); the host lays them out again from its own
// (host-daemon/worker/launch.cc).
//
// This file sees cuda.h without its renaming macros, so every ABI
// generation is defined under its exact exported name.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/managed.h"
#include "guest/runtime.h"
#include "guest/family.h"

using ivcuda::guest::kernel_function;

// ==================================================================== launches

CUresult ivcuda::guest::pack_kernel_params(const FuncInfo& info, void** params, void** extra,
                                           std::byte* buf) noexcept {
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr) {
    // kernelParams carries no sizes: pack by the layout the host learned.
    for (std::size_t i = 0; i < info.params.size(); ++i) {
      if (params[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      std::memcpy(buf + info.params[i].offset, params[i], info.params[i].size);
    }
    return CUDA_SUCCESS;
  }
  if (extra == nullptr) return info.params.empty() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  const void* p = nullptr;
  const std::size_t* n = nullptr;
  for (std::size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
      p = extra[i + 1];
    else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
      n = static_cast<const std::size_t*>(extra[i + 1]);
    else
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (p == nullptr || n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The driver's answers (tests/gpu_double checks them against it): a
  // longer buffer is refused this way; a shorter one is taken - NCCL passes
  // only the used part of its 4 KiB argument struct. The driver then reads
  // past it; here the rest stays zero.
  if (*n > info.param_bytes) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  std::memcpy(buf, p, *n);
  return CUDA_SUCCESS;
}

CUresult ivcuda::guest::launch_kernel(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
                                      CUstream s, void** params, void** extra, bool cooperative,
                                      std::span<const proto::LaunchAttr> attrs) noexcept {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    if (attrs.size() > proto::kMaxLaunchAttrs) return CUDA_ERROR_INVALID_VALUE;
    f = kernel_function(f);
    // Managed memory the CPU holds goes to the GPU first (guest/managed.cc).
    if (CUresult st = ivcuda::guest::managed::before_launch(rt, h(s)); st != CUDA_SUCCESS) return st;
    // The record's tail: the attributes (LaunchEx only), then the packed
    // parameters. Small tails (nearly all launches) stay on the stack.
    const std::size_t attr_bytes = attrs.size_bytes();
    std::byte small[1024];
    std::vector<std::byte> large;
    std::span<std::byte> tail;
    bool polls_host = false;
    {
      std::lock_guard lk(rt->books_mu);
      auto it = rt->funcs.find(h(f));
      if (it == rt->funcs.end()) return CUDA_ERROR_INVALID_HANDLE;
      const auto& info = it->second;
      if (attr_bytes + info.param_bytes <= sizeof small) {
        tail = std::span<std::byte>(small, attr_bytes + info.param_bytes);
      } else {
        large.resize(attr_bytes + info.param_bytes);
        tail = large;
      }
      std::memset(tail.data(), 0, tail.size());
      if (attr_bytes != 0) std::memcpy(tail.data(), attrs.data(), attr_bytes);
      std::byte* buf = tail.data() + attr_bytes;
      if (const CUresult st = ivcuda::guest::pack_kernel_params(info, params, extra, buf); st != CUDA_SUCCESS)
        return st;
      polls_host = rt->any_page_locked_word(std::span<const std::byte>(buf, info.param_bytes));
    }
    for (int i = 0; i < 3; ++i)
      if (grid[i] == 0 || block[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqLaunch r{};
    r.ctx = ctx;
    r.function = h(f);
    r.stream = h(s);
    std::memcpy(r.grid, grid, sizeof r.grid);
    std::memcpy(r.block, block, sizeof r.block);
    r.shared_bytes = shmem;
    r.param_bytes = static_cast<std::uint32_t>(tail.size() - attr_bytes);
    // A kernel that reads page-locked memory may wait there for a store by
    // the CPU: until it is over, posted work reaches the GPU before calls
    // return (guest/host_polls.cc).
    if (!attrs.empty()) {
      proto::ReqLaunchEx x{};
      x.launch = r;
      x.attr_count = static_cast<std::uint32_t>(attrs.size());
      return polls_host ? rt->post_host_polled<Op::kLaunchEx>(ctx, h(s), x, tail) : rt->post<Op::kLaunchEx>(x, tail);
    }
    if (cooperative)
      return polls_host ? rt->post_host_polled<Op::kLaunchCooperative>(ctx, h(s), r, tail)
                        : rt->post<Op::kLaunchCooperative>(r, tail);
    return polls_host ? rt->post_host_polled<Op::kLaunch>(ctx, h(s), r, tail) : rt->post<Op::kLaunch>(r, tail);
  });
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                           unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                           CUstream s, void** params) {
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  return ivcuda::guest::launch_kernel(f, grid, block, shmem, s, params, nullptr, true);
}
CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                                CUstream s, void** params) {
  return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, ptsz(s), params);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void** params,
                        void** extra) {
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  return ivcuda::guest::launch_kernel(f, grid, block, shmem, s, params, extra, false);
}

// ==================================================================== occupancy

namespace {

// cuOccupancyMaxActiveClusters and cuOccupancyMaxPotentialClusterSize ask the
// host's driver about the same launch configuration.
template <Op op>
CUresult cluster_question(int* out, CUfunction f, const CUlaunchConfig* cfg) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (out == nullptr || cfg == nullptr || (cfg->numAttrs != 0 && cfg->attrs == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, cfg->hStream)) return CUDA_ERROR_INVALID_HANDLE;
    proto::ReqOccCluster r{};
    r.ctx = ctx;
    r.function = h(f);
    r.stream = h(cfg->hStream);
    r.grid[0] = cfg->gridDimX;
    r.grid[1] = cfg->gridDimY;
    r.grid[2] = cfg->gridDimZ;
    r.block[0] = cfg->blockDimX;
    r.block[1] = cfg->blockDimY;
    r.block[2] = cfg->blockDimZ;
    r.shared_bytes = cfg->sharedMemBytes;
    // Only the attributes that shape a cluster matter to these questions.
    for (unsigned i = 0; i < cfg->numAttrs; ++i) {
      const CUlaunchAttribute& a = cfg->attrs[i];
      if (a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
        r.cluster[0] = a.value.clusterDim.x;
        r.cluster[1] = a.value.clusterDim.y;
        r.cluster[2] = a.value.clusterDim.z;
      } else if (a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE) {
        r.policy = static_cast<proto::u32>(a.value.clusterSchedulingPolicyPreference);
      }
    }
    proto::RepValue rep{};
    const CUresult st = rt->call<op>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *out = static_cast<int>(rep.value);
    return st;
  });
}

}  // namespace

CUresult CUDAAPI cuOccupancyMaxActiveClusters(int* clusters, CUfunction f, const CUlaunchConfig* cfg) {
  return cluster_question<Op::kOccupancyCluster>(clusters, f, cfg);
}

CUresult CUDAAPI cuOccupancyMaxPotentialClusterSize(int* size, CUfunction f, const CUlaunchConfig* cfg) {
  return cluster_question<Op::kOccupancyClusterSize>(size, f, cfg);
}

// Without a callback the host's driver searches. With one, the callback
// must run here, so the search runs here too: from the largest block size
// down in warp steps, keep the size whose resident threads per
// multiprocessor are highest, stopping early at full occupancy.
CUresult CUDAAPI cuOccupancyMaxPotentialBlockSizeWithFlags(int* min_grid, int* block_size, CUfunction f,
                                                           CUoccupancyB2DSize smem_of, size_t smem, int limit,
                                                           unsigned int flags) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (min_grid == nullptr || block_size == nullptr || limit < 0) return CUDA_ERROR_INVALID_VALUE;
    if (smem_of == nullptr) {
      proto::ReqOccupancy r{};
      r.ctx = ctx;
      r.function = h(f);
      r.dynamic_smem = smem;
      r.block_size = limit;
      r.flags = flags;
      r.kind = proto::kOccMaxPotentialBlockSize;
      proto::RepValue rep{};
      const CUresult st = rt->call<Op::kOccupancy>(r, {}, &rep);
      if (st != CUDA_SUCCESS) return st;
      const auto v = static_cast<std::uint64_t>(rep.value);
      *min_grid = static_cast<int>(static_cast<std::uint32_t>(v >> 32));
      *block_size = static_cast<int>(static_cast<std::uint32_t>(v));
      return CUDA_SUCCESS;
    }
    CUdevice dev = 0;
    CUresult st = cuCtxGetDevice(&dev);
    if (st != CUDA_SUCCESS) return st;
    int sm_threads = 0, warp = 0, sms = 0, dev_block = 0, fn_block = 0;
    if ((st = cuDeviceGetAttribute(&sm_threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev)) ||
        (st = cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev)) ||
        (st = cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)) ||
        (st = cuDeviceGetAttribute(&dev_block, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev)) ||
        (st = cuFuncGetAttribute(&fn_block, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f)))
      return st;
    if (warp <= 0) return CUDA_ERROR_INVALID_VALUE;
    int cap = std::min(dev_block, fn_block);
    if (limit > 0) cap = std::min(cap, limit);
    int best_block = 0, best_blocks = 0, best_threads = 0;
    const int top = (cap + warp - 1) / warp * warp;
    for (int aligned = top; aligned > 0; aligned -= warp) {
      const int b = std::min(cap, aligned);
      int blocks = 0;
      st = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, b, smem_of(b), flags);
      if (st != CUDA_SUCCESS) return st;
      if (blocks * b > best_threads) {
        best_threads = blocks * b;
        best_block = b;
        best_blocks = blocks;
      }
      if (best_threads == sm_threads) break;
    }
    *min_grid = best_blocks * sms;
    *block_size = best_block;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block_size, CUfunction f,
                                                  CUoccupancyB2DSize smem_of, size_t smem, int limit) {
  return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, f, smem_of, smem, limit, 0);
}

// ==================================================================== tensor maps

CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* addr,
                                        const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                        const cuuint32_t* elem_strides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill oob) {
  return guard([&] {
    NEED_RT();
    if (map == nullptr || rank == 0 || rank > proto::kTensorMaxRank || dims == nullptr || box == nullptr ||
        elem_strides == nullptr || (rank > 1 && strides == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    proto::ReqTensorMap r{};
    r.ctx = current_ctx();
    r.global_address = h(addr);
    std::memcpy(r.global_dim, dims, rank * sizeof *dims);
    if (rank > 1) std::memcpy(r.global_strides, strides, (rank - 1) * sizeof *strides);
    std::memcpy(r.box_dim, box, rank * sizeof *box);
    std::memcpy(r.element_strides, elem_strides, rank * sizeof *elem_strides);
    r.data_type = static_cast<proto::u32>(type);
    r.rank = rank;
    r.interleave = static_cast<proto::u32>(interleave);
    r.swizzle = static_cast<proto::u32>(swizzle);
    r.l2_promotion = static_cast<proto::u32>(l2);
    r.oob_fill = static_cast<proto::u32>(oob);
    proto::RepTensorMap rep{};
    const CUresult st = rt->call<Op::kTensorMapEncodeTiled>(r, {}, &rep);
    if (st == CUDA_SUCCESS) std::memcpy(map, &rep, sizeof rep);
    return st;
  });
}

namespace {

// cuTensorMapEncodeIm2col and its wide form: the descriptor is the host
// driver's to write; what the guest checks is only what it copies.
CUresult encode_im2col(CUtensorMap* map, proto::ReqTensorMapIm2col& r, const cuuint64_t* dims,
                       const cuuint64_t* strides, const cuuint32_t* elem_strides) {
  return guard([&] {
    NEED_RT();
    // Im2col descriptors have 3 to 5 dimensions (a batch, pixels, channels).
    if (map == nullptr || r.rank < 3 || r.rank > proto::kTensorMaxRank || dims == nullptr || strides == nullptr ||
        elem_strides == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    r.ctx = current_ctx();
    std::memcpy(r.global_dim, dims, r.rank * sizeof *dims);
    std::memcpy(r.global_strides, strides, (r.rank - 1) * sizeof *strides);
    std::memcpy(r.element_strides, elem_strides, r.rank * sizeof *elem_strides);
    proto::RepTensorMap rep{};
    const CUresult st = rt->call<Op::kTensorMapEncodeIm2col>(r, {}, &rep);
    if (st == CUDA_SUCCESS) std::memcpy(map, &rep, sizeof rep);
    return st;
  });
}

// What both im2col forms say alike.
proto::ReqTensorMapIm2col im2col_request(CUtensorMapDataType type, cuuint32_t rank, void* addr,
                                         cuuint32_t channels_per_pixel, cuuint32_t pixels_per_column,
                                         CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                         CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  proto::ReqTensorMapIm2col r{};
  r.global_address = h(addr);
  r.channels_per_pixel = channels_per_pixel;
  r.pixels_per_column = pixels_per_column;
  r.data_type = static_cast<proto::u32>(type);
  r.rank = rank;
  r.interleave = static_cast<proto::u32>(interleave);
  r.swizzle = static_cast<proto::u32>(swizzle);
  r.l2_promotion = static_cast<proto::u32>(l2);
  r.oob_fill = static_cast<proto::u32>(oob);
  return r;
}

}  // namespace

CUresult CUDAAPI cuTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* addr,
                                         const cuuint64_t* dims, const cuuint64_t* strides, const int* lower,
                                         const int* upper, cuuint32_t channels_per_pixel,
                                         cuuint32_t pixels_per_column, const cuuint32_t* elem_strides,
                                         CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                         CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  if (lower == nullptr || upper == nullptr || rank < 3 || rank > proto::kTensorMaxRank) return CUDA_ERROR_INVALID_VALUE;
  proto::ReqTensorMapIm2col r = im2col_request(type, rank, addr, channels_per_pixel, pixels_per_column, interleave,
                                                swizzle, l2, oob);
  std::memcpy(r.lower_corner, lower, (rank - 2) * sizeof *lower);
  std::memcpy(r.upper_corner, upper, (rank - 2) * sizeof *upper);
  return encode_im2col(map, r, dims, strides, elem_strides);
}

CUresult CUDAAPI cuTensorMapEncodeIm2colWide(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* addr,
                                             const cuuint64_t* dims, const cuuint64_t* strides, int lower_width,
                                             int upper_width, cuuint32_t channels_per_pixel,
                                             cuuint32_t pixels_per_column, const cuuint32_t* elem_strides,
                                             CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode,
                                             CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                             CUtensorMapFloatOOBfill oob) {
  proto::ReqTensorMapIm2col r = im2col_request(type, rank, addr, channels_per_pixel, pixels_per_column, interleave,
                                                swizzle, l2, oob);
  r.wide = 1;
  r.lower_width = lower_width;
  r.upper_width = upper_width;
  r.mode = static_cast<proto::u32>(mode);
  return encode_im2col(map, r, dims, strides, elem_strides);
}

// The descriptor's address field is laid out as the driver likes: the host's
// driver rewrites it.
CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* map, void* addr) {
  return guard([&] {
    NEED_RT();
    if (map == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqTensorMapReplace r{};
    r.ctx = current_ctx();
    r.global_address = h(addr);
    static_assert(sizeof r.words == sizeof *map);
    std::memcpy(r.words, map, sizeof r.words);
    proto::RepTensorMap rep{};
    const CUresult st = rt->call<Op::kTensorMapReplaceAddress>(r, {}, &rep);
    if (st == CUDA_SUCCESS) std::memcpy(map, &rep, sizeof rep);
    return st;
  });
}
