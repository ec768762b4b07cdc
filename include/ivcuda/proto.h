// The request/reply protocol carried in ring records (see shm_abi.h).
//
// A request record is abi::RecordHeader{len, op, flags, seq} followed by the
// op's request struct and, for some ops, trailing bytes (names, inline data,
// kernel parameters). A reply record echoes op and seq, carries the CUresult
// in `status`, and is followed by the op's reply struct (and trailing bytes).
//
// Requests flagged kRecNeedsReply get exactly one reply; the others are
// posted (asynchronous CUDA work) and their errors surface at the next call
// that waits for a reply, as CUDA reports asynchronous errors.
//
// All structs are fixed-width and standard-layout; the host reads them with
// ring::read_struct() from a private copy and validates every field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ivcuda/nvml_wire.h"

namespace ivcuda::proto {

using u8 = std::uint8_t;
using u16 = std::uint16_t;
using u32 = std::uint32_t;
using i32 = std::int32_t;
using u64 = std::uint64_t;
// NVML's queries (guest/nvml/, host-daemon/worker/nvml.cc): ivcuda/nvml_wire.h.
using ReqNvml = nvml_wire::ReqNvml;
using RepNvml = nvml_wire::RepNvml;

inline constexpr u32 kProtoVersion = 1;
inline constexpr u32 kNameMax = 16384;         // kernel / global names (cuDNN's run past 1 KiB)
inline constexpr u32 kMaxParams = 4096;        // parameters per kernel
inline constexpr u32 kMaxParamBytes = 32764;   // CUDA's limit on a kernel's parameter bytes
inline constexpr u32 kMaxDevices = 64;
inline constexpr u32 kAttrSlots = 192;         // > CU_DEVICE_ATTRIBUTE_MAX
inline constexpr u32 kDevNameBytes = 256;

// Handles the host gives the guest: tag in the top byte, generation in the
// next 24 bits, table index in the low 32. Never zero.
enum class HandleKind : u8 {
  kContext = 1, kModule = 2, kFunction = 3, kStream = 4, kEvent = 5,
  kMemPool = 6, kGraph = 7, kGraphExec = 8, kMemHandle = 9,
  kArray = 10, kMipmappedArray = 11, kGraphNode = 12, kUserObject = 13, kLink = 14,
  kGreenCtx = 15, kResourceDesc = 16,
};

// ---- the op table: one line per op: X(name, request, reply, needs_reply)
#define IVCUDA_OPS(X)                                                    \
  X(Hello, ReqHello, RepHello, 1)                                        \
  X(DeviceInfo, ReqDevice, RepDeviceInfo, 1)                             \
  X(PrimaryRetain, ReqDevice, RepHandle, 1)                              \
  X(PrimaryRelease, ReqDevice, RepNone, 1)                               \
  X(PrimaryReset, ReqDevice, RepNone, 1)                                 \
  X(PrimaryGetState, ReqDevice, RepPrimaryState, 1)                      \
  X(PrimarySetFlags, ReqDeviceFlags, RepNone, 1)                         \
  X(CtxCreate, ReqDeviceFlags, RepHandle, 1)                             \
  X(CtxDestroy, ReqHandle, RepNone, 1)                                   \
  X(CtxSynchronize, ReqCtx, RepNone, 1)                                  \
  X(MemAlloc, ReqMemAlloc, RepMemAlloc, 1)                               \
  X(MemFree, ReqPtr, RepNone, 1)                                         \
  X(MemGetInfo, ReqCtx, RepMemInfo, 1)                                   \
  X(MemGetAddressRange, ReqPtr, RepRange, 1)                             \
  X(Memset, ReqMemset, RepNone, 0)                                       \
  X(MemcpyHtoDInline, ReqCopy, RepNone, 0)                               \
  X(MemcpyHtoDArena, ReqCopy, RepNone, 0)                                \
  X(MemcpyDtoHArena, ReqCopy, RepNone, 0)                                \
  X(MemcpyDtoD, ReqCopy, RepNone, 0)                                     \
  X(Memcpy2D, ReqCopy2D, RepNone, 0)                                     \
  X(HostAlloc, ReqHostAlloc, RepHostAlloc, 1)                            \
  X(HostFree, ReqArenaOff, RepNone, 1)                                   \
  X(ModuleLoad, ReqModuleLoad, RepHandle, 1)                             \
  X(ModuleUnload, ReqHandle, RepNone, 1)                                 \
  X(ModuleGetFunction, ReqModuleName, RepFunction, 1)                    \
  X(ModuleGetGlobal, ReqModuleName, RepRange, 1)                         \
  X(FuncGetAttribute, ReqFuncAttr, RepValue, 1)                          \
  X(FuncSetAttribute, ReqFuncAttr, RepNone, 1)                           \
  X(Launch, ReqLaunch, RepNone, 0)                                       \
  X(StreamCreate, ReqStreamCreate, RepHandle, 1)                         \
  X(StreamDestroy, ReqHandle, RepNone, 1)                                \
  X(StreamQuery, ReqHandle, RepNone, 1)                                  \
  X(StreamSynchronize, ReqHandle, RepNone, 1)                            \
  X(StreamWaitEvent, ReqStreamWaitEvent, RepNone, 0)                     \
  X(StreamGetPriority, ReqHandle, RepValue, 1)                           \
  X(EventCreate, ReqEventCreate, RepHandle, 1)                           \
  X(EventRecord, ReqEventRecord, RepNone, 0)                             \
  X(EventQuery, ReqHandle, RepNone, 1)                                   \
  X(EventSynchronize, ReqHandle, RepNone, 1)                             \
  X(EventElapsedTime, ReqEventElapsed, RepElapsed, 1)                    \
  X(EventDestroy, ReqHandle, RepNone, 1)                                 \
  X(Occupancy, ReqOccupancy, RepValue, 1)                                \
  X(CtxGetLimit, ReqLimit, RepValue, 1)                                  \
  X(CtxSetLimit, ReqLimit, RepNone, 1)                                   \
  X(MemPool, ReqMemPool, RepValue, 1)                                    \
  X(MemAllocAsync, ReqMemAllocAsync, RepMemAlloc, 1)                     \
  X(MemFreeAsync, ReqFreeAsync, RepNone, 1)                              \
  X(LaunchCooperative, ReqLaunch, RepNone, 0)                            \
  X(LaunchEx, ReqLaunchEx, RepNone, 0)                                   \
  X(StreamBeginCapture, ReqCapture, RepNone, 1)                          \
  X(StreamEndCapture, ReqHandle, RepHandle, 1)                           \
  X(StreamCaptureInfo, ReqHandle, RepCaptureInfo, 1)                     \
  X(GraphCreate, ReqGraphCreate, RepHandle, 1)                           \
  X(GraphNodeCount, ReqHandle, RepValue, 1)                              \
  X(GraphInstantiate, ReqGraphCreate, RepHandle, 1)                      \
  X(GraphLaunch, ReqGraphLaunch, RepNone, 0)                             \
  X(GraphUpload, ReqGraphLaunch, RepNone, 0)                             \
  X(GraphExecDestroy, ReqHandle, RepNone, 1)                             \
  X(GraphDestroy, ReqHandle, RepNone, 1)                                 \
  X(ModuleEnumerate, ReqHandle, RepValue, 1)                             \
  X(OccupancyCluster, ReqOccCluster, RepValue, 1)                        \
  X(TensorMapEncodeTiled, ReqTensorMap, RepTensorMap, 1)                 \
  X(PeerQuery, ReqPeerQuery, RepValue, 1)                               \
  X(PeerAccess, ReqPeerAccess, RepNone, 1)                               \
  X(MemcpyPeer, ReqCopyPeer, RepNone, 0)                                 \
  X(HostFunc, ReqHostFunc, RepNone, 0)                                   \
  X(Flush, ReqCtx, RepNone, 1)                                           \
  X(Goodbye, ReqCtx, RepNone, 1)                                         \
  X(EventRecordFlags, ReqEventRecordFlags, RepNone, 1)                   \
  X(CaptureMode, ReqCaptureMode, RepNone, 0)                             \
  X(MemGranularity, ReqMemGranularity, RepValue, 1)                      \
  X(MemAddressReserve, ReqMemAddressReserve, RepRange, 1)                \
  X(MemAddressFree, ReqMemRange, RepNone, 1)                             \
  X(MemCreate, ReqMemCreate, RepHandle, 1)                               \
  X(MemRelease, ReqHandle, RepNone, 1)                                   \
  X(MemMap, ReqMemMap, RepNone, 1)                                       \
  X(MemUnmap, ReqMemRange, RepNone, 1)                                   \
  X(MemSetAccess, ReqMemSetAccess, RepNone, 1)                           \
  X(MemGetAccess, ReqMemGetAccess, RepValue, 1)                          \
  X(MemGetProperties, ReqHandle, RepMemProp, 1)                          \
  X(MemRetainHandle, ReqPtr, RepHandle, 1)                               \
  X(FuncSetCacheConfig, ReqFuncCache, RepNone, 1)                       \
  X(MemExportShareable, ReqMemExport, RepShareToken, 1)                  \
  X(MemImportShareable, ReqMemImport, RepHandle, 1)                     \
  X(ArrayCreate, ReqArrayCreate, RepHandle, 1)                           \
  X(ArrayDestroy, ReqArrayQuery, RepNone, 1)                             \
  X(ArrayQuery, ReqArrayQuery, RepArrayQuery, 1)                         \
  X(MipmapLevel, ReqMipmapLevel, RepHandle, 1)                           \
  X(Memcpy3D, ReqCopy3D, RepNone, 0)                                     \
  X(TexCreate, ReqTexCreate, RepHandle, 1)                               \
  X(TexDestroy, ReqTexObject, RepNone, 1)                                \
  X(TexQuery, ReqTexObject, RepTexInfo, 1)                               \
  X(MemPoolCreate, ReqMemPoolCreate, RepHandle, 1)                       \
  X(MemPoolSetAccess, ReqMemPoolSetAccess, RepNone, 1)                  \
  X(IpcGetMemHandle, ReqIpcGet, RepIpcHandle, 1)                         \
  X(IpcOpenMemHandle, ReqIpcOpen, RepRange, 1)                           \
  X(IpcCloseMemHandle, ReqIpcClose, RepNone, 1)                          \
  X(IpcGetEventHandle, ReqIpcGet, RepIpcHandle, 1)                       \
  X(IpcOpenEventHandle, ReqIpcOpen, RepHandle, 1)                    \
  X(GraphAddNode, ReqGraphAddNode, RepHandle, 1)                         \
  X(GraphNodeParams, ReqGraphNodeParams, GraphNodeParams, 1)             \
  X(GraphQuery, ReqGraphQuery, RepValue, 1)                              \
  X(GraphEdges, ReqGraphEdges, RepNone, 1)                               \
  X(CaptureGraphInfo, ReqHandle, RepCaptureInfo, 1)                      \
  X(CaptureToGraph, ReqCaptureToGraph, RepNone, 1)                       \
  X(CaptureUpdateDeps, ReqCaptureDeps, RepNone, 1)                       \
  X(UserObject, ReqUserObject, RepHandle, 1)                             \
  X(GraphKernelAttr, ReqGraphKernelAttr, LaunchAttr, 1)                 \
  X(StreamMemOps, ReqStreamMemOps, RepNone, 0)                          \
  X(StreamAttr, ReqStreamAttr, RepStreamAttr, 1)                        \
  X(CtxMisc, ReqCtxMisc, RepValue, 1)                                   \
  X(FuncMisc, ReqFuncMisc, RepValue, 1)                                 \
  X(MemPoolExport, ReqPoolExport, RepShareToken, 1)                      \
  X(MemPoolImport, ReqPoolImport, RepHandle, 1)                          \
  X(MemPoolExportPtr, ReqPoolPtr, RepIpcHandle, 1)                       \
  X(MemPoolImportPtr, ReqPoolPtrImport, RepRange, 1)                     \
  X(MemPoolPtrFree, ReqPoolPtrFree, RepNone, 1)                       \
  X(MemMapArrays, ReqMapArrays, RepNone, 1)                             \
  X(Nvml, ReqNvml, RepNvml, 1)                                          \
  X(MemcpyDtoHInline, ReqCopy, RepCopyInline, 1)                        \
  X(FlushWait, ReqCtx, RepNone, 1)                                      \
  X(Link, ReqLink, RepLink, 1)                                          \
  X(Green, ReqGreen, RepGreen, 1)                                        \
  X(OccupancyClusterSize, ReqOccCluster, RepValue, 1)                    \
  X(TensorMapEncodeIm2col, ReqTensorMapIm2col, RepTensorMap, 1)          \
  X(TensorMapReplaceAddress, ReqTensorMapReplace, RepTensorMap, 1)       \
  X(Texture1DLinearMaxWidth, ReqTexWidth, RepValue, 1)                  \
  X(HostRegisterShared, ReqHostShared, RepHostAlloc, 1)                  \
  X(HostUnregisterShared, ReqArenaOff, RepNone, 1)                      \
  X(StageTrace, ReqCtx, RepStageTrace, 1)

enum class Op : std::uint16_t {
  kInvalid = 0,
#define IVCUDA_OP_ENUM(name, req, rep, sync) k##name,
  IVCUDA_OPS(IVCUDA_OP_ENUM)
#undef IVCUDA_OP_ENUM
  kCount
};

// ---- request and reply structs. Every request that runs in a context
// carries that context; 0 means "no context current".

struct RepNone {
  u64 reserved;
};

struct ReqHello {
  u32 proto_version;
  u32 pid;
  u32 ppid;  // its parent: logs (and tests) tie a framework's worker processes to the program
  u32 pidns; // its PID namespace (ChannelDesc::guest_pidns; 0: not said): a VM's process is (pidns, pid)
  u64 reserved[1];
};
struct RepHello {
  u32 proto_version;
  i32 driver_version;     // what the host's driver reports (cuDriverGetVersion)
  u32 device_count;       // devices this guest may use
  i32 stream_priority_lo; // cuCtxGetStreamPriorityRange of device 0
  i32 stream_priority_hi;
  u32 reserved0;
  u64 arena_device_base;  // device address of BAR offset 0 (0 if not registered)
  u64 generation;
  u64 reserved[4];
};

struct ReqDevice {
  i32 device;
  u32 reserved;
};
struct ReqDeviceFlags {
  i32 device;
  u32 flags;
};
struct RepDeviceInfo {
  u64 primary_ctx;            // handle of the device's primary context
  char name[kDevNameBytes];
  u8 uuid[16];
  u64 total_mem;
  i32 attrs[kAttrSlots];
  u8 attr_valid[kAttrSlots];  // 1 if the host's driver answered attrs[i]
};
struct RepPrimaryState {
  u32 flags;
  i32 active;
};

struct ReqCtx {
  u64 ctx;
};
// StageTrace (IVCUDA_TRACE_STAGES; ReqCtx's ctx is 0): the host's medians,
// per op, of the records the guest marked kRecTraceStages. `rows` StageRow
// entries follow the reply.
struct RepStageTrace {
  u32 rows;
  u32 reserved;
};
struct StageRow {
  u16 op;
  u16 reserved;
  u32 count;
  i32 in_ns;        // the guest's stamp before writing the record to the host taking it
  u32 dispatch_ns;  // taken to the op's handler called (checks, capture mode, settling copies)
  u32 handler_ns;   // in the handler (the driver's call)
  u32 reply_ns;     // the handler's end to the reply published
};
struct ReqHandle {
  u64 ctx;
  u64 handle;
};
struct RepHandle {
  u64 handle;
};
struct RepValue {
  std::int64_t value;
};

struct ReqMemAlloc {
  u64 ctx;
  u64 bytes;
  u64 width;      // pitch allocations: width in bytes, height, element size
  u64 height;
  u32 elem_size;  // 0 = plain cuMemAlloc
  u32 reserved;
};
struct RepMemAlloc {
  u64 dptr;
  u64 pitch;
};
struct ReqPtr {
  u64 ctx;
  u64 dptr;
};
struct RepMemInfo {
  u64 free;
  u64 total;
};
struct RepRange {
  u64 base;
  u64 size;
};

// Flags of ReqMemset / ReqCopy / ReqCopy2D.
inline constexpr u32 kAsync = 1u << 0;      // the op was an ...Async call: run it in `stream`
inline constexpr u32 kWaitStream = 1u << 1;  // and wait for the stream before replying (staged
                                             // pageable 2D/3D copies: the staging area is reused)

// The most bytes a 1D copy carries in its record: HtoDInline's request, or
// DtoHInline's reply. A record's payload is at most half its ring, so on
// rings too small for that the guest stages smaller copies too (and the
// host refuses a DtoHInline whose reply would not fit).
inline constexpr u32 kInlineCopyMax = 8 * 1024;

struct ReqMemset {
  u64 ctx;
  u64 stream;
  u64 dptr;
  u64 pitch;       // 2D: destination pitch; 0 for 1D
  u64 width;       // elements per row (1D: element count)
  u64 height;      // rows (1D: 1)
  u32 value;
  u32 elem_size;   // 1, 2 or 4
  u32 flags;
  u32 reserved;
};

// One op struct serves the 1D copies; which fields matter depends on the op:
//  HtoDInline: dst, bytes; the bytes follow the struct.
//  HtoDArena:  dst, bytes, arena_off (source in the arena: pinned or staging)
//  DtoHArena:  src, bytes, arena_off (destination in the arena)
//  DtoHInline: src, bytes (at most kInlineCopyMax); the reply carries them
//  DtoD:       dst, src, bytes
struct ReqCopy {
  u64 ctx;
  u64 stream;
  u64 dst;
  u64 src;
  u64 bytes;
  u64 arena_off;
  u32 flags;
  u32 reserved;
};

// DtoHInline's reply: the bytes copied, then the data.
struct RepCopyInline {
  u64 bytes;
};

// Peer access. A query with attrib 0 is cuDeviceCanAccessPeer(device, peer);
// from kPeerAtomicQuery on, the atomic capabilities of CUatomicOperation
// attrib - kPeerAtomicQuery over the link to peer (cuDeviceGetP2PAtomicCapabilities
// for that one operation), or to the host where peer is kPeerHost
// (cuDeviceGetHostAtomicCapabilities); otherwise cuDeviceGetP2PAttribute(attrib
// - 1, device, peer). RepValue carries the value or the capability bits.
inline constexpr u32 kPeerAtomicQuery = 0x10000;
inline constexpr i32 kPeerHost = -1;
struct ReqPeerQuery {
  i32 device;
  i32 peer;
  u32 attrib;
  u32 reserved;
};
// cuCtxEnablePeerAccess (enable 1) or cuCtxDisablePeerAccess (enable 0) from
// ctx, the guest's current context, to peer_ctx.
struct ReqPeerAccess {
  u64 ctx;
  u64 peer_ctx;
  u32 flags;
  u32 enable;
};
// cuMemcpyPeer(Async): both contexts named; ctx is the caller's current one,
// whose null stream stream 0 means.
struct ReqCopyPeer {
  u64 ctx;
  u64 stream;
  u64 dst;
  u64 dst_ctx;
  u64 src;
  u64 src_ctx;
  u64 bytes;
  u32 flags;
  u32 reserved;
};

// A 2D copy. Host-side memory is always in the arena: the guest stages
// pageable rows there first. Memory types follow CUmemorytype: 1 host (arena
// offset in *_arena_off), 2 device.
struct ReqCopy2D {
  u64 ctx;
  u64 stream;
  u64 src_x_bytes;
  u64 src_y;
  u64 src_device;
  u64 src_arena_off;
  u64 src_pitch;
  u64 dst_x_bytes;
  u64 dst_y;
  u64 dst_device;
  u64 dst_arena_off;
  u64 dst_pitch;
  u64 width_bytes;
  u64 height;
  u32 src_type;
  u32 dst_type;
  u32 flags;
  u32 unaligned;
};

struct ReqHostAlloc {
  u64 bytes;
  u32 flags;
  u32 reserved;
};
struct RepHostAlloc {
  u64 arena_off;
  u64 dptr;  // device alias
};
struct ReqArenaOff {
  u64 arena_off;
};
// cuMemHostRegister of a shared mapping's pages, process mode only: the guest
// sends the file behind them over its connection first (one message: the
// 8-byte token, the fd in SCM_RIGHTS), then this; the worker maps
// [file_off, file_off + bytes) of that file after its BAR and registers it.
// The reply's arena_off is where (BAR offset, past the BAR), dptr its device alias.
struct ReqHostShared {
  u64 token;
  u64 file_off;  // page-aligned
  u64 bytes;     // page multiple
  u32 flags;     // CU_MEMHOSTREGISTER_READ_ONLY or 0
  u32 reserved;
};

// Module image kinds.
inline constexpr u32 kImageAuto = 0;
struct ReqModuleLoad {
  u64 ctx;
  u64 bytes;       // image size
  u64 arena_off;   // where the guest staged the image
  u32 kind;
  u32 reserved;
};
struct ReqModuleName {
  u64 ctx;
  u64 module;
  u32 name_len;    // name bytes follow the struct, no terminator
  u32 reserved;
};
struct ParamSlot {
  u32 offset;
  u32 size;
};
struct RepFunction {
  u64 function;
  u32 param_count;  // ParamSlot[param_count] follow the struct
  u32 param_bytes;  // size of the packed parameter buffer
};
struct ReqFuncAttr {
  u64 ctx;
  u64 function;
  i32 attrib;
  i32 value;
};

// Occupancy queries; `kind` picks the driver call.
inline constexpr u32 kOccMaxActiveBlocks = 0;       // cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags
inline constexpr u32 kOccAvailableDynamicSmem = 1;  // cuOccupancyAvailableDynamicSMemPerBlock
// cuOccupancyMaxPotentialBlockSizeWithFlags without a callback: block_size is the
// limit; the reply packs (min grid size << 32) | block size.
inline constexpr u32 kOccMaxPotentialBlockSize = 2;
struct ReqOccupancy {
  u64 ctx;
  u64 function;
  u64 dynamic_smem;  // kOccMaxActiveBlocks
  i32 block_size;
  i32 num_blocks;    // kOccAvailableDynamicSmem
  u32 flags;
  u32 kind;
};
struct ReqLimit {
  u64 ctx;
  u64 value;  // set
  i32 limit;
  u32 reserved;
};

struct ReqLaunch {
  u64 ctx;
  u64 function;
  u64 stream;
  u32 grid[3];
  u32 block[3];
  u32 shared_bytes;
  u32 param_bytes;  // packed parameters follow the struct
};

// cuLaunchKernelEx with launch attributes: ReqLaunchEx, then attr_count
// LaunchAttr, then the packed parameters. Only attributes made of plain
// values travel (clusters, scheduling policy, cooperative, priority,
// programmatic serialization, memory sync domains); the host checks ids.
inline constexpr u32 kMaxLaunchAttrs = 16;
struct LaunchAttr {
  u32 id;        // CUlaunchAttributeID
  u32 reserved;
  u32 value[4];  // the attribute's value, as its union member lays it out
};
struct ReqLaunchEx {
  ReqLaunch launch;
  u32 attr_count;
  u32 reserved;
};

// ---- stream-ordered memory. Pools are host handles (HandleKind::kMemPool):
// the devices' default pools and the pools the guest created (MemPoolCreate).
inline constexpr u32 kPoolGetDefault = 0;  // device -> pool
inline constexpr u32 kPoolGetCurrent = 1;  // device -> pool
inline constexpr u32 kPoolSetCurrent = 2;  // device, pool
inline constexpr u32 kPoolSetAttr = 3;     // pool, attr, value
inline constexpr u32 kPoolGetAttr = 4;     // pool, attr -> value
inline constexpr u32 kPoolTrim = 5;        // pool, value = bytes to keep
inline constexpr u32 kPoolDestroy = 6;     // pool
inline constexpr u32 kPoolGetAccess = 7;   // pool, attr = location type, device = location id -> flags
// 8 and 9 were exports before pools were shared (now MemPoolExport, MemPoolExportPtr): not reused.
struct ReqMemPool {
  u64 ctx;
  u64 pool;
  u64 value;
  i32 device;
  i32 attr;   // CUmemPool_attribute; ints travel widened to 64 bits
  u32 kind;
  u32 reserved;
};
struct ReqMemAllocAsync {
  u64 ctx;
  u64 stream;
  u64 pool;   // 0: the stream's device's current pool
  u64 bytes;
};
struct ReqFreeAsync {
  u64 ctx;
  u64 stream;
  u64 dptr;
};

// ---- stream capture and graphs (graphs and executable graphs are host handles)
struct ReqCapture {
  u64 ctx;
  u64 stream;
  u32 mode;   // CUstreamCaptureMode
  u32 reserved;
};
struct RepCaptureInfo {
  u32 status;  // CUstreamCaptureStatus
  u32 reserved;
  u64 id;
  u64 num_deps;
};
struct ReqGraphCreate {
  u64 ctx;
  u64 graph;  // GraphInstantiate: the graph; GraphCreate: 0
  u64 flags;
};
struct ReqGraphLaunch {
  u64 ctx;
  u64 exec;
  u64 stream;
};

// cuOccupancyMaxActiveClusters: the launch configuration, attributes unpacked.
struct ReqOccCluster {
  u64 ctx;
  u64 function;
  u64 stream;
  u32 grid[3];
  u32 block[3];
  u32 shared_bytes;
  u32 cluster[3];      // all 0: no cluster dimension attribute
  u32 policy;          // CUclusterSchedulingPolicy, 0: none given
  u32 reserved;
};

// cuTensorMapEncodeTiled, arrays sized for the largest rank (5).
inline constexpr u32 kTensorMaxRank = 5;
struct ReqTensorMap {
  u64 ctx;
  u64 global_address;
  u64 global_dim[kTensorMaxRank];
  u64 global_strides[kTensorMaxRank - 1];
  u32 box_dim[kTensorMaxRank];
  u32 element_strides[kTensorMaxRank];
  u32 data_type;
  u32 rank;
  u32 interleave;
  u32 swizzle;
  u32 l2_promotion;
  u32 oob_fill;
};
struct RepTensorMap {
  u64 words[16];  // the 128-byte CUtensorMap
};
// cuTensorMapEncodeIm2col, and cuTensorMapEncodeIm2colWide (wide = 1: the
// corners are widths, and `mode` is its CUtensorMapIm2ColWideMode).
struct ReqTensorMapIm2col {
  u64 ctx;
  u64 global_address;
  u64 global_dim[kTensorMaxRank];
  u64 global_strides[kTensorMaxRank - 1];
  u32 element_strides[kTensorMaxRank];
  i32 lower_corner[kTensorMaxRank - 2];  // the pixel box's, rank - 2 of them (not wide)
  i32 upper_corner[kTensorMaxRank - 2];
  i32 lower_width;                       // wide: pixelBoxLowerCornerWidth
  i32 upper_width;                       // wide: pixelBoxUpperCornerWidth
  u32 channels_per_pixel;
  u32 pixels_per_column;
  u32 data_type;
  u32 rank;
  u32 interleave;
  u32 swizzle;
  u32 l2_promotion;
  u32 oob_fill;
  u32 wide;
  u32 mode;
  u32 reserved;
};
// cuTensorMapReplaceAddress: the guest's descriptor and the new address.
struct ReqTensorMapReplace {
  u64 ctx;
  u64 global_address;
  u64 words[16];
};
// cuDeviceGetTexture1DLinearMaxWidth.
struct ReqTexWidth {
  i32 device;
  u32 format;  // CUarray_format
  u32 channels;
  u32 reserved;
};

// ModuleEnumerate replies with the count in RepValue, then per function a
// u32 name length and the name (no terminator).

// Completion-record flag (RecordHeader.flags of a reply): the payload ends
// with bytes the worker's process wrote to its stdout (device printf) and a
// u32 count of them; the guest writes them to its own stdout.
inline constexpr std::uint16_t kReplyConsole = 1u << 8;

struct ReqStreamCreate {
  u64 ctx;
  u32 flags;
  i32 priority;
};
struct ReqStreamWaitEvent {
  u64 ctx;
  u64 stream;
  u64 event;
  u32 flags;
  u32 reserved;
};
// A function's name (the reply's value is its length, the bytes follow),
// its module (the value), whether it is loaded, or loading it.
inline constexpr u32 kFuncName = 0;
inline constexpr u32 kFuncModule = 1;
inline constexpr u32 kFuncIsLoaded = 2;
inline constexpr u32 kFuncLoad = 3;
// The JIT linker (cuLink*, guest/link.cc, host-daemon/worker/link.cc): one request,
// by kind. kLinkCreate sends `count` LinkOption pairs after the struct (the
// numeric options only; the guest keeps the log buffers and answers them);
// kLinkAdd an input of `input_type` (CUjitInputType) staged at `arena_off`,
// `bytes` long, with `name_len` name bytes after the struct; kLinkComplete
// links and answers the output's size; kLinkRead copies the output to
// `arena_off` (`bytes` of it); kLinkDestroy ends the linker. Replies to add
// and complete carry the linker's logs after RepLink (info, then error).
inline constexpr u32 kLinkCreate = 0;
inline constexpr u32 kLinkAdd = 1;
inline constexpr u32 kLinkComplete = 2;
inline constexpr u32 kLinkRead = 3;
inline constexpr u32 kLinkDestroy = 4;
inline constexpr u32 kLinkMaxOptions = 32;
inline constexpr u32 kLinkLogBytes = 4096;  // of each log the host keeps and returns
struct LinkOption {
  u32 option;  // CUjit_option
  u32 value;
};
struct ReqLink {
  u64 ctx;
  u64 link;
  u64 bytes;
  u64 arena_off;
  u32 kind;
  u32 input_type;
  u32 name_len;   // kLinkAdd: name bytes after the struct
  u32 count;      // kLinkCreate: LinkOption pairs after the struct
};
struct RepLink {
  u64 link;
  u64 size;        // kLinkComplete: the linked image's bytes
  u32 info_len;    // log bytes after the struct, no terminators
  u32 error_len;
  float wall_ms;   // CU_JIT_WALL_TIME of the last step
  u32 reserved;
};
// Green contexts (guest/green.cc, host-daemon/worker/green.cc): one request, by
// kind. Resources travel as the driver's own CUdevResource images,
// kResourceBytes each, after the struct: the worker takes back only images it
// gave out (their internals are the driver's, not to be forged).
//   kGreenDeviceResource  resource `type` of `device`        -> 1 image
//   kGreenCtxResource     of context `ctx`                    -> 1 image
//   kGreenOwnResource     of green context `handle`           -> 1 image
//   kGreenSplit           split the 1 image sent into `count` groups (0: how
//                         many would be made) of at least `min_count` SMs,
//                         `flags` the split's; `want_remaining` 1 asks for the
//                         rest -> RepGreen.count groups, then the rest if asked
//   kGreenDesc            a descriptor of the `count` images sent -> handle
//   kGreenCreate          a green context on `device` from descriptor `handle`,
//                         `flags` cuGreenCtxCreate's -> handle, and ctx: its
//                         converted context
//   kGreenDestroy         green context `handle` (its id is its handle: the guest answers)
//   kGreenStreamCreate    a stream (`flags`, `priority`) in green context `handle` -> value: the stream
//   kGreenRecordEvent / kGreenWaitEvent  `event` and green context `handle`
inline constexpr u32 kGreenDeviceResource = 0;
inline constexpr u32 kGreenCtxResource = 1;
inline constexpr u32 kGreenOwnResource = 2;
inline constexpr u32 kGreenSplit = 3;
inline constexpr u32 kGreenDesc = 4;
inline constexpr u32 kGreenCreate = 5;
inline constexpr u32 kGreenDestroy = 6;
inline constexpr u32 kGreenStreamCreate = 7;
inline constexpr u32 kGreenRecordEvent = 8;
inline constexpr u32 kGreenWaitEvent = 9;
inline constexpr u32 kResourceBytes = 144;  // sizeof(CUdevResource), RESOURCE_ABI_VERSION 1
inline constexpr u32 kGreenMaxGroups = 128;  // groups of one split (the smallest group is 2 SMs)
struct ReqGreen {
  u64 ctx;
  u64 handle;  // a green context, or a descriptor (kGreenCreate)
  u64 event;
  i32 device;
  u32 kind;
  u32 type;
  u32 count;
  u32 flags;
  u32 min_count;
  i32 priority;
  u32 want_remaining;
};
struct RepGreen {
  u64 handle;
  u64 ctx;
  u64 value;      // kGreenStreamCreate: the stream
  u32 count;
  u32 remaining;  // kGreenSplit: 1 when the rest follows the groups
};
struct ReqFuncMisc {
  u64 function;
  u32 kind;
  u32 reserved;
};
// A context's flags and cache configuration, the persisting-L2
// reset, and cuCtxRecordEvent / cuCtxWaitEvent (`event`): one request, by kind.
inline constexpr u32 kCtxGetFlags = 0;
inline constexpr u32 kCtxSetFlags = 1;
inline constexpr u32 kCtxGetCacheConfig = 2;
inline constexpr u32 kCtxSetCacheConfig = 3;
inline constexpr u32 kCtxResetPersistingL2 = 4;
inline constexpr u32 kCtxRecordEvent = 5;
inline constexpr u32 kCtxWaitEvent = 6;
struct ReqCtxMisc {
  u64 ctx;
  u64 event;
  u32 kind;
  u32 value;  // the flags or configuration to set
};
// Stream memory operations (cuStreamWaitValue32/64, cuStreamWriteValue32/64,
// cuStreamBatchMemOp): MemOp [count] follow. `single`: one of the four
// single-operation calls (count 1), which the host makes as that call.
inline constexpr u32 kMaxMemOps = 256;
struct MemOp {
  u32 operation;  // CUstreamBatchMemOpType
  u32 flags;
  u64 address;    // waits and writes: a device address of this guest
  u64 value;      // 32-bit operations: the low half
};
struct ReqStreamMemOps {
  u64 ctx;
  u64 stream;
  u32 count;
  u32 flags;
  u32 single;
  u32 reserved;
};
// cuStreamGetAttribute / SetAttribute / CopyAttributes (kind: kKernelAttrGet,
// Set or Copy; `src` the source stream of a copy). The value is the whole
// CUstreamAttrValue union: an access-policy window does not fit LaunchAttr.
struct ReqStreamAttr {
  u64 ctx;
  u64 stream;
  u64 src;
  u32 kind;
  u32 attr;  // CUstreamAttrID
  u8 value[64];
};
struct RepStreamAttr {
  u8 value[64];
};
// cuLaunchHostFunc: the stream stores `seq` into the arena word at `reached`,
// then waits until the word at `done` holds `seq` or later (wrap-aware, as
// cuStreamWaitValue32's GEQ). Both are device addresses inside this guest's
// arena alias, 4-byte aligned. If the host cannot enqueue the pair it stores
// seq | kHostFuncFailed into `reached` itself, so the guest drops the call.
inline constexpr u32 kHostFuncFailed = 0x80000000u;
struct ReqHostFunc {
  u64 ctx;
  u64 stream;
  u64 reached;   // device address of the "stream got here" word
  u64 done;      // device address of the "host function returned" word
  u32 seq;       // nonzero, below kHostFuncFailed
  u32 reserved;
};
struct ReqEventCreate {
  u64 ctx;
  u32 flags;
  u32 reserved;
};
struct ReqEventRecord {
  u64 ctx;
  u64 event;
  u64 stream;
};
struct ReqEventRecordFlags {
  u64 ctx;
  u64 event;
  u64 stream;
  u32 flags;      // CU_EVENT_RECORD_*
  u32 reserved;
};
struct ReqFuncCache {
  u64 ctx;
  u64 function;
  u32 config;     // CUfunc_cache
  u32 reserved;
};

// ---- virtual memory management (guest/vmm.cc, host-daemon/worker/vmm.cc).
// CUmemAllocationProp without its pointer (win32HandleMetaData, unused on
// Linux); loc_id is a device ordinal as the worker numbers them.
struct MemProp {
  u32 type;          // CUmemAllocationType
  u32 loc_type;      // CUmemLocationType
  i32 loc_id;
  u32 handle_types;  // CUmemAllocationHandleType bits
  u8 compression;    // allocFlags.compressionType
  u8 rdma;           // allocFlags.gpuDirectRDMACapable
  u16 usage;         // allocFlags.usage
  u32 reserved;
};
struct ReqMemGranularity {
  MemProp prop;
  u32 option;        // CUmemAllocationGranularity_flags
  u32 reserved;
};
struct ReqMemAddressReserve {
  u64 size;
  u64 alignment;
  u64 addr;          // a hint
  u64 flags;
};
struct ReqMemRange {
  u64 ptr;
  u64 size;
};
struct ReqMemCreate {
  MemProp prop;
  u64 size;
  u64 flags;
};
struct ReqMemMap {
  u64 ptr;
  u64 size;
  u64 offset;
  u64 handle;        // from MemCreate / MemRetainHandle
  u64 flags;
};
// MemAccess[count] follow the struct.
struct MemAccess {
  u32 loc_type;
  i32 loc_id;
  u32 flags;         // CUmemAccess_flags
  u32 reserved;
};
struct ReqMemSetAccess {
  u64 ptr;
  u64 size;
  u32 count;
  u32 reserved;
};
struct ReqMemGetAccess {
  u64 ptr;
  u32 loc_type;
  i32 loc_id;
};
struct RepMemProp {
  MemProp prop;
};

// ---- explicit memory pools (cuMemPoolCreate, cuMemPoolSetAccess). Device
// ordinals in locations are the worker's.
struct ReqMemPoolCreate {
  u32 alloc_type;    // CUmemAllocationType
  u32 handle_types;  // CUmemAllocationHandleType bits
  u32 loc_type;      // CUmemLocationType
  i32 loc_id;
  u64 max_size;
  u16 usage;
  u8 win32_attrs;    // the props' win32SecurityAttributes was non-null
  u8 reserved_set;   // a byte of the props' reserved[] was non-zero
  u32 reserved;
};
// Followed by count MemAccess.
struct ReqMemPoolSetAccess {
  u64 pool;
  u32 count;
  u32 reserved;
};

// The calling guest thread's capture mode (cuThreadExchangeStreamCaptureMode),
// posted on that thread's channel whenever it changes.
struct ReqCaptureMode {
  u32 mode;       // CUstreamCaptureMode
  u32 reserved;
};
struct ReqEventElapsed {
  u64 ctx;
  u64 start;
  u64 end;
};
struct RepElapsed {
  float ms;
  u32 reserved;
};

// ---- sharing physical allocations between a tenant's processes
// (cuMemExportToShareableHandle / cuMemImportFromShareableHandle). The guest
// holds a token the host made; host-daemon/daemon/fd_broker.h says where the fd is.
struct ReqMemExport {
  u64 handle;        // from MemCreate / MemRetainHandle / MemImportShareable
  u32 handle_type;   // CUmemAllocationHandleType
  u32 reserved;
  u64 flags;
};
struct RepShareToken {
  u8 token[16];
};
struct ReqMemImport {
  u8 token[16];
  u32 handle_type;
  u32 reserved;
};

// ---- CUDA arrays, texture and surface objects (guest/arrays.cc,
// host-daemon/worker/arrays.cc; the descriptors' conversions are
// ivcuda/array_codec.h). Arrays and mipmapped arrays are host handles
// (HandleKind::kArray / kMipmappedArray); texture and surface objects are the
// driver's own 64-bit values (kernels take them by value), which the host
// accepts back only if this guest created them.
struct ArrayDesc {        // CUDA_ARRAY3D_DESCRIPTOR; height/depth 0 as CUDA means them
  u64 width;
  u64 height;
  u64 depth;
  u32 format;             // CUarray_format
  u32 channels;
  u32 flags;              // CUDA_ARRAY3D_*
  u32 reserved;
};
inline constexpr u32 kArrayCreate2D = 0;    // cuArrayCreate (flags, depth ignored)
inline constexpr u32 kArrayCreate3D = 1;    // cuArray3DCreate
inline constexpr u32 kArrayCreateMipmap = 2;  // cuMipmappedArrayCreate, `levels` levels
struct ReqArrayCreate {
  u64 ctx;
  ArrayDesc desc;
  u32 kind;
  u32 levels;
};
inline constexpr u32 kArrayQuery2D = 0;     // cuArrayGetDescriptor
inline constexpr u32 kArrayQuery3D = 1;     // cuArray3DGetDescriptor
inline constexpr u32 kArrayQueryMemReq = 2;  // cuArrayGetMemoryRequirements
inline constexpr u32 kArrayQueryMipmapMemReq = 3;  // cuMipmappedArrayGetMemoryRequirements
inline constexpr u32 kArrayQuerySparse = 4;        // cuArrayGetSparseProperties
inline constexpr u32 kArrayQueryMipmapSparse = 5;  // cuMipmappedArrayGetSparseProperties
// ArrayDestroy's kind: which of the two the guest named (a mipmapped array's
// handle given to cuArrayDestroy is refused, not destroyed).
inline constexpr u32 kDestroyArray = 0;
inline constexpr u32 kDestroyMipmap = 1;
struct ReqArrayQuery {
  u64 ctx;
  u64 array;     // array or mipmapped array handle
  u32 kind;
  i32 device;    // kArrayQueryMemReq: the worker's ordinal
};
struct RepArrayQuery {
  ArrayDesc desc;
  u64 size;       // memory requirements
  u64 alignment;
  // CUDA_ARRAY_SPARSE_PROPERTIES
  u32 tile_width;
  u32 tile_height;
  u32 tile_depth;
  u32 miptail_first_level;
  u64 miptail_size;
  u32 sparse_flags;
  u32 reserved;
};
struct ReqMipmapLevel {
  u64 ctx;
  u64 mipmap;
  u32 level;
  u32 reserved;
};

// cuMemMapArrayAsync: `count` CUarrayMapInfo entries, mapping tiles (or the
// mip tail, or a deferred-mapping array as a whole) of sparse arrays onto
// physical allocations, or unmapping them, in stream order. An entry names
// the guest's handles: `resource` an array or mipmapped array handle,
// `mem_handle` a MemCreate handle (0 as the application wrote it, e.g. for an
// unmap); `device_mask` has the worker's ordinals. The subresource union holds
// only numbers and travels as CUDA lays it out. The entries follow the struct
// or, when kMapListInArena is set, lie at `arena_off` (a list too long for
// one record); the worker copies them before it looks at them.
inline constexpr u32 kMaxArrayMaps = 65536;        // entries in one request
inline constexpr u32 kMapListInArena = 1u << 0;
inline constexpr u32 kMapListNull = 1u << 1;       // the application passed no list (count 0)
struct ArrayMapEntry {
  u64 resource;
  u64 mem_handle;
  u64 offset;            // into the physical allocation
  u8 subresource[32];    // CUarrayMapInfo::subresource
  u32 resource_type;     // CUresourcetype: array or mipmapped array
  u32 subresource_type;  // CUarraySparseSubresourceType
  u32 op;                // CUmemOperationType
  u32 mem_handle_type;   // CUmemHandleType
  u32 device_mask;       // worker ordinals
  u32 flags;             // as the application wrote them (the driver wants 0)
  u32 reserved[2];
};
struct ReqMapArrays {
  u64 ctx;
  u64 stream;
  u64 arena_off;   // kMapListInArena: where the entries lie
  u32 count;
  u32 flags;       // kMapListInArena, kMapListNull
};

// One side of a 3D copy. type is CUmemorytype: 1 host (arena_off is the
// arena offset of the base pointer), 2 device, 3 array (a host handle).
// pitch and height describe host and device memory's layout.
struct CopySide {
  u64 x_bytes;
  u64 y;
  u64 z;
  u64 device;
  u64 arena_off;
  u64 array;
  u64 pitch;
  u64 height;
  u32 type;
  u32 reserved;
};
// cuMemcpy3D and everything with an array that the guest expresses as one.
struct ReqCopy3D {
  u64 ctx;
  u64 stream;
  CopySide src;
  CopySide dst;
  u64 width_bytes;
  u64 height;
  u64 depth;
  u32 flags;      // kAsync, kWaitStream
  u32 reserved;
};

// CUDA_RESOURCE_DESC: array/mipmap are host handles, dptr device memory of
// this guest.
struct ResDesc {
  u32 type;       // CUresourcetype
  u32 format;     // linear / pitch2D: CUarray_format
  u32 channels;
  u32 flags;
  u64 handle;     // array or mipmapped array
  u64 dptr;
  u64 size_bytes; // linear
  u64 width;      // pitch2D
  u64 height;
  u64 pitch;
};
struct TexDesc {  // CUDA_TEXTURE_DESC
  u32 address[3];
  u32 filter;
  u32 flags;
  u32 max_anisotropy;
  u32 mipmap_filter;
  float mipmap_bias;
  float min_mipmap_clamp;
  float max_mipmap_clamp;
  float border[4];
  u32 reserved[2];
};
struct ViewDesc {  // CUDA_RESOURCE_VIEW_DESC
  u32 format;
  u32 reserved;
  u64 width;
  u64 height;
  u64 depth;
  u32 first_level;
  u32 last_level;
  u32 first_layer;
  u32 last_layer;
};
inline constexpr u32 kTexHasView = 1u << 0;  // a view descriptor was given
inline constexpr u32 kTexSurface = 1u << 1;  // a surface object (no texture descriptor)
struct ReqTexCreate {
  u64 ctx;
  ResDesc res;
  TexDesc tex;
  ViewDesc view;
  u32 flags;
  u32 reserved;
};
inline constexpr u32 kTexQueryResource = 0;
inline constexpr u32 kTexQueryTexture = 1;
inline constexpr u32 kTexQueryView = 2;
struct ReqTexObject {
  u64 ctx;
  u64 object;     // the driver's CUtexObject / CUsurfObject
  u32 flags;      // kTexSurface
  u32 query;      // kTexQuery*
};
struct RepTexInfo {
  ResDesc res;
  TexDesc tex;
  ViewDesc view;
};

// ---- CUDA IPC between processes of one tenant (guest/ipc.cc, host-daemon/worker/ipc.cc).
// A handle is 64 opaque bytes made by the host (a ticket of the tenant's
// registry, never the driver's handle). `proc` is the calling guest process's
// id as the guest numbers it: inside a VM one worker serves every process, and
// it tells an open in the exporting process itself (refused, as the driver
// refuses it) from an open in a sibling process.
inline constexpr u32 kIpcHandleBytes = 64;
struct ReqIpcGet {
  u64 ctx;
  u64 object;     // IpcGetMemHandle: a device pointer; IpcGetEventHandle: an event handle
  u32 proc;
  u32 reserved;
};
struct RepIpcHandle {
  u8 bytes[kIpcHandleBytes];
};
struct ReqIpcOpen {
  u64 ctx;
  u32 flags;      // IpcOpenMemHandle: CUipcMem_flags
  u32 proc;
  u8 handle[kIpcHandleBytes];
};
struct ReqIpcClose {
  u64 ctx;
  u64 dptr;
  u32 proc;
  u32 reserved;
};

// ---- sharing memory pools between a tenant's processes (guest/pools.cc,
// host-daemon/worker/pools.cc). A pool exported as a POSIX fd is a token, as
// MemExportShareable's is (the guest wraps it in the same sealed memfd); a
// pointer's CUmemPoolPtrExportData is a ticket of the tenant's registry, as
// an IPC handle is. `proc` is the calling guest process, as in the IPC
// requests: one worker serves every process of a VM.
struct ReqPoolExport {
  u64 pool;
  u64 flags;
  u32 handle_type;   // CUmemAllocationHandleType
  u32 proc;
};
struct ReqPoolImport {
  u8 token[16];
  u64 flags;
  u32 handle_type;
  u32 proc;
  u32 no_token;      // the fd held no token of ours: the driver's answer for such an fd is wanted
  u32 reserved;
};
struct ReqPoolPtr {  // MemPoolExportPtr
  u64 ctx;
  u64 dptr;
  u32 proc;
  u32 reserved;
};
struct ReqPoolPtrImport {  // -> RepRange: the imported pointer and its extent
  u64 ctx;
  u64 pool;          // an imported pool
  u32 proc;
  u32 reserved;
  u8 data[kIpcHandleBytes];
};
// cuMemFree / cuMemFreeAsync of a pointer this guest process imported.
struct ReqPoolPtrFree {
  u64 ctx;
  u64 stream;        // async only
  u64 dptr;
  u32 proc;
  u32 async;
};

// ---- graph building (guest/graph_*.cc, host-daemon/worker/graph_*.cc; the
// parameters' conversions are ivcuda/graph_codec.h). Nodes are host handles
// (HandleKind::kGraphNode), each belonging to one graph of this guest.
// One end of a memcpy node: device memory (CU_MEMORYTYPE_DEVICE, addr is a
// device address) or page-locked memory (CU_MEMORYTYPE_HOST, addr is a BAR
// offset in the arena). Arrays and pageable memory never travel.
struct CopyEnd {
  u32 type;     // CUmemorytype: 1 host (arena), 2 device
  u32 reserved;
  u64 addr;
  u64 x_bytes;
  u64 y;
  u64 z;
  u64 pitch;
  u64 height;
};
// The parameters of a node of one of the forwarded types. Which fields count
// depends on `type`; a kernel node's packed parameters (param_bytes) follow.
struct GraphNodeParams {
  u32 type;            // CUgraphNodeType
  u32 reserved0;
  u64 handle;          // kernel: function; child graph: graph; event record/wait: event
  u32 grid[3];
  u32 block[3];
  u32 shared_bytes;
  u32 param_bytes;
  u64 dst;             // memset
  u64 pitch;
  u64 width;           // memset: elements per row
  u64 height;
  u32 value;
  u32 elem_size;
  CopyEnd src;         // memcpy
  CopyEnd dst_copy;
  u64 width_bytes;
  u64 copy_height;
  u64 depth;
};
// A memory allocation node (type CU_GRAPH_NODE_TYPE_MEM_ALLOC, bytes in
// GraphNodeParams.width, the address in .dst): after GraphNodeParams, where a
// kernel's parameters go, MemAllocNode and MemAccess [access_count]. Adding
// one replies with the node handle and then the u64 address.
struct MemAllocNode {
  MemProp prop;
  u64 max_size;
  u32 access_count;
  u32 reserved;
};
// A conditional node (CU_GRAPH_NODE_TYPE_CONDITIONAL): .handle is the
// conditional handle, .value the CUgraphConditionalNodeType, .elem_size the
// number of bodies; adding one replies with the node handle and then the
// u64 handles of the body graphs the driver made (owned by the node).
inline constexpr u32 kMaxCondBodies = 64;
// Deps: u64 node handles [ndeps], then GraphNodeParams (with its packed parameters).
struct ReqGraphAddNode {
  u64 ctx;
  u64 graph;
  u32 ndeps;
  u32 reserved;
};
// Node parameters: get (the reply is GraphNodeParams and the packed
// parameters), set on the node, or set on the executable graph `exec`
// (GraphNodeParams and its packed parameters follow the request).
inline constexpr u32 kNodeParamsGet = 0;
inline constexpr u32 kNodeParamsSet = 1;
inline constexpr u32 kNodeParamsExecSet = 2;
struct ReqGraphNodeParams {
  u64 ctx;
  u64 node;
  u64 exec;
  u32 kind;
  u32 reserved;
};
// Questions about graphs and nodes, and the calls that make no new node. The
// lists are asked with the caller's capacity (0 with kQueryArrays unset: only
// the count), so the driver answers every count and LOSSY_QUERY itself; the
// reply is RepValue (the count written back, or the answer) and, for lists,
// u64 handles [capacity] (edges: from [capacity], to [capacity], edge data
// [capacity] as the driver's 8 bytes).
inline constexpr u32 kQueryNodes = 0;         // handle: graph
inline constexpr u32 kQueryRoots = 1;         // handle: graph
inline constexpr u32 kQueryEdges = 2;         // handle: graph
inline constexpr u32 kQueryDeps = 3;          // handle: node
inline constexpr u32 kQueryDependents = 4;    // handle: node
inline constexpr u32 kQueryType = 5;          // handle: node -> CUgraphNodeType
inline constexpr u32 kQueryDestroyNode = 6;   // handle: node
inline constexpr u32 kQueryClone = 7;         // handle: graph -> new graph
inline constexpr u32 kQueryFindInClone = 8;   // handle: node, other: clone -> node of the clone
inline constexpr u32 kQueryExecFlags = 9;     // handle: exec -> flags
inline constexpr u32 kQueryExecUpdate = 10;   // handle: exec, other: graph -> CUgraphExecUpdateResult,
                                              //   then u64 error node, u64 error-from node
inline constexpr u32 kQueryGetEnabled = 11;   // handle: exec, other: node -> 0/1
inline constexpr u32 kQuerySetEnabled = 12;   // handle: exec, other: node, capacity: 0/1
inline constexpr u32 kQueryChildGraph = 13;   // handle: node -> the child graph (owned by the node)
inline constexpr u32 kQueryCondHandle = 14;   // handle: graph, capacity: default value, flags: flags
                                              //   -> cuGraphConditionalHandleCreate's handle
inline constexpr u32 kQueryGraphMem = 16;     // handle: device, other: CUgraphMem_attribute; flags 0: get
                                              //   -> value, 1: set to capacity, 2: cuDeviceGraphMemTrim
inline constexpr u32 kQueryDot = 15;          // handle: graph, flags: CUgraphDebugDot_flags -> byte count,
                                              //   then the DOT text cuGraphDebugDotPrint wrote
inline constexpr u32 kQueryArrays = 1u << 0;     // flags: the caller passed arrays
inline constexpr u32 kQueryEdgeData = 1u << 1;   // flags: and an edge-data array
struct ReqGraphQuery {
  u64 ctx;
  u64 handle;
  u64 other;
  u64 capacity;
  u32 kind;
  u32 flags;
};
// cuGraphAddDependencies / cuGraphRemoveDependencies: from [count], to
// [count] and edge data [count] (8 bytes each, zero: the default) follow.
struct ReqGraphEdges {
  u64 ctx;
  u64 graph;
  u32 count;
  u32 remove;
};

// Capture with its graph: CaptureGraphInfo answers as StreamCaptureInfo and,
// while the capture is active, adds u64 graph handle, u64 node handles
// [num_deps] and edge data [num_deps] (8 bytes each). CaptureToGraph
// (cuStreamBeginCaptureToGraph) and CaptureUpdateDeps
// (cuStreamUpdateCaptureDependencies) carry u64 node handles [count] and edge
// data [count] after the struct.
struct ReqCaptureToGraph {
  u64 ctx;
  u64 stream;
  u64 graph;
  u32 mode;    // CUstreamCaptureMode
  u32 count;
};
struct ReqCaptureDeps {
  u64 ctx;
  u64 stream;
  u32 count;
  u32 flags;   // CU_STREAM_ADD/SET_CAPTURE_DEPENDENCIES
};

// User objects (HandleKind::kUserObject). The destructor is guest code: the
// host's object gets a worker destructor that steps the `reached` word of the
// guest's pair at BAR offset `off` (guest/hostfunc.cc runs it once).
inline constexpr u32 kUserObjCreate = 0;        // off, count, flags -> handle
inline constexpr u32 kUserObjRetain = 1;        // object, count
inline constexpr u32 kUserObjRelease = 2;       // object, count
inline constexpr u32 kUserObjGraphRetain = 3;   // graph, object, count, flags
inline constexpr u32 kUserObjGraphRelease = 4;  // graph, object, count
struct ReqUserObject {
  u64 ctx;
  u64 object;
  u64 graph;
  u64 off;
  u32 count;
  u32 flags;
  u32 kind;
  u32 reserved;
};

// Kernel node attributes (cuGraphKernelNodeGet/SetAttribute, CopyAttributes
// from `src`): the value travels as LaunchAttr does, for the attributes made
// of plain values; the reply is the attribute read.
inline constexpr u32 kKernelAttrGet = 0;
inline constexpr u32 kKernelAttrSet = 1;
inline constexpr u32 kKernelAttrCopy = 2;
struct ReqGraphKernelAttr {
  u64 ctx;
  u64 node;
  u64 src;
  u32 kind;
  u32 reserved;
  LaunchAttr attr;
};

// ---- per-op traits, generated from the table
template <Op op>
struct OpTraits;
#define IVCUDA_OP_TRAITS(name, req, rep, sync)                   \
  template <>                                                    \
  struct OpTraits<Op::k##name> {                                 \
    using Request = req;                                         \
    using Reply = rep;                                           \
    static constexpr bool kNeedsReply = (sync) != 0;             \
    static constexpr const char* kName = #name;                  \
    static_assert(std::is_trivially_copyable_v<req>);            \
    static_assert(std::is_standard_layout_v<req>);               \
    static_assert(std::is_trivially_copyable_v<rep>);            \
    static_assert(sizeof(req) % 8 == 0, #req " must pad to 8");  \
  };
IVCUDA_OPS(IVCUDA_OP_TRAITS)
#undef IVCUDA_OP_TRAITS

inline const char* op_name(std::uint16_t op) noexcept {
  switch (static_cast<Op>(op)) {
#define IVCUDA_OP_NAME(name, req, rep, sync) \
  case Op::k##name:                          \
    return #name;
    IVCUDA_OPS(IVCUDA_OP_NAME)
#undef IVCUDA_OP_NAME
    default:
      return "unknown";
  }
}

// Fixed sizes are part of the protocol.
static_assert(sizeof(RepHello) == 72);
static_assert(sizeof(ReqCopy) == 56);
static_assert(sizeof(ReqHostFunc) == 40);
static_assert(sizeof(ReqCopy2D) == 128);
static_assert(sizeof(MemProp) == 24);
static_assert(sizeof(MemAccess) == 16);
static_assert(sizeof(ReqMemExport) == 24);
static_assert(sizeof(RepShareToken) == 16);
static_assert(sizeof(ReqMemImport) == 24);
static_assert(sizeof(ReqLaunch) == 56);
static_assert(sizeof(ReqTensorMap) == 152);
static_assert(sizeof(RepTensorMap) == 128);
static_assert(sizeof(ReqTensorMapIm2col) == 184);
static_assert(sizeof(ReqTensorMapReplace) == 144);
static_assert(sizeof(ReqTexWidth) == 16);
static_assert(sizeof(ReqOccCluster) == 72);
static_assert(sizeof(ArrayDesc) == 40);
static_assert(sizeof(ReqArrayCreate) == 56);
static_assert(sizeof(CopySide) == 72);
static_assert(sizeof(RepArrayQuery) == 40 + 16 + 32);
static_assert(sizeof(ArrayMapEntry) == 88);
static_assert(sizeof(ReqMapArrays) == 32);
static_assert(sizeof(ReqCopy3D) == 192);
static_assert(sizeof(ResDesc) == 64);
static_assert(sizeof(TexDesc) == 64);
static_assert(sizeof(ViewDesc) == 48);
static_assert(sizeof(ReqTexCreate) == 8 + 64 + 64 + 48 + 8);
static_assert(sizeof(RepTexInfo) == 176);
static_assert(sizeof(ReqMemPoolCreate) == 32);
static_assert(sizeof(ReqMemPoolSetAccess) == 16);
static_assert(sizeof(ReqIpcGet) == 24);
static_assert(sizeof(RepIpcHandle) == 64);
static_assert(sizeof(ReqIpcOpen) == 80);
static_assert(sizeof(ReqIpcClose) == 24);
static_assert(sizeof(ReqPoolExport) == 24);
static_assert(sizeof(ReqPoolImport) == 40);
static_assert(sizeof(ReqPoolPtr) == 24);
static_assert(sizeof(ReqPoolPtrImport) == 88);
static_assert(sizeof(ReqPoolPtrFree) == 32);
static_assert(sizeof(CopyEnd) == 56);
static_assert(sizeof(GraphNodeParams) == 224);
static_assert(sizeof(ReqGraphQuery) == 40);
static_assert(sizeof(MemAllocNode) == 40);
static_assert(sizeof(ReqGraphKernelAttr) == 56);
static_assert(sizeof(MemOp) == 24);
static_assert(sizeof(ReqStreamMemOps) == 32);
static_assert(sizeof(ReqStreamAttr) == 96);
static_assert(sizeof(ReqCtxMisc) == 24);
static_assert(sizeof(ReqFuncMisc) == 16);
static_assert(sizeof(ReqLink) == 48);
static_assert(sizeof(RepStageTrace) == 8);
static_assert(sizeof(StageRow) == 24);
static_assert(sizeof(RepLink) == 32);
static_assert(sizeof(LinkOption) == 8);
static_assert(sizeof(RepDeviceInfo) == 8 + kDevNameBytes + 16 + 8 + 4 * kAttrSlots + kAttrSlots);

}  // namespace ivcuda::proto
