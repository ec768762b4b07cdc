// The GPU test double's emulated driver state. Internal: nothing here is exported.
//
// One process-wide State behind one mutex: the double is for tests, where simplicity beats
// parallelism. Handles (contexts, streams, events, modules, functions) are fresh integers
// never reused, so a stale or foreign handle is detected rather than dereferenced.
#pragma once

#include <cuda.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "identity.h"
#include "image.h"

namespace ivcuda::gpu_double {

inline constexpr std::size_t kDeviceAllocAlign = 256;
// Where device memory (api_memory.cc) and imported IPC memory (api_ipc.cc) are mapped: windows of
// their own, away from where processes keep their own memory, as a GPU's addresses are. Under
// ThreadSanitizer a hint outside its application ranges is dropped and the kernel places the
// mapping in the top terabyte, where the guest process's own mappings are too: now and then the
// first one landed on one of the guest's (the transport run's staged copies under TSan: eight
// tries in a row, each placed next to the last, so the guest warned and misread a pointer).
// There the windows lie in TSan's low application range, below 512 GiB.
#if defined(__SANITIZE_THREAD__)
inline constexpr std::uintptr_t kDeviceWindowBase = 0x002000000000, kIpcWindowBase = 0x006000000000;
#else
inline constexpr std::uintptr_t kDeviceWindowBase = 0x3f0000000000, kIpcWindowBase = 0x3e8000000000;
#endif
inline constexpr std::uintptr_t kDeviceWindow = std::uintptr_t{256} << 30;
inline constexpr std::size_t kHostAllocAlign = 4096;
inline constexpr std::size_t kPitchAlign = 512;
inline constexpr int kLeastStreamPriority = 0;
inline constexpr int kGreatestStreamPriority = -5;
inline constexpr int kMaxThreadsPerBlock = 1024;
inline constexpr int kDefaultSharedPerBlock = 48 * 1024;
inline constexpr int kMaxSharedPerBlockOptin = 227 * 1024;
// Streaming multiprocessors per device: CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT (api_device.cc)
// and the whole device's CU_DEV_RESOURCE_TYPE_SM resource (api_green.cc).
inline constexpr unsigned kSmCount = 132;

using Handle = std::uintptr_t;

// kMapped: a VMM mapping that some device may access (cuMemSetAccess); it belongs to no
// context, as in CUDA, and its storage is the mapping's own (api_vmm.cc).
// kIpc: another process's device allocation opened through cuIpcOpenMemHandle (api_ipc.cc).
// kPoolImport: a pool allocation imported through cuMemPoolImportPointer (api_memory.cc),
// freed with cuMemFree or cuMemFreeAsync.
enum class MemKind { kDevice, kPinnedHost, kRegisteredHost, kModuleGlobal, kMapped, kIpc, kPoolImport };

struct Allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;       // what the caller asked for: accesses may not pass it
  std::size_t accounted = 0;  // device memory charged against the 4 GiB
  MemKind kind = MemKind::kDevice;
  Handle ctx = 0;
  int device = 0;
  unsigned flags = 0;
  void* storage = nullptr;  // std::free'd on release; null for registered host memory
  std::size_t mapped = 0;   // device memory: munmap'ed bytes instead of std::free
  Handle pool = 0;          // stream-ordered allocations: the pool they came from
  // CUDA IPC (api_ipc.cc) and pool pointer exports. An exported device allocation is backed
  // by this memfd (closed on release); an opened or imported one remembers whose memfd it
  // maps and how often it was opened.
  int ipc_fd = -1;
  int ipc_pid = 0;
  std::uint64_t ipc_ino = 0;
  unsigned ipc_opens = 0;
};

// A memory pool: each device's default pool, and pools made with cuMemPoolCreate.
// Stream-ordered allocations are ordinary device allocations that remember their pool;
// what is freed into a pool with a release threshold stays counted as the device's used
// memory, up to the threshold (`kept`), until trimmed or reused. A destroyed pool is gone at once;
// its allocations stay valid until freed, as on the driver. A pool imported from a
// shareable handle (cuMemPoolImportFromShareableHandle) names the process and pool it
// came from, and only imports pointers of that pool.
struct Pool {
  int device = 0;
  cuuint64_t release_threshold = 0;
  cuuint64_t kept = 0;  // freed bytes the pool holds on to (its reserve beyond what is allocated)
  int reuse[3] = {1, 1, 1};  // FOLLOW_EVENT_DEPENDENCIES, ALLOW_OPPORTUNISTIC, ALLOW_INTERNAL_DEPENDENCIES
  cuuint64_t used_high = 0;
  bool created = false;       // cuMemPoolCreate (a default pool cannot be destroyed)
  unsigned handle_types = 0;  // CUmemAllocationHandleType bits
  std::size_t max_size = 0;   // 0: no limit but the device's memory
  std::map<int, CUmemAccess_flags> access;  // other devices' access (none unless set)
  bool imported = false;
  bool exported = false;    // its handle was exported: only then are its pointers (as the driver)
  int origin_pid = 0;       // imported: the exporting process
  Handle origin_pool = 0;   // imported: the pool there
};

// Virtual memory management (api_vmm.cc). Physical memory is a memfd, so that several
// mappings of it alias and an exported fd is the memory itself; reservations are PROT_NONE
// address space. None of it belongs to a context.
inline constexpr std::size_t kVmmGranularity = std::size_t{2} << 20;
struct PhysicalMem {
  std::size_t size = 0;
  CUmemAllocationProp prop{};
  int fd = -1;
  std::size_t accounted = 0;  // charged against its device; imports charge nothing again
  // The driver's two counts: the caller's handle references (cuMemCreate, import and
  // cuMemRetainAllocationHandle add one, cuMemRelease drops one; at 0 the handle is dead to
  // the caller), and mappings, which keep the memory alive after the last release.
  unsigned refs = 0;
  unsigned maps = 0;  // VA mappings and sparse-array tiles (api_arrays.cc) backed by it
  unsigned char* view = nullptr;  // a host mapping of the memfd for array tiles, made on first use
};
struct VmmMapping {
  std::size_t size = 0;
  Handle mem = 0;
  std::array<unsigned char, kMaxDevices> access{};  // CUmemAccess_flags, per device
};

// Graphs (api_graph.cc). A graph is a set of nodes with dependencies; a node is either
// built explicitly (kernel, memcpy, memset, empty, child graph, event record/wait: its
// parameters are kept) or recorded by stream capture (a closure that repeats the call, made
// to depend on the capture's previous node). An executable graph is a snapshot of the
// nodes in a topological order (children snapshotted likewise), and a launch runs them in
// that order (work runs at once in the double, so order is all a graph promises).
using Node = std::function<CUresult()>;
struct Capture {
  Handle graph = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  bool invalidated = false;
  unsigned long long id = 0;
  std::thread::id owner;  // the thread that began it
  std::vector<Handle> deps;  // what the next captured node depends on
  std::vector<CUgraphNode> deps_out;  // cuStreamGetCaptureInfo's array
  std::vector<CUgraphEdgeData> data_out;
  bool own_graph = true;     // false: cuStreamBeginCaptureToGraph's graph
};
struct GraphNode {
  Handle graph = 0;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  std::vector<Handle> deps;  // incoming edges, in the order they were added
  std::vector<CUgraphEdgeData> dep_data;
  Handle origin = 0;         // in a clone: the node it was cloned from
  Node captured;             // a captured call (type EMPTY as far as queries go)
  CUfunction func = nullptr;  // kernel
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shmem = 0;
  std::vector<unsigned char> args;  // packed as the PTX lays them out
  std::vector<void*> argv;          // what cuGraphKernelNodeGetParams hands out
  CUDA_MEMSET_NODE_PARAMS memset{};
  CUDA_MEMCPY3D copy{};
  Handle child = 0;          // child graph, owned by the node
  CUevent event = nullptr;
  CUDA_HOST_NODE_PARAMS host{};
  CUDA_MEM_ALLOC_NODE_PARAMS alloc{};  // accessDescs points into alloc_access
  std::vector<CUmemAccessDesc> alloc_access;
  CUdeviceptr freed = 0;  // a free node's address
  // Conditional nodes: the handle, the CUgraphConditionalNodeType, the bodies (owned).
  CUgraphConditionalHandle cond = 0;
  CUgraphConditionalNodeType cond_type = CU_GRAPH_COND_TYPE_IF;
  std::vector<Handle> bodies;
  std::map<int, CUkernelNodeAttrValue> attrs;  // kernel node attributes set (kept, not applied)
};
// A conditional handle: nothing in the double's kernels sets one, so a conditional node
// always sees the default value.
struct CondHandle {
  Handle graph = 0;
  unsigned default_value = 0;
  unsigned flags = 0;
};
struct Graph {
  Handle ctx = 0;
  std::vector<Handle> nodes;  // in creation order
  Handle owner_node = 0;      // a child graph node's graph
  std::map<Handle, unsigned> user_refs;  // user object -> references the graph holds
};
struct UserObject {
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  unsigned long long refs = 0;
};
struct ExecStep;
struct Exec {
  Handle ctx = 0;
  Handle graph = 0;
  unsigned long long flags = 0;
  std::vector<ExecStep> steps;  // topological order
  std::map<Handle, unsigned> user_refs;  // what the graph held when instantiated
};
struct ExecStep {
  Handle node = 0;            // the node of the instantiated graph it stands for
  GraphNode params;
  std::shared_ptr<Exec> child;
  std::vector<std::shared_ptr<Exec>> bodies;  // a conditional node's
  unsigned cond_value = 0;                   // its handle's default value
  bool enabled = true;
};

struct Context {
  int device = 0;
  unsigned flags = 0;
  bool primary = false;
  CUfunc_cache cache = CU_FUNC_CACHE_PREFER_NONE;                    // cuCtxSetCacheConfig's
  // Primary contexts only. Retain activates, the last release or a reset deactivates; a
  // reset keeps the count (the real driver still accepts the matching releases).
  unsigned refs = 0;
  bool active = false;
};

struct Stream {
  Handle ctx = 0;
  unsigned flags = 0;
  int priority = 0;
  unsigned long long id = 0;
  std::map<unsigned, CUstreamAttrValue> attrs;  // cuStreamSetAttribute's, by CUstreamAttrID
  // The green context it was made in (cuGreenCtxStreamCreate, or cuStreamCreate while its
  // converted context was current), or 0. Its ctx is then the device's primary context; once
  // the green context is destroyed the stream lingers, with ctx 0, for cuStreamDestroy alone.
  Handle green = 0;
};

struct Event {
  Handle ctx = 0;
  unsigned flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point when{};
};

// Green contexts (api_green.cc): a set of the device's SMs over its primary context, which it
// retains while it lives. Its converted context (cuCtxFromGreenCtx, made once with it) is a
// CUcontext that is no entry of State::contexts: wherever a context is used for work it stands
// for the device's primary context (current_context, resolve_context), so what is made while it
// is current belongs to the primary context, except streams, which remember the green context.
struct Green {
  int device = 0;
  unsigned sm_count = 0;
  Handle converted = 0;
  unsigned long long id = 0;  // cuGreenCtxGetId
};
// A resource descriptor (cuDevResourceGenerateDesc): the SMs a green context gets. The driver
// frees none before the process ends, nor does the double.
struct ResourceDesc {
  int device = 0;
  unsigned sm_count = 0;
};

struct Module {
  Handle ctx = 0;
  Handle library = 0;  // the library it instantiates, or 0
  PtxImage image;
  std::map<std::string, Handle, std::less<>> functions;
  std::map<std::string, std::uintptr_t, std::less<>> globals;  // name -> allocation base
};

// Libraries are context-independent: each context that uses one gets its own module
// (globals included), made on first use there.
struct Library {
  PtxImage image;
  std::map<Handle, Handle> modules;                    // context -> module
  std::map<std::string, Handle, std::less<>> kernels;  // entry name -> kernel
};

struct Kernel {
  Handle library = 0;
  std::size_t entry = 0;  // index into the library's image.entries
};

struct Function {
  Handle module = 0;
  std::size_t entry = 0;  // index into the module's image.entries
  std::array<int, CU_FUNC_ATTRIBUTE_MAX> settable{};
};

// IVCUDA_DOUBLE_LEDGER=FILE: the double's processes (one per ivcudad
// worker) share one "GPU": each publishes its device memory in use in FILE,
// and cuMemGetInfo's free memory is what every live process leaves, as on a
// real GPU, where the memory of a process that ends returns at once. Tests
// see a reclaimed worker in it. Unset: each process has the GPU to itself.
// The bytes the other live processes hold on `device` (0 without a ledger).
std::size_t ledger_others(int device);
// Publishes this process's use of `device` (no-op without a ledger).
void ledger_publish(int device, std::size_t used);
// Publishes how many contexts this process holds on `device` (the NVML
// double lists every process with one).
void ledger_contexts(int device, unsigned count);
// The live entry of another process `pid` (api_checkpoint.cc), or null.
Ledger::Entry* ledger_entry_of(int pid);
// Starts this process's checkpoint thread for its ledger entry `e`
// (api_checkpoint.cc): it does the driver's part of a checkpoint or a
// restore inside the process when another process asks.
void start_checkpoint_thread(Ledger::Entry* e);

// Every call this process makes counts itself in its ledger entry while it
// runs: a lock another process asks for (cuCheckpointProcessLock) waits for
// the calls under way - a synchronise for as long as it waits - and a call
// that comes meanwhile waits for the lock. While the process is locked or
// checkpointed its calls fail with CUDA_ERROR_OPERATING_SYSTEM (refused()),
// as driver 580's do (measured on the H200, 2026-12-06: a locked worker's
// cuMemGetInfo; tests/gpu/run_all.sh checkpoint), whatever the documentation
// says of blocking: a process must make none then. Only a thread's
// outermost gate counts. Nothing without a ledger.
class ApiGate {
 public:
  ApiGate() noexcept;
  ~ApiGate();
  ApiGate(const ApiGate&) = delete;
  ApiGate& operator=(const ApiGate&) = delete;
  bool refused() const noexcept { return refused_; }

 private:
  Ledger::Entry* e_ = nullptr;
  bool refused_ = false;
};

struct State {
  std::mutex mu;
  bool initialized = false;
  int device_count = 0;
  std::vector<Handle> primary;    // per device
  std::vector<std::size_t> used;  // device memory in use, per device, contexts' included
  std::vector<unsigned> held_contexts;  // per device: created contexts and active primary ones
  // A faulting kernel poisons its device for the rest of the process, as on a GPU (the real
  // driver then fails even cuCtxCreate): every later call that does work there fails.
  std::vector<CUresult> fault;  // per device
  // A kernel of a module that calls device malloc was launched: the heap's
  // size is fixed from then on, as on a GPU (cuCtxSetLimit refuses it) until
  // the primary context is reset.
  bool heap_used = false;
  std::unordered_map<Handle, Context> contexts;
  std::map<std::uintptr_t, Allocation> allocations;  // by base; ranges never overlap
  // Small device blocks a context freed, kept with their bytes, as the
  // driver's suballocator keeps them: the context's next allocation of that
  // size gets one back unscrubbed (what a recycled worker that keeps its
  // context must zero; host-daemon/worker/keep.cc). The context's end
  // scrubs them (release_context_resources). By context, then rounded size.
  struct FreedBlock {
    void* storage = nullptr;
    std::size_t mapped = 0;
  };
  std::map<Handle, std::multimap<std::size_t, FreedBlock>> freed_blocks;
  std::size_t freed_bytes = 0;  // all of them, at most kFreedKept
  static constexpr std::size_t kFreedSmall = 2u << 20, kFreedKept = 64u << 20;
  std::unordered_map<Handle, Stream> streams;
  Stream null_stream;  // the legacy and per-thread streams' attributes
  std::unordered_map<Handle, Event> events;
  // IVCUDA_GPU_DOUBLE_KERNEL_US: until when each stream is still "running" its last kernel,
  // by (context, stream handle; 0 for the legacy and null streams).
  std::map<std::pair<Handle, Handle>, std::chrono::steady_clock::time_point> busy_until;
  std::unordered_map<Handle, Module> modules;
  std::unordered_map<Handle, Function> functions;
  std::unordered_map<Handle, Library> libraries;
  std::unordered_map<Handle, Kernel> kernels;
  std::unordered_map<Handle, Pool> pools;
  std::vector<Handle> default_pool;  // per device, made on first use
  std::vector<Handle> current_pool;  // per device; 0 = the default
  std::unordered_map<Handle, Capture> captures;  // by stream handle
  std::unordered_map<Handle, Graph> graphs;
  std::unordered_map<Handle, GraphNode> graph_nodes;
  std::unordered_map<CUgraphConditionalHandle, CondHandle> cond_handles;
  std::unordered_map<Handle, UserObject> user_objects;
  std::vector<UserObject> dead_user_objects;  // destructors to run once the lock is released
  std::unordered_map<Handle, Exec> execs;        // executable graphs
  std::unordered_map<Handle, PhysicalMem> physical;   // cuMemCreate handles
  std::map<std::uintptr_t, std::size_t> reservations;  // base -> size; never overlap
  std::map<std::uintptr_t, VmmMapping> mappings;       // by base; never overlap
  std::unordered_map<Handle, Green> greens;
  std::unordered_map<Handle, Handle> converted;  // converted context -> its green context
  std::unordered_map<Handle, int> dead_converted;  // converted contexts of destroyed green contexts -> device
  std::unordered_map<Handle, ResourceDesc> resource_descs;
  std::unordered_map<Handle, unsigned long long> context_ids;  // cuCtxGetId's, given on first ask
  unsigned long long next_green_id = 1;
  unsigned long long next_split_id = 1;  // cuDevSmResourceSplitByCount calls
  unsigned long long next_context_id = 1;
  unsigned long long next_capture_id = 1;
  Handle next_handle = 0x1000000;
  unsigned long long next_stream_id = 16;

  Handle new_handle() { return next_handle += 0x10; }

  // The allocation holding [p, p + n), or null. n == 0 asks only about p.
  const Allocation* find(std::uintptr_t p, std::size_t n = 0) const;
  // Frees an allocation's storage and forgets it.
  void release(std::map<std::uintptr_t, Allocation>::iterator it);
  // A block of `mapped` bytes ctx freed (freed_blocks), taken back, or null.
  void* reuse_freed(Handle ctx, std::size_t mapped);
  // Destroys everything created in ctx (allocations, streams, events, modules, arrays).
  void release_context_resources(Handle ctx);
  // The sticky fault of ctx's device, or CUDA_SUCCESS.
  CUresult fault_of(Handle ctx) const {
    return fault[static_cast<std::size_t>(contexts.at(ctx).device)];
  }
};

State& state();

// This thread's context stack; the back is the current context.
std::vector<Handle>& ctx_stack();

// The calling thread's current context, usable for new work: INVALID_CONTEXT when there is
// none (or it was destroyed), CONTEXT_IS_DESTROYED for an inactive primary context, the
// device's sticky error once a kernel faulted on it.
CUresult work_context(State& s, Handle* out);
// As work_context, but a poisoned context is still returned (for queries). A green context's
// converted context stands for its device's primary context; once the green context is
// destroyed it answers CONTEXT_IS_DESTROYED.
CUresult current_context(State& s, Handle* out);
// The context a CUcontext argument names: itself, or for a live green context's converted
// context the device's primary context. INVALID_CONTEXT for anything else (null included).
CUresult resolve_context(const State& s, Handle h, Handle* out);
// The green context whose converted context is current on this thread, or 0.
Handle current_green(const State& s);
// A stream's green context is gone: every call but cuStreamDestroy answers this.
inline bool orphaned(const Stream& st) { return st.green != 0 && st.ctx == 0; }
// Whose a stream is, as cuStreamGetCtx reports it: its context as the caller names it (for a
// green context's stream, that green context's converted context) and its green context or 0;
// for the special streams the current context's, as made current (api_green.cc).
CUresult stream_owner(State& s, CUstream h, Handle* ctx, Handle* green);
// Retains the device's primary context, activating it (and charging its memory) on the first
// retain; releases one retain, resetting it at the last (api_context.cc). Under the state lock.
CUresult retain_primary(State& s, int dev);
CUresult release_primary(State& s, int dev);
// Checks a stream handle: 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD always work;
// anything else must be a live stream. Like the real driver, copies and launches accept a
// stream of another context (work runs at once, so whose queue it joins does not matter).
CUresult check_stream(const State& s, CUstream stream);
// Stream capture. Called under the state lock by work on `stream`: when the stream is
// capturing, `node` (which repeats the call) is recorded instead of running and *st says
// what the call returns. Replays run with capture bypassed.
bool record_if_capturing(State& s, CUstream stream, Node node, CUresult* st);
// For the API entry points: takes the lock itself.
bool capture_call(CUstream stream, Node node, CUresult* st);
// This thread's capture mode (cuThreadExchangeStreamCaptureMode).
CUstreamCaptureMode& thread_capture_mode();
// A potentially unsafe call (an allocation) while captures run: CUDA's rules
// by this thread's mode and each capture's mode and thread. When the call is
// prohibited, the captures that prohibit it are invalidated and the call
// answers CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. Under the state lock.
CUresult unsafe_during_capture(State& s);
// Runs an executable graph's steps in order, outside the state lock, with capture
// bypassed; stops at the first error (api_graph.cc).
CUresult run_exec(const Exec& exec);
// Runs fn with capture bypassed (what a replayed call must not record again).
CUresult replaying(const std::function<CUresult()>& fn);
// Drops references to a user object; at zero its destructor is queued (under the state
// lock), to run from run_user_destructors() after it.
void release_user_object(State& s, Handle obj, unsigned long long count);
void run_user_destructors();
// Destroys a graph and its nodes (and the child graphs they own). Under the state lock.
void destroy_graph(State& s, Handle g);
// Kernel arguments as a launch packs them, and where each parameter lies in the packed
// buffer (api_module.cc). Under the state lock.
CUresult pack_kernel_args(State& s, CUfunction f, void** params, void** extra, std::vector<unsigned char>* out);
CUresult kernel_arg_offsets(State& s, CUfunction f, std::vector<std::size_t>* out);
// A graph allocation node's memory: device memory of ctx, made when the node is (the
// double backs it for the context's life; launches do not allocate) (api_memory.cc).
CUresult graph_mem_alloc(State& s, Handle ctx, std::size_t bytes, CUdeviceptr* out);

// Sharing device memory with other processes (api_ipc.cc). make_shareable moves a device
// allocation onto a memfd in place (contents copied, mapped over the same addresses; under
// the state lock, so no access sees the move); false if the system refused. map_shared maps
// another process's (or this one's) memfd, named by pid, fd number and inode, as a new
// allocation of `kind` in ctx: the exporter's /proc/PID/fd/N (same user, or root as in CI).
bool make_shareable(Allocation& a);
struct SharedMemRef {
  std::int32_t pid;
  std::int32_t fd;
  std::uint64_t ino;
  std::uint64_t size;    // the allocation's size, as accesses are bounded
  std::uint64_t mapped;  // the memfd's length
};
CUresult map_shared(State& s, Handle ctx, const SharedMemRef& ref, MemKind kind, std::uintptr_t* out);
// Physical memory behind sparse and deferred-mapping arrays (api_arrays.cc; api_vmm.cc keeps
// the memory): the caller's live allocation or null, its bytes as the host sees them, and
// the references array tiles hold (a tile keeps its memory alive, as a VA mapping does).
PhysicalMem* held_physical(State& s, CUmemGenericAllocationHandle h);
unsigned char* physical_view(State& s, Handle mem);
void physical_ref(State& s, Handle mem);
void physical_unref(State& s, Handle mem);

// [p, p + n) must lie in one tracked allocation (device, pinned, registered or a module
// global): what a device pointer may reach. A range outside them is noted as a stray and,
// in the HMM-like mode, accepted where its pages are mapped (strays.h).
// `file` and `line` name the caller's line in a stray's record (g++ and clang take both
// builtins as the call site's when they are default arguments).
CUresult check_device_range(const State& s, CUdeviceptr p, std::size_t n, const char* file = __builtin_FILE(),
                            unsigned line = __builtin_LINE());

template <class T>
T* to_handle(Handle h) {
  return reinterpret_cast<T*>(h);
}
template <class T>
Handle from_handle(T* p) {
  return reinterpret_cast<Handle>(p);
}

void log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// IVCUDA_GPU_DOUBLE_FUZZ=1: a fuzzer drives the double (tests/fuzz). Nothing
// will ever satisfy a wait on guest memory there and every input must finish
// at once, so waits give up at their first check, spins do not sleep, and
// nothing is logged (a fuzzer's inputs would flood stderr). cuInit, which
// the harness's worker calls once per input, clears sticky faults. A device
// has 64 MiB (total_mem()): work on memory is done by the CPU here, and an
// input must not spend seconds on a memset of gigabytes.
bool fuzzing();
inline std::size_t total_mem() { return fuzzing() ? kFuzzTotalMem : kTotalMem; }

// What one context holds of its device's memory (api_context.cc charges it
// while the context lives, as a GPU does): IVCUDA_GPU_DOUBLE_CONTEXT_MIB, or
// kDefaultContextMem; nothing under a fuzzer, whose device is small.
std::size_t context_mem();
// How long making a context takes (its creation, or a primary context's
// activation): IVCUDA_GPU_DOUBLE_CONTEXT_DELAY_MS, 0 by default and under a
// fuzzer. A driver makes a context in 0.1-0.5 s; tests of the daemon's warm
// pool set it to see which worker a guest waits for.
std::chrono::milliseconds context_delay();
// How long cuCheckpointProcessCheckpoint and Unlock take before they act:
// IVCUDA_GPU_DOUBLE_CHECKPOINT_DELAY_MS, 0 by default (a driver checkpoints
// about a GiB a second). Tests end the checkpointer meanwhile, with the
// target locked.
std::chrono::milliseconds checkpoint_delay();

// IVCUDA_GPU_DOUBLE_MPS_LOG=FILE: cuInit appends the CUDA_MPS_* variables
// of the process's environment to FILE, one line per cuInit that saw any
// ("pid PID: NAME=VALUE ..."): what an MPS client's driver reads at its
// start. Tests of ivcudad --mps check what the driver saw there, not what
// the daemon says it set.
void record_mps_environment();

// IVCUDA_GPU_DOUBLE_EVENT_DELAY_US=N: a recorded event reports NOT_READY for
// N microseconds after its record (cuEventSynchronize waits them out), though
// the work before it ran at once as always. Callers that track work in flight
// by events (ivcudad's posted copies) then see it in flight, as on a GPU.
std::chrono::microseconds event_delay();
// IVCUDA_GPU_DOUBLE_KERNEL_US (default 0): how long a launched kernel keeps its stream busy.
// Its effects are made at launch, as every kernel's here; only the stream's answers wait:
// cuStreamQuery is NOT_READY, cuStreamSynchronize and cuCtxSynchronize wait, and an event
// recorded behind it completes when it ends. Workers then meet streams with work in flight.
std::chrono::microseconds kernel_time();
std::pair<Handle, Handle> busy_key(Handle ctx, CUstream h);
// When the stream's (or, with h == nullptr and all == true, the context's) last kernel ends.
std::chrono::steady_clock::time_point busy_end(State& s, Handle ctx, CUstream h, bool all = false);

// Runs an API body under the state lock, after the cuInit check; nothing escapes.
template <class F>
CUresult guarded(F&& body, bool needs_init = true) {
  try {
    const ApiGate gate;
    if (gate.refused()) return CUDA_ERROR_OPERATING_SYSTEM;
    State& s = state();
    std::lock_guard lock(s.mu);
    if (needs_init && !s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return body(s);
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace ivcuda::gpu_double
