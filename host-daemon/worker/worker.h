// One worker process per guest: it owns that guest's CUDA contexts and
// objects, serves the guest's channels and treats every byte of the shared
// memory as hostile.
#pragma once

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "host-daemon/worker/driver_api.h"
#include "host-daemon/shared/broker_client.h"
#include "host-daemon/worker/handles.h"
#include "host-daemon/worker/quota.h"
#include "host-daemon/shared/tenant_share.h"
#include "host-daemon/shared/to_worker.h"
#include "host-daemon/worker/uring_wait.h"
#include "ivcuda/proto.h"
#include "ring/arena.h"
#include "ring/ivshmem.h"
#include "ring/layout.h"
#include "ring/spsc_ring.h"
#include "ring/sys.h"
#include "ring/wait.h"

namespace ivcuda::host {

// Sparse arrays (arrays.cc): a region of an array the guest mapped onto a
// physical allocation. Regions are kept per array, mip level (or mip tail,
// or the whole of a deferred-mapping array), layer and device, as half-open
// boxes in elements (the mip tail: bytes along x).
struct TileKey {
  std::uint64_t resource = 0;  // the guest's array or mipmapped array handle
  std::uint32_t part = 0;      // mip level, kTilePartMiptail or kTilePartWhole
  std::uint32_t layer = 0;
  std::uint32_t device = 0;    // worker ordinal (kTileAnyDevice: none named)
  auto operator<=>(const TileKey&) const = default;
};
inline constexpr std::uint32_t kTilePartMiptail = 0xffffffffu;
inline constexpr std::uint32_t kTilePartWhole = 0xfffffffeu;
inline constexpr std::uint32_t kTileAnyDevice = 0xffffffffu;
struct TileBox {
  std::uint64_t lo[3] = {0, 0, 0};
  std::uint64_t hi[3] = {0, 0, 0};
  std::uint64_t mem = 0;  // the guest's handle of the allocation behind it
};
using TileMaps = std::map<TileKey, std::vector<TileBox>>;

class VmShared;
struct GuestStats;

class Worker final : public GuestWorker {
 public:
  static Result<std::unique_ptr<Worker>> create(WorkerConfig cfg);
  ~Worker() override;

  // GuestWorker (host-daemon/shared/to_worker.h).
  void attach_connection(int conn_fd) noexcept override;
  int run() override;
  Result<std::unique_ptr<GuestWorker>> successor(const NextGuest& next) override;
  void release_for_recycle() noexcept override;
  void stop() noexcept override { stop_ = true; }
  // Whether the operator evicted the guest (ivcudactl evict): everything it
  // held is released, and every call answers CUDA_ERROR_DEVICE_UNAVAILABLE.
  bool evicted() const noexcept { return evicted_; }

  // One pass over the channels (for tests): returns records handled.
  int serve_once();

 private:
  struct Call;

 public:
  using Handler = CUresult (Worker::*)(Call&);
  static const Handler kHandlers[];

 private:
  struct Channel;
  // Ends the process when the guest's connection hangs up, whatever the
  // request loop is doing (worker.cc).
  void watch_guest_death();
  // What a context's limits reserve on the device (contexts.cc,
  // on_CtxSetLimit), by CUlimit value: the stack, the printf FIFO, the malloc
  // heap and the device runtime's pending launches. The bytes beyond the
  // driver's own value before the guest first set one are charged; that
  // value is part of the context's reserve.
  static constexpr int kChargedLimits = 5;
  struct LimitBooks {
    std::uint64_t base[kChargedLimits] = {};
    bool known[kChargedLimits] = {};
    std::uint64_t bytes[kChargedLimits] = {};
    Charge charge{};  // the sum of `bytes`
  };
  struct CtxEntry {
    CUcontext real = nullptr;
    int device = 0;      // guest ordinal
    bool primary = false;
    int guest_refs = 0;  // primary: the guest's retain count
    unsigned flags = 0;  // primary: flags set before activation
    // The context itself against the quota while the driver holds it for
    // the guest (created ones; primaries other than the one the worker
    // starts with, whose charge is context_charge_).
    Charge charge{};
    LimitBooks limits{};
    std::uint64_t green = 0;  // a green context's converted context: that green context (green.cc)
  };
  struct GreenEntry {  // cuGreenCtxCreate
    CUgreenCtx real = nullptr;
    std::uint64_t ctx = 0;  // its converted context (cuCtxFromGreenCtx), in ctxs_
    int device = 0;         // guest ordinal
    Charge charge{};        // as a context made for the guest
  };
  struct FuncEntry {
    CUfunction real = nullptr;
    std::uint64_t module = 0;
    std::vector<proto::ParamSlot> params;
    std::uint32_t param_bytes = 0;
  };
  struct ModuleEntry {
    CUmodule real = nullptr;
    std::uint64_t ctx = 0;
    std::map<std::string, std::uint64_t> functions;  // name -> function handle
    std::vector<std::uint64_t> globals;              // device ranges of globals
    Charge charge;                                   // its code and globals (quota.h)
  };
  struct StreamEntry {
    CUstream real = nullptr;
    std::uint64_t ctx = 0;
    std::uint64_t copy_fence = 0;  // the last posted-copy fence it waited for (memory.cc)
  };
  struct EventEntry {
    CUevent real = nullptr;
    std::uint64_t ctx = 0;
  };
  struct PoolEntry {
    CUmemoryPool real = nullptr;
    int device = 0;                  // guest ordinal
    bool created = false;            // cuMemPoolCreate'd by the guest (else a device's default)
    std::uint32_t handle_types = 0;  // created: the CUmemAllocationHandleType bits asked for
    // cuMemPoolImportFromShareableHandle: it only imports pointers. An alias
    // is this worker's own exported pool imported by another guest process
    // (a VM): `real` is that pool, and nothing was asked of the driver.
    bool imported = false;
    bool alias = false;
  };
  struct MemHandleEntry {  // a physical allocation (cuMemCreate)
    CUmemGenericAllocationHandle real = 0;
    std::uint64_t size = 0;
    // References the guest holds through this one handle: the driver gives
    // the same handle value back for cuMemRetainAllocationHandle (and an
    // import of memory it knows), and each needs its own cuMemRelease.
    std::uint32_t refs = 1;
    // Sparse arrays (arrays.cc): regions of arrays mapped onto it, and
    // whether the worker holds the driver reference the guest gave up with
    // its last cuMemRelease while regions were mapped (released once none is).
    std::uint64_t tile_maps = 0;
    bool held = false;
    std::shared_ptr<Charge> charge{};  // created here: its size against the quota (mappings share it)
  };
  // A handle the guest holds (a released one that arrays still map is not).
  MemHandleEntry* guest_mem(std::uint64_t h) {
    MemHandleEntry* e = mem_handles_.find(h);
    return e != nullptr && e->refs > 0 ? e : nullptr;
  }
  // The guest's handle for a driver handle the driver just gave one more
  // reference to: the one it has (one more reference), or a new one.
  // A new handle carries `charge` (the memory's charge, quota.h).
  std::uint64_t adopt_mem_handle(CUmemGenericAllocationHandle real, std::uint64_t size,
                                 std::shared_ptr<Charge> charge = nullptr);
  struct MappingEntry {    // one cuMemMap of (part of) an allocation
    std::uint64_t size = 0;
    std::uint64_t handle = 0;  // the guest's handle it was mapped with
    // The allocation's quota charge: a mapping keeps the memory alive after
    // the handle's release, and with it the charge.
    std::shared_ptr<Charge> charge{};
  };
  struct GraphEntry {
    CUgraph real = nullptr;
    std::uint64_t ctx = 0;
    // A child graph node's embedded graph (cuGraphChildGraphNodeGetGraph):
    // the node owns it, so it goes with that node and cannot be destroyed.
    std::uint64_t owner_node = 0;
  };
  // A graph host node's meeting point with the guest: a pair of words in its
  // arena (graph_build.cc, host_node_call). Owned by the worker: every graph,
  // clone and executable graph made from the node points at it.
  struct HostNodeSlot {
    std::uint32_t* reached = nullptr;
    std::uint32_t* done = nullptr;
    std::uint64_t off = 0;  // BAR offset of `reached`
  };
  // A JIT linker (host-daemon/worker/link.cc). The driver writes the log buffers
  // and its option outputs until cuLinkDestroy: they live here.
  struct LinkEntry {
    CUlinkState real = nullptr;
    std::unique_ptr<char[]> info_log, error_log;  // kLinkLogBytes each
    std::vector<CUjit_option> opts;               // as given to cuLinkCreate
    std::vector<void*> vals;                      // [4]: CU_JIT_WALL_TIME's float
    std::uint64_t input_bytes = 0;
    const void* output = nullptr;  // the driver's, once complete
    std::size_t output_bytes = 0;
    float wall_ms = 0;
  };
  struct UserObjEntry {
    CUuserObject real = nullptr;
    std::uint64_t refs = 0;  // references the guest itself holds
  };
  struct NodeEntry {
    CUgraphNode real = nullptr;
    std::uint64_t graph = 0;  // the graph handle it belongs to
    Charge charge{};          // a memory allocation node: its size against the quota while it lives
  };
  struct ExecEntry {
    CUgraphExec real = nullptr;
    std::uint64_t ctx = 0;
  };
  // CUDA arrays (arrays.cc). A mipmap level is an array entry that belongs to
  // its mipmapped array: the guest cannot destroy it, and it dies with it.
  struct ArrayEntry {
    CUarray real = nullptr;
    std::uint64_t ctx = 0;
    CUDA_ARRAY3D_DESCRIPTOR desc{};  // as the driver reports it
    std::uint64_t mipmap = 0;        // level of this mipmapped array, or 0
    unsigned flags = 0;              // CUDA_ARRAY3D_* the guest created it with
    Charge charge{};                 // its memory against the quota (none for sparse arrays)
  };
  struct MipmapEntry {
    CUmipmappedArray real = nullptr;
    std::uint64_t ctx = 0;
    std::map<unsigned, std::uint64_t> levels;  // level -> array handle handed out
    unsigned flags = 0;                        // CUDA_ARRAY3D_* it was created with
    Charge charge{};                           // all its levels against the quota
  };
  struct TexEntry {  // a texture or surface object this guest created
    std::uint64_t ctx = 0;
    bool surface = false;
    std::uint64_t resource = 0;      // the guest's array / mipmap handle, or 0
  };
  // kIpc: memory another worker of the tenant exported, opened here
  // (cuIpcCloseMemHandle ends it). kFreed: an allocation its owner freed while
  // another process of this worker still has it open through IPC; freed for
  // real at the last close.
  // kPoolImport: a pool allocation another worker of the tenant exported,
  // imported here (cuMemPoolImportPointer; its importer's free ends it).
  enum class RangeKind : std::uint8_t { kAlloc, kGlobal, kMapped, kIpc, kFreed, kGraphMem, kPoolImport };
  struct DevRange {
    std::uint64_t size = 0;
    std::uint64_t ctx = 0;
    RangeKind kind = RangeKind::kAlloc;
    std::uint64_t pool = 0;  // stream-ordered allocations from a created pool, pool imports: its handle
    Charge charge{};         // allocations and graph memory: their bytes against the quota
    // Stream-ordered allocations: the driver's pool they came from, which
    // keeps their memory when they are freed (pools.cc, settle_pool).
    CUmemoryPool from_pool = nullptr;
  };

  explicit Worker(WorkerConfig cfg);
  Result<void> init();
  // What init() does once the driver is loaded, also for a successor: the
  // BAR, the quota, the first context and its arena registration, the
  // channels. `first`: the waiter, the console and NVML are made too.
  Result<void> start_guest_side(bool first);
  // Whether the guest left nothing under way: no record posted, no call
  // parked, no copy in flight, every stream idle (run(), for recycling).
  bool nothing_under_way();

  bool charge_first_context();
  // Contexts and their limits against the quota (contexts.cc).
  Charge context_charge();
  bool limit_bytes(CUlimit limit, std::uint64_t value, std::uint64_t base, int device, std::uint64_t* out);
  // Device bytes charged per pending device-runtime launch (an estimate;
  // tests/programs/drv_context_cost measures the driver's figure).
  static constexpr std::uint64_t kPendingLaunchBytes = 64u << 10;
  Result<void> map_bar();
  void attach_channels();
  void handle(Channel& ch, const ring::Record& rec);
  void reply(Channel& ch, const ring::Record& rec, CUresult st, std::span<const std::byte> body);
  bool poll_parked(Channel& ch);
  // quiet_ from the channels: true when nothing is parked, copying or polling
  // (the loop between calls); returns it.
  bool note_quiet();
  void sleep_until_work();
  void cleanup() noexcept;
  void destroy_links() noexcept;  // link.cc
  // Contexts kept for the tenant's next guest (keep.cc; --recycle-workers
  // keep). note_op: whether the guest's calls so far leave contexts the
  // worker can scrub. keep_reason: null if this guest's contexts may go to
  // the next guest, else why not. scrub_for_next_guest: everything the
  // guest made is destroyed, its memory zeroed first, and the worker's
  // kernels zero shared memory and local memory; false if
  // anything failed (the contexts are then reset). scrub_range: zeroes
  // [d, d + bytes) before the driver has it back.
  struct KeptContext {
    CUmodule module = nullptr;  // the scrub kernels (scrub_kernels.cu), loaded once
    CUfunction shared = nullptr, local = nullptr;
    CUstream stream = nullptr;  // the worker's own, for the zeroing
    // The context as the worker first made it: a later guest's may differ
    // in none of these.
    unsigned flags = 0;
    CUfunc_cache cache = CU_FUNC_CACHE_PREFER_NONE;
    std::size_t limits[7] = {};
    bool baseline = false;
    bool live = false;    // the last guest's context was kept (not reset)
    unsigned guests = 0;  // guests it has served since it was made
  };
  void note_op(proto::Op op) noexcept;
  void unkeep(const char* why) noexcept;  // why: a string literal or an op's name
  const char* keep_reason();
  bool scrub_for_next_guest() noexcept;
  CUresult scrub_range(CUdeviceptr d, std::uint64_t bytes) noexcept;
  CUresult load_scrub_kernels() noexcept;
  void record_keep_baseline() noexcept;
  bool keepable_ = true;
  const char* unkept_why_ = nullptr;
  std::string keep_why_;  // keep_reason's words where they name figures
  KeptContext kept_;
  void destroy_greens() noexcept;  // green.cc
  // green.cc: an image the driver gave out, remembered so that only such come back to it.
  bool issue_resource(const CUdevResource& r);
  bool issued_resource(std::span<const std::byte> image) const;

  // Helpers the handlers share.
  CUresult use_ctx(std::uint64_t h, CtxEntry** out = nullptr);
  CUresult resolve_stream(std::uint64_t ctx, std::uint64_t h, CUstream* out);
  bool owns_device(std::uint64_t addr, std::uint64_t len) const;
  // [0, null_end_) holds nothing of this process: below the kernel's lowest
  // mapping address, then reserved PROT_NONE before the driver loaded (0: the
  // reservation failed). A range inside it is a placeholder: work recorded
  // there (a memset into a capture) faults the guest's own context
  // when it runs, as a null pointer does natively, and touches nothing.
  std::uint64_t null_end_ = 0;
  void reserve_null_region() noexcept;
  bool placeholder_range(std::uint64_t addr, std::uint64_t len) const noexcept;
  // Is stream `s` capturing (so that what is given to it is recorded, not run)?
  bool capturing(CUstream s);
  bool spans_mappings(std::map<std::uint64_t, DevRange>::const_iterator first, std::uint64_t addr,
                      std::uint64_t len) const;
  // memops.cc: stream memory operations from the wire, their addresses checked.
  CUresult memops_from_wire(std::span<const proto::MemOp> ops, std::vector<CUstreamBatchMemOpParams>* out) const;
  bool arena_range(std::uint64_t off, std::uint64_t len) const;
  static bool order_free(const ring::Record& rec) noexcept;
  // Host memory a copy may name (the driver DMAs it; the worker never touches
  // it): the arena, or a registered shared mapping past the BAR.
  bool host_range(std::uint64_t off, std::uint64_t len) const { return arena_range(off, len) || shared_range(off, len); }
  // host_register.cc: shared mappings a process-mode guest registered
  // (cuMemHostRegister of a memfd or /dev/shm range), each mapped into the
  // window reserved right after the BAR, so that its BAR offset (past the
  // BAR's end) and its device alias follow the arena's.
  std::byte* shared_window_ = nullptr;
  std::uint64_t shared_window_size_ = 0;
  std::map<std::uint64_t, std::uint64_t> shared_regs_;  // window offset -> bytes
  std::uint64_t shared_bytes_ = 0;
  ivshmem::MessageReader conn_reader_;  // the guest's messages on its connection (their fds)
  bool reserve_shared_window() noexcept;
  std::optional<std::uint64_t> shared_slot(std::uint64_t bytes) const;
  sys::UniqueFd shared_fd(std::uint64_t token);
  void drop_shared(std::uint64_t slot) noexcept;
  void release_shared() noexcept;
  bool shared_range(std::uint64_t off, std::uint64_t len) const;
  bool shared_device(std::uint64_t addr, std::uint64_t len) const;
  std::byte* arena_ptr(std::uint64_t off) const { return bar_.data() + off; }
  void post_error(CUresult st, const char* op) noexcept;
  void drop_ctx_objects(std::uint64_t ctx);
  CUresult release_primary_objects(CtxEntry& c, std::uint64_t h);
  const char* err_name(CUresult st) const;
  CUresult park(Call& c, proto::Op op, std::uint64_t handle);
  bool valid_device(int device) const noexcept;
  std::size_t dev_index(int device) const noexcept;
  template <class Table, class Destroy>
  CUresult destroy_in_ctx(Table& table, std::uint64_t handle, Destroy&& destroy);
  CUresult launch(Call& c, bool cooperative);
  // launch.cc: both cluster questions (the fuzz coverage counts it as on_OccupancyCluster's part).
  CUresult on_OccupancyCluster_ask(Call& c, bool max_size);
  // Both directions of a copy between the arena and the device.
  CUresult arena_copy(Call& c, bool to_device);
  // Pageable copies the guest posted (memory.cc): a staged chunk's DMA and
  // a synchronous HtoD run while the worker goes on; an event behind each
  // says when it is done. See "Staged copies" in docs/shm-abi.md.
  CUresult staged_copy(Call& c, const proto::ReqCopy& r, bool to_device);
  void track_copy(Channel& ch, std::uint64_t ctx, CUstream s, bool counted, bool fence);
  void finished_copy(Channel& ch, bool counted);
  CUevent copy_event(std::uint64_t ctx);
  void release_copy_event(std::uint64_t ctx, CUevent ev, bool broken);
  int reap_copies(Channel& ch);
  // Work a guest marked as polling page-locked memory (host_polls.cc).
  void track_host_poll(Channel& ch, const ring::Record& rec, CUresult st);
  int reap_host_polls(Channel& ch);
  void host_poll_over(Channel& ch);
  void settle_host_polls(std::uint64_t ctx);
  void abandon_host_polls() noexcept;
  static constexpr std::size_t kMaxHostPolls = 1024;  // per channel; past it, reported over at once
  void reap_all_copies();
  void wait_copies(Channel& ch, std::size_t keep);
  void settle_copies(std::uint64_t ctx);
  void settle_copies_before(proto::Op op, const Call& c);
  void abandon_copies() noexcept;
  void order_after_copies(StreamEntry& s);
  CUresult park_on_copies(Call& c);
  bool poll_copy_park(Channel& ch);
  CUresult dtoh_inline(const proto::ReqCopy& r, std::size_t room, std::vector<std::byte>* body);
  template <class DriverCall>
  CUresult exec_on_stream(Call& c, DriverCall call);
  // The launch itself, once the request is parsed: attrs empty = cuLaunchKernel.
  CUresult launch_with(const proto::ReqLaunch& r, std::span<const std::byte> params,
                       std::span<const CUlaunchAttribute> attrs, bool cooperative);
  CUresult refuse_in_capture(CUstream s);
  // Graphs (graph_build.cc, graph_edit.cc, graph_exec.cc).
  std::uint64_t node_handle(CUgraphNode real, std::uint64_t graph);
  void drop_graph(std::uint64_t graph);
  void drop_node(std::uint64_t node);
  CUresult node_in_ctx(std::uint64_t h, NodeEntry** out);
  CUresult exec_in_ctx(std::uint64_t h, ExecEntry** out);
  CUresult capture_start(std::uint64_t ctx, std::uint32_t wire_mode, std::uint64_t stream, CUstreamCaptureMode* mode,
                         CUstream* s);
  CUresult add_node(GraphEntry& g, std::span<const CUgraphNode> deps, const proto::GraphNodeParams& p,
                    std::span<const std::byte> packed, CUgraphNode* out);
  CUresult set_node_params(NodeEntry& n, CUgraphExec exec, const proto::GraphNodeParams& p,
                           std::span<const std::byte> packed);
  CUresult get_node_params(NodeEntry& n, Call& c);
  CUresult kernel_node_to_wire(CUgraphNode node, proto::GraphNodeParams* p, std::vector<std::byte>* packed);
  CUresult copy_node_to_wire(CUgraphNode node, proto::GraphNodeParams* p);
  CUresult event_node_to_wire(CUgraphNode node, proto::GraphNodeParams* p);
  CUresult alloc_node_to_wire(CUgraphNode node, proto::GraphNodeParams* p, std::vector<std::byte>* packed);
  CUresult host_node_to_wire(CUgraphNode node, proto::GraphNodeParams* p);
  CUresult to_driver_copy(const proto::GraphNodeParams& p, CUDA_MEMCPY3D* out);
  CUresult to_driver_memset(const proto::GraphNodeParams& p, CUDA_MEMSET_NODE_PARAMS* out);
  // on_GraphQuery's answers, one per kind of question (tests/fuzz/coverage.py
  // counts an on_<Op>_<part> as the handler on_<Op>).
  CUresult on_GraphQuery_list(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_type(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_destroy_node(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_clone(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_find_in_clone(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_child_graph(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_cond_handle(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_dot(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_exec_flags(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_graph_mem(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_exec_update(Call& c, const proto::ReqGraphQuery& r);
  CUresult on_GraphQuery_enabled(Call& c, const proto::ReqGraphQuery& r);
  CUresult capture_nodes(std::span<const std::byte> tail, std::uint32_t count, std::vector<CUgraphNode>* nodes,
                         std::vector<CUgraphEdgeData>* data);
  CUresult add_mem_alloc_node(GraphEntry& g, std::span<const CUgraphNode> deps, const proto::GraphNodeParams& p,
                              std::span<const std::byte> tail, CUgraphNode* out, CUdeviceptr* dptr, Charge* charge);
  CUresult add_conditional_node(GraphEntry& g, std::span<const CUgraphNode> deps, const proto::GraphNodeParams& p,
                                CUgraphNode* out, std::vector<CUgraph>* bodies);
  CUresult host_node_params(const proto::GraphNodeParams& p, CUDA_HOST_NODE_PARAMS* out);
  CUresult record_event(std::uint64_t ctx, std::uint64_t event, std::uint64_t stream, unsigned flags);
  // VMM (vmm.cc): guest locations and properties in the driver's numbering.
  CUresult to_driver_location(std::uint32_t type, std::int32_t id, CUmemLocation* out) const;
  CUresult to_driver_prop(const proto::MemProp& p, CUmemAllocationProp* out) const;
  bool fully_mapped(std::uint64_t ptr, std::uint64_t size) const;
  // Arrays (arrays.cc): one side of a 3D copy, checked; what a context's end frees.
  CUresult copy_side(const proto::CopySide& s, const proto::ReqCopy3D& r, CUmemorytype* type,
                     const void** host, CUdeviceptr* dev, CUarray* array);
  CUresult resource_from_wire(const proto::ResDesc& w, CUDA_RESOURCE_DESC* out, std::uint64_t* handle);
  void release_ctx_arrays(std::uint64_t ctx, bool destroy);
  // Sparse arrays (arrays.cc): one cuMemMapArrayAsync entry in the driver's
  // terms and what it does to the regions; the regions after a list;
  // what a destroyed array mapped; driver references the worker held for
  // mapped regions, released once the stream passed the unmap.
  struct TileOp {
    TileKey key;
    TileBox box;   // box.mem: the allocation (0: an unmap)
    bool unmap = false;
  };
  CUresult map_entry(const proto::ArrayMapEntry& w, CUarrayMapInfo* out, std::vector<TileOp>* ops);
  TileMaps plan_tiles(const std::vector<TileOp>& ops, bool applied) const;
  void commit_tiles(TileMaps& planned, std::uint64_t ctx, CUstream s);
  void drop_tile_maps(std::uint64_t resource);
  void release_held(std::uint64_t handle, std::uint64_t ctx, CUstream s);
  void reap_mem_releases();
  // Memory pools (pools.cc): the handle of a driver pool, made on first
  // sight; a location in the driver's numbering; pools the guest created go
  // when the worker does.
  std::uint64_t pool_handle(CUmemoryPool real, int device);
  CUresult pool_location(std::uint32_t type, std::int32_t id, CUmemLocation* out);
  void destroy_created_pools() noexcept;
  // Virtual memory the guest still holds (mappings, physical allocations,
  // reserved address ranges), which belongs to no context: given back at the end.
  void release_vmm() noexcept;
  // Pool sharing (pools.cc): destroying a guest handle (the driver's pool
  // goes with its last handle); what the driver says to an fd that is no
  // exported pool; a pool the driver destroyed leaves the registry and the
  // exports; hooks for frees and context teardown, as ipc_on_free and
  // ipc_drop_ctx (false: a sibling guest process still has the allocation
  // imported, its last free frees it).
  CUresult destroy_pool(std::uint64_t handle);
  // A pool's reserve (pools.cc): what the driver keeps in `pool` beyond what
  // is allocated from it, charged to the quota (may_shrink false: only ever
  // more, right after a free); an allocation's charge going to its pool when
  // it is freed; before a charge is refused, what the guest's pools keep
  // unused is given back.
  void settle_pool(CUmemoryPool pool, bool may_shrink);
  void pool_freed(DevRange& r);
  bool reclaim_pool_reserves();
  void drop_pool_reserve(CUmemoryPool pool);
  void settle_pools(bool may_shrink);
  CUresult not_an_exported_pool(unsigned long long flags);
  void pool_forget(CUmemoryPool real);
  bool pool_on_free(std::uint64_t base, std::uint64_t size);
  void pool_drop_ctx(std::uint64_t ctx, bool close_in_driver);
  // Whether IPC opens / pool imports of a sibling process hold an allocation
  // its owner freed (RangeKind::kFreed): the last of either frees it.
  bool ipc_holds(std::uint64_t base) const;
  bool pool_holds(std::uint64_t base) const;
  // CUDA IPC (ipc.cc): hooks for frees, destroys and context teardown.
  // Returns true when the caller should free the allocation now (false: an
  // IPC import in this worker still uses it, the last close frees it).
  bool ipc_on_free(std::uint64_t base);
  // True when the caller should destroy the driver's event now (false:
  // another guest handle of this worker still names it).
  bool ipc_on_event_destroy(std::uint64_t handle, CUevent real);
  // Closes what was opened in ctx and forgets IPC state of ctx's objects.
  void ipc_drop_ctx(std::uint64_t ctx, bool close_in_driver);
  // Device printf forwarding (cfg_.forward_stdout).
  void start_console();
  void drain_console();
  // The stages of the records a guest marked kRecTraceStages (its
  // IVCUDA_TRACE_STAGES), kept for its StageTrace question (stage_trace.cc).
  // stamps: taken, handler called, handler returned, reply published.
  struct StageBooks;
  void note_stages(const ring::Record& rec, const std::uint64_t (&stamps)[4]) noexcept;
  std::shared_ptr<StageBooks> stage_books_;  // made at the first marked record

#define IVCUDA_WORKER_DECL(name, req, rep, sync) CUresult on_##name(Call& c);
  IVCUDA_OPS(IVCUDA_WORKER_DECL)
#undef IVCUDA_WORKER_DECL


  WorkerConfig cfg_;
  // Before every record that holds a Charge, so that it outlives them.
  MemQuota quota_;
  // The memory view in the superblock (memory.cc, publish_mem_view): what
  // was last written there.
  void publish_mem_view(const std::uint64_t* device_total, const std::uint64_t* device_free);
  std::uint64_t view_limit_ = 0, view_used_ = 0;
  bool view_usable_ = false;
  std::uint32_t view_seq_ = 0;  // even between writes
  // The view answers for the guest only while nothing would change the
  // figures at a cuMemGetInfo: no pool reserves to settle, no sparse
  // mappings' releases pending (on_MemGetInfo does both first).
  bool mem_view_usable() const noexcept { return pool_reserves_.empty() && pending_releases_.empty(); }
  // The context the worker starts with (the first GPU's primary, which
  // holds the arena's registration) against the guest's quota.
  Charge context_charge_;
  // Pools' reserves (settle_pool), by the driver's pool.
  std::map<CUmemoryPool, Charge> pool_reserves_;
  // Not CUDA_SUCCESS: the guest's quota could not cover the worker's
  // context, so the worker made none and every call answers this.
  CUresult refused_ = CUDA_SUCCESS;
  DriverApi cu_{};
  sys::Mapping bar_;
  ring::Layout l_;
  std::unique_ptr<UringWaiter> waiter_;
  std::vector<std::unique_ptr<Channel>> channels_;
  // A VM's per-process worker: the owners' version last scanned, and
  // whether it has served a channel yet (it ends when its last one goes).
  std::uint32_t vm_version_ = ~0u;
  bool vm_had_channels_ = false;
  void vm_detach(Channel& ch);
  std::vector<CUdevice> devices_;  // guest ordinal -> driver device
  CUcontext current_ = nullptr;
  CUcontext arena_ctx_ = nullptr;
  std::uint64_t arena_dev_ = 0;    // device address of the arena's first byte
  bool arena_registered_ = false;  // all of it, at start
  // Registered pieces (on use): arena offset -> bytes. The device address of
  // a piece is its host address (CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM),
  // so the arena keeps one device alias, arena_dev_, however it is pinned.
  std::map<std::uint64_t, std::uint64_t> arena_pinned_;
  bool arena_on_use_ = false;
  // The driver's registration of host memory at p, in the arena's context,
  // and the device alias it gives p (0 if none).
  CUresult register_host(void* p, std::uint64_t bytes, unsigned flags);
  void unregister_host(void* p) noexcept;
  std::uint64_t host_alias(void* p);
  CUresult pin_arena(std::uint64_t off, std::uint64_t bytes);
  template <class F>
  CUresult as_worker(F&& f);
  void unpin_arena(std::uint64_t off);
  ring::ArenaAllocator pool_;

  HandleTable<CtxEntry> ctxs_{proto::HandleKind::kContext};
  HandleTable<ModuleEntry> modules_{proto::HandleKind::kModule};
  HandleTable<FuncEntry> funcs_{proto::HandleKind::kFunction};
  HandleTable<StreamEntry> streams_{proto::HandleKind::kStream};
  HandleTable<EventEntry> events_{proto::HandleKind::kEvent};
  HandleTable<PoolEntry> pools_{proto::HandleKind::kMemPool};
  HandleTable<GraphEntry> graphs_{proto::HandleKind::kGraph};
  HandleTable<ExecEntry> execs_{proto::HandleKind::kGraphExec};
  HandleTable<MemHandleEntry> mem_handles_{proto::HandleKind::kMemHandle};
  HandleTable<NodeEntry> nodes_{proto::HandleKind::kGraphNode};
  HandleTable<UserObjEntry> user_objs_{proto::HandleKind::kUserObject};
  HandleTable<LinkEntry> links_{proto::HandleKind::kLink};
  HandleTable<GreenEntry> greens_{proto::HandleKind::kGreenCtx};
  HandleTable<CUdevResourceDesc> resource_descs_{proto::HandleKind::kResourceDesc};
  std::set<std::string, std::less<>> issued_resources_;  // CUdevResource images (green.cc)
  std::map<CUgraphNode, std::uint64_t> node_of_;  // driver node -> its handle
  std::map<std::uint64_t, std::unique_ptr<HostNodeSlot>> host_slots_;  // by BAR offset
  // Graphs a capture made, given a handle before the capture ended
  // (CaptureGraphInfo): stream -> graph handle. A failed end destroys them.
  std::map<CUstream, std::uint64_t> capture_graphs_;
  HandleTable<ArrayEntry> arrays_{proto::HandleKind::kArray};
  HandleTable<MipmapEntry> mipmaps_{proto::HandleKind::kMipmappedArray};
  std::map<std::uint64_t, TexEntry> tex_objects_;  // driver value -> what it is
  std::map<std::uint64_t, std::uint64_t> reservations_;  // cuMemAddressReserve: base -> size
  TileMaps tile_maps_;          // sparse array regions the guest mapped (arrays.cc)
  std::size_t tile_boxes_ = 0;  // regions in tile_maps_, bounded
  struct PendingRelease {       // a held driver reference, released once `done` completed
    CUevent done = nullptr;
    std::uint64_t ctx = 0;      // the context `done` belongs to
    CUmemGenericAllocationHandle real = 0;
  };
  std::vector<PendingRelease> pending_releases_;
  // What is shared with the tenant (worker_common.cc): driver file
  // descriptors this worker exported, by the token the guest holds, and its
  // line to the daemon (fd_broker.h) for the tenant's deposits and registry.
  BrokerClient broker_;
  struct Export {
    sys::UniqueFd fd;
    std::uint64_t value = 0;       // what an importer gets with the fd (an allocation's size)
    CUmemoryPool pool = nullptr;   // a pool's export (pools.cc): the driver's pool while it lives
    std::uint32_t proc = 0;        // a pool's export: the guest process that exported it
    // An allocation's export: the fd is a reference to the memory, so its
    // charge lives as long as the export (quota.h).
    std::shared_ptr<Charge> charge{};
  };
  static constexpr std::size_t kMaxExports = 1024;
  std::map<BrokerToken, Export> exports_;
  // Keeps `fd` under a fresh token and leaves a dup with the daemon for the
  // tenant's other workers. OUT_OF_MEMORY: the guest's exports, or its
  // tenant's, are at their cap; OPERATING_SYSTEM: no token could be drawn.
  CUresult share_fd(sys::UniqueFd fd, std::uint64_t value, std::shared_ptr<Charge> charge, BrokerToken* token,
                    Export** out = nullptr);
  // The fd a token names: one of this worker's exports (*own set), or a dup
  // the daemon holds for this tenant (*fetched owns it). -1: neither.
  int shared_fd(const BrokerToken& token, Export** own, sys::UniqueFd* fetched, std::uint64_t* value);
  // The tenant's registry (tenant_share.h): the daemon's over the line, or,
  // without one, this worker's own (only its own guest processes share).
  ShareRegistry local_share_;
  Result<ShareTicket> share_publish(const ShareEntry& e);
  std::optional<ShareFound> share_lookup(ShareKind kind, const ShareTicket& t);
  void share_withdraw(ShareKind kind, std::uint64_t key);
  std::map<std::uint64_t, MappingEntry> mappings_;        // cuMemMap: address -> mapping
  std::vector<std::uint64_t> primary_;          // guest ordinal -> primary ctx handle
  std::map<std::uint64_t, DevRange> ranges_;    // device address -> range the guest owns
  CUresult pending_ = CUDA_SUCCESS;             // first error of a posted op
  // Posted copies (memory.cc), per guest context: spare events, and the
  // event behind its newest synchronous HtoD still in flight, which work in
  // the context's streams is ordered after (StreamEntry::copy_fence). Fence
  // numbers are the worker's, never reused.
  struct CopyCtx {
    std::vector<CUevent> spare;
    CUevent fence = nullptr;
    std::uint64_t fence_seq = 0;
    // Page-locked landing places for small reads back (on_MemcpyDtoHInline),
    // one per channel, made on first use. `busy` from the copy's issue to
    // its reply; one still busy at the channel's next read back was left by
    // an abandoned call, and is retired (its copy may still be landing) to
    // be freed with the context's copies.
    struct Landing {
      void* buf = nullptr;
      bool busy = false;
    };
    std::map<std::uint32_t, Landing> landings;
    std::vector<void*> retired;
  };
  // The channel's landing place in `ctx` (current), marked busy; null when
  // page-locked memory cannot be had (the caller copies the slow way).
  void* landing_for(Channel& ch, std::uint64_t ctx);
  void free_landings(CopyCtx& cc) noexcept;
  // The reply body of a DtoHInline whose bytes are in the channel's landing
  // place (gone with its context: an error).
  CUresult landed_body(const proto::ReqCopy& r, std::uint32_t channel, std::vector<std::byte>* body);
  std::map<std::uint64_t, CopyCtx> copy_ctxs_;
  std::uint64_t copy_fences_ = 0;
  // The capture mode the driver holds for the worker's thread now.
  CUstreamCaptureMode driver_capture_mode_ = CU_STREAM_CAPTURE_MODE_GLOBAL;
  // Captures under way (begun, not yet ended): which guest thread (channel)
  // began each, in which mode.
  struct CaptureEntry {
    std::uint32_t channel = 0;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  };
  std::map<CUstream, CaptureEntry> captures_;
  CUstreamCaptureMode effective_capture_mode(const Channel& ch) const;
  // True (logged, rate-limited) when `table` holds `limit` objects already:
  // the call then answers CUDA_ERROR_OUT_OF_MEMORY before the driver sees it.
  template <class T>
  bool full(const HandleTable<T>& table, std::uint32_t limit, const char* what) noexcept {
    if (table.size() < limit) return false;
    log_limit(what, limit);
    return true;
  }
  void log_limit(const char* what, std::uint32_t limit) noexcept;
  std::uint64_t errors_logged_ = 0;
  bool stop_ = false;
  bool hung_up_ = false;  // the loop ended on the guest's hang-up (not stop())
  bool released_ = false;  // release_for_recycle() ran
  // A VM's worker whose process exited: the supervisor asked it to let the
  // process go (VmShared::Slot::recycle) and the loop ended for that.
  bool recycle_asked_ = false;
  // A VM's process said goodbye on its last channel (vm_detach).
  bool process_done_ = false;
  // watch_guest_death's thread runs: a VM's recycled worker keeps its
  // predecessor's, which watches the same line to the supervisor.
  bool death_watched_ = false;
  bool evicted_ = false;
  // The guest's end, shared with watch_guest_death's thread (it outlives a
  // recycled worker): kLive; kGone (the thread saw the hang-up and waits a
  // moment for the request loop, which is quiet, to take the end as clean);
  // kEnding (the thread ends the process); kRecycling (the request loop took it).
  enum : int { kLive, kGone, kEnding, kRecycling };
  std::shared_ptr<std::atomic<int>> death_ = std::make_shared<std::atomic<int>>(kLive);
  // Set while the request loop is idle (from its first pass that found no
  // record) with nothing parked, copying or polling: only then does the
  // thread wait for it (a busy one, a few milliseconds for its call to end).
  std::shared_ptr<std::atomic<bool>> quiet_ = std::make_shared<std::atomic<bool>>(false);
  // Records the request loop has taken up: one taken after the hang-up is the
  // dead guest's posted work, and the thread ends the process.
  std::shared_ptr<std::atomic<std::uint64_t>> taken_ = std::make_shared<std::atomic<std::uint64_t>>(0);
  void evict();
  // ivcudactl suspend (host-daemon/daemon/suspend.h): while the board says
  // so, no record is taken and no driver call made - the process may be
  // locked or checkpointed, and driver 580 fails a locked process's calls -
  // while the heartbeat goes on and a hang-up still ends the process.
  void hold_for_suspend();
  bool held_ = false;
  // Counts a handled call on the status board (calls, copied bytes, errors).
  void account(const ring::Record& rec, CUresult st) noexcept;
  // When the current wait for a parked synchronise began (zero: none).
  std::chrono::steady_clock::time_point parked_since_{};
  // How long a parked synchronise is polled without sleeping.
  static constexpr std::chrono::milliseconds kParkedSpin{20};
  // Records one pass of serve_once() takes at most.
  static constexpr int kRecordsPerPass = 1024;
  sys::UniqueFd console_rd_;   // read end of the pipe fd 1 points at
  std::string console_;        // drained, not yet sent to the guest

  // CUDA IPC (ipc.cc). An opened range, by its device address: who opened
  // it how often (guest process -> count), and whether it is this worker's
  // own allocation (a sibling guest process of a VM opened it).
  struct IpcOpen {
    std::map<std::uint32_t, unsigned> opens;
    bool own = false;
  };
  std::map<std::uint64_t, IpcOpen> ipc_opens_;
  // Guest event handles per driver event, where more than one names it (an
  // event a sibling process opened through IPC in this worker).
  std::map<CUevent, unsigned> ipc_event_names_;
  // What this worker has in the tenant's registry (so that frees and
  // destroys of everything else do not search it): allocation bases and
  // guest event handles.
  std::set<std::uint64_t> ipc_exported_mem_;
  std::set<std::uint64_t> ipc_exported_events_;

  // Memory pools shared between guest processes (pools.cc). Guest handles
  // naming each created or imported driver pool: an alias keeps its pool
  // alive after the pool's own handle is destroyed.
  std::map<CUmemoryPool, unsigned> pool_names_;
  // Pointers exported into the tenant's registry, by address: their pool.
  std::map<std::uint64_t, CUmemoryPool> pool_ptr_exports_;
  // Pointers imported, by address: which guest processes imported them how
  // often, and whether it is this worker's own allocation (imported by a
  // sibling process through an alias; the driver was not asked).
  struct PoolImport {
    std::map<std::uint32_t, unsigned> by;
    bool own = false;
  };
  std::map<std::uint64_t, PoolImport> pool_imports_;

  // NVML for the guest (nvml.cc): the host's library and device handles,
  // made when the worker starts, before its sandbox; the pid the guest process gave in its hello
  // (process mode: the pid its entries of the process lists carry).
  struct NvmlState;
  std::shared_ptr<NvmlState> nvml_;
  long long init_ms_ = 0;  // the driver's start, for the log
  std::uint32_t hello_pid_ = 0;
  NvmlState& nvml_state();
  int nvml_answer(const proto::ReqNvml& r, std::uint32_t cap, proto::RepNvml* rep, std::vector<std::byte>* out);
};

}  // namespace ivcuda::host
