#include "state.h"
#include "strays.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

#include "arrays.h"

namespace ivcuda::gpu_double {

State& state() {
  // Never destroyed: threads may still call in while the process exits.
  static State* s = new State();
  return *s;
}

std::vector<Handle>& ctx_stack() {
  thread_local std::vector<Handle> stack;
  return stack;
}

bool fuzzing() {
  static const bool on = [] {
    const char* v = std::getenv("IVCUDA_GPU_DOUBLE_FUZZ");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

std::chrono::microseconds event_delay() {
  static const std::chrono::microseconds us = [] {
    const char* v = std::getenv("IVCUDA_GPU_DOUBLE_EVENT_DELAY_US");
    return std::chrono::microseconds(v != nullptr ? std::strtoul(v, nullptr, 10) : 0);
  }();
  return us;
}

std::chrono::microseconds kernel_time() {
  static const std::chrono::microseconds us = [] {
    const char* v = std::getenv("IVCUDA_GPU_DOUBLE_KERNEL_US");
    return std::chrono::microseconds(v != nullptr ? std::strtoul(v, nullptr, 10) : 0);
  }();
  return us;
}

std::pair<Handle, Handle> busy_key(Handle ctx, CUstream h) {
  const Handle v = h == CU_STREAM_LEGACY ? 0 : from_handle(h);
  return {ctx, v};
}

std::chrono::steady_clock::time_point busy_end(State& s, Handle ctx, CUstream h, bool all) {
  std::chrono::steady_clock::time_point end{};
  if (s.busy_until.empty()) return end;
  if (!all) {
    const auto it = s.busy_until.find(busy_key(ctx, h));
    return it == s.busy_until.end() ? end : it->second;
  }
  for (auto it = s.busy_until.lower_bound({ctx, 0}); it != s.busy_until.end() && it->first.first == ctx; ++it)
    end = std::max(end, it->second);
  return end;
}

std::size_t context_mem() {
  static const std::size_t bytes = [] {
    if (fuzzing()) return std::size_t{0};
    const char* v = std::getenv("IVCUDA_GPU_DOUBLE_CONTEXT_MIB");
    if (v == nullptr || *v == '\0') return kDefaultContextMem;
    char* end = nullptr;
    const unsigned long mib = std::strtoul(v, &end, 10);
    if (*end != '\0' || mib > (kTotalMem >> 20)) {
      log("IVCUDA_GPU_DOUBLE_CONTEXT_MIB=%s is not a size in MiB up to the device's; using %zu", v,
          kDefaultContextMem >> 20);
      return kDefaultContextMem;
    }
    return std::size_t{mib} << 20;
  }();
  return bytes;
}

namespace {
// A delay in milliseconds from the environment variable `var` (0 when unset,
// under the fuzzer, or not a number up to a minute: said once).
std::chrono::milliseconds delay_from(const char* var) {
  const char* v = std::getenv(var);
  if (fuzzing() || v == nullptr || *v == '\0') return std::chrono::milliseconds(0);
  char* end = nullptr;
  const unsigned long ms = std::strtoul(v, &end, 10);
  if (*end != '\0' || ms > 60000) {
    log("%s=%s is not a number of milliseconds up to 60000; using 0", var, v);
    return std::chrono::milliseconds(0);
  }
  return std::chrono::milliseconds(ms);
}
}  // namespace

std::chrono::milliseconds context_delay() {
  static const auto delay = delay_from("IVCUDA_GPU_DOUBLE_CONTEXT_DELAY_MS");
  return delay;
}

std::chrono::milliseconds checkpoint_delay() {
  static const auto delay = delay_from("IVCUDA_GPU_DOUBLE_CHECKPOINT_DELAY_MS");
  return delay;
}

void record_mps_environment() {
  const char* path = std::getenv("IVCUDA_GPU_DOUBLE_MPS_LOG");
  if (path == nullptr || *path == '\0') return;
  std::vector<std::string> seen;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "CUDA_MPS_", 9) == 0) seen.emplace_back(*e);
  if (seen.empty()) return;
  std::sort(seen.begin(), seen.end());  // the environment's order is nobody's contract
  std::string line = "pid " + std::to_string(::getpid()) + ":";
  for (const std::string& kv : seen) line += " " + kv;
  line += "\n";
  // One write on an O_APPEND file: the lines of workers starting at once stay whole.
  const int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    log("cannot record the MPS environment in %s: %s", path, std::strerror(errno));
    return;
  }
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    log("cannot record the MPS environment in %s: %s", path, std::strerror(errno));
  ::close(fd);
}

void log(const char* fmt, ...) {
  if (fuzzing()) return;
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("ivcuda GPU test double: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
}

namespace {
// The ledger file (identity.h, shared with the NVML test double).

int g_ledger_fd = -1;

bool lock_byte(int i, bool take) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = i;
  fl.l_len = 1;
  if (take) return ::fcntl(g_ledger_fd, F_OFD_SETLK, &fl) == 0;
  if (::fcntl(g_ledger_fd, F_OFD_GETLK, &fl) != 0) return false;
  return fl.l_type != F_UNLCK;  // true: another process holds entry i
}

// The ledger's path, its mapping and this process's entry (-2: none taken
// yet). A child forked from a process that used the ledger is another
// process of it: it opens the file again (the entry's lock belongs to the
// open file, which the parent keeps) and takes an entry of its own.
Ledger* g_ledger = nullptr;
std::atomic<int> g_mine{-2};
std::mutex g_mine_mu;

void reopen_in_child() {
  if (g_ledger == nullptr) return;
  // The inherited descriptor's open file stays the parent's, with its lock:
  // the same file opened anew (through /proc, which reaches it even if its
  // name is gone; else by name) is this process's own.
  const int inherited = g_ledger_fd;
  const std::string self = "/proc/self/fd/" + std::to_string(inherited);
  int fd = ::open(self.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const char* path = std::getenv("IVCUDA_DOUBLE_LEDGER");
    fd = path != nullptr ? ::open(path, O_RDWR | O_CLOEXEC) : -1;
  }
  ::close(inherited);
  g_ledger_fd = fd;
  if (fd < 0) g_ledger = nullptr;
  g_mine.store(-2);
}

// The ledger, mapped on first use; null when IVCUDA_DOUBLE_LEDGER is unset or unusable.
Ledger* ledger() {
  static const bool opened = [] {
    const char* path = std::getenv("IVCUDA_DOUBLE_LEDGER");
    if (path == nullptr || *path == '\0') return false;
    const int fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    void* p = nullptr;
    if (::ftruncate(fd, sizeof(Ledger)) == 0)
      p = ::mmap(nullptr, sizeof(Ledger), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || p == nullptr) {
      ::close(fd);
      return false;
    }
    g_ledger_fd = fd;  // kept open: it holds this process's entry lock
    g_ledger = static_cast<Ledger*>(p);
    (void)::pthread_atfork(nullptr, nullptr, reopen_in_child);
    return true;
  }();
  return opened ? g_ledger : nullptr;
}

// This process's entry: the first whose lock it gets (free, or left by a
// process that ended).
int my_index() {
  const int known = g_mine.load(std::memory_order_acquire);
  if (known != -2) return known;
  std::lock_guard lock(g_mine_mu);
  if (g_mine.load() != -2) return g_mine.load();
  Ledger* l = ledger();
  int mine = -1;
  for (int i = 0; l != nullptr && i < Ledger::kEntries; ++i)
    if (lock_byte(i, true)) {
      Ledger::Entry& e = l->e[i];
      e.pid = static_cast<std::int32_t>(::getpid());
      for (auto& u : e.used) u.store(0);
      for (auto& c : e.contexts) c.store(0);
      for (auto& u : e.moved_out) u.store(0);
      for (auto& c : e.contexts_out) c.store(0);
      e.lock_asked.store(0);
      e.in_api.store(0);
      e.checkpoint.store(CU_PROCESS_STATE_RUNNING);
      e.part_asked.store(0);
      e.part_done.store(0);
      e.part_errno.store(0);
      e.pipe_fd.store(-1);
      start_checkpoint_thread(&e);
      mine = i;
      break;
    }
  g_mine.store(mine, std::memory_order_release);
  return mine;
}
}  // namespace

std::size_t ledger_others(int device) {
  Ledger* l = ledger();
  if (l == nullptr || device < 0 || device >= kMaxDevices) return 0;
  const int me = my_index();
  std::size_t sum = 0;
  for (int i = 0; i < Ledger::kEntries; ++i)
    if (i != me && lock_byte(i, false)) sum += l->e[i].used[device].load();
  return sum;
}

void ledger_publish(int device, std::size_t used) {
  if (device < 0 || device >= kMaxDevices) return;
  if (const int i = my_index(); i >= 0) ledger()->e[i].used[device].store(used);
}

void ledger_contexts(int device, unsigned count) {
  if (device < 0 || device >= kMaxDevices) return;
  if (const int i = my_index(); i >= 0) ledger()->e[i].contexts[device].store(count);
}

Ledger::Entry* ledger_entry_of(int pid) {
  Ledger* l = ledger();
  if (l == nullptr || pid <= 0) return nullptr;
  const int me = my_index();
  for (int i = 0; i < Ledger::kEntries; ++i)
    if (i != me && l->e[i].pid == pid && lock_byte(i, false)) return &l->e[i];
  return nullptr;
}

namespace {
// Gates open on this thread: a call made inside another (a synchronise's
// queries) neither counts again nor waits, or a lock would wait for it forever.
thread_local int t_gates = 0;
}  // namespace

ApiGate::ApiGate() noexcept {
  if (t_gates++ != 0 || ledger() == nullptr) return;
  const int i = my_index();
  if (i < 0) return;
  e_ = &ledger()->e[i];
  for (;;) {
    e_->in_api.fetch_add(1);
    if (e_->lock_asked.load() == 0) {
      if (e_->checkpoint.load() == CU_PROCESS_STATE_RUNNING) return;
      e_->in_api.fetch_sub(1);
      e_ = nullptr;
      refused_ = true;  // locked or checkpointed
      return;
    }
    e_->in_api.fetch_sub(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

ApiGate::~ApiGate() {
  --t_gates;
  if (e_ != nullptr) e_->in_api.fetch_sub(1);
}

const Allocation* State::find(std::uintptr_t p, std::size_t n) const {
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  const std::uintptr_t off = p - a.base;  // p >= a.base by construction
  if (off >= a.size) return nullptr;
  if (n <= a.size - off) return &a;
  // VMM mappings back to back are one stretch of device memory, as on a GPU: an access may run
  // from one into the next (a growable buffer mapped chunk by chunk), and the host memory behind
  // them is contiguous here too. Other allocations end where they end.
  std::uintptr_t end = a.base + a.size;
  const std::uintptr_t want = p + n;
  for (auto next = std::next(it); a.kind == MemKind::kMapped && next != allocations.end(); ++next) {
    if (next->first != end || next->second.kind != MemKind::kMapped) return nullptr;
    end += next->second.size;
    if (end >= want) return &a;
  }
  return nullptr;
}

void State::release(std::map<std::uintptr_t, Allocation>::iterator it) {
  Allocation& a = it->second;
  if (a.accounted != 0) {
    used[static_cast<std::size_t>(a.device)] -= a.accounted;
    ledger_publish(a.device, used[static_cast<std::size_t>(a.device)]);
  }
  const bool keep = a.kind == MemKind::kDevice && a.pool == 0 && a.ipc_fd < 0 && a.mapped != 0 &&
                    a.mapped <= kFreedSmall && freed_bytes + a.mapped <= kFreedKept && contexts.contains(a.ctx);
  if (keep) {
    freed_blocks[a.ctx].emplace(a.mapped, FreedBlock{a.storage, a.mapped});
    freed_bytes += a.mapped;
  } else if (a.mapped != 0) {
    ::munmap(a.storage, a.mapped);
  } else {
    std::free(a.storage);
  }
  if (a.ipc_fd >= 0) ::close(a.ipc_fd);
  allocations.erase(it);
}

void* State::reuse_freed(Handle ctx, std::size_t mapped) {
  const auto c = freed_blocks.find(ctx);
  if (c == freed_blocks.end()) return nullptr;
  const auto b = c->second.find(mapped);
  if (b == c->second.end()) return nullptr;
  void* p = b->second.storage;
  freed_bytes -= b->second.mapped;
  c->second.erase(b);
  return p;
}

void State::release_context_resources(Handle ctx) {
  for (auto it = allocations.begin(); it != allocations.end();) {
    auto cur = it++;
    if (cur->second.ctx == ctx) release(cur);
  }
  if (const auto f = freed_blocks.find(ctx); f != freed_blocks.end()) {
    for (const auto& [size, b] : f->second) {
      ::munmap(b.storage, b.mapped);
      freed_bytes -= b.mapped;
    }
    freed_blocks.erase(f);
  }
  std::erase_if(streams, [&](const auto& kv) { return kv.second.ctx == ctx; });
  std::erase_if(events, [&](const auto& kv) { return kv.second.ctx == ctx; });
  for (auto it = modules.begin(); it != modules.end();) {
    if (it->second.ctx != ctx) {
      ++it;
      continue;
    }
    for (const auto& [name, fn] : it->second.functions) functions.erase(fn);
    it = modules.erase(it);  // its globals went with the allocations above
  }
  std::vector<Handle> dead_graphs;
  for (const auto& [h, g] : graphs)
    if (g.ctx == ctx && g.owner_node == 0) dead_graphs.push_back(h);
  for (Handle h : dead_graphs) destroy_graph(*this, h);
  std::erase_if(execs, [&](const auto& kv) { return kv.second.ctx == ctx; });
  std::erase_if(captures, [&](const auto& kv) { return !streams.contains(kv.first); });
  release_context_arrays(*this, ctx);
}

namespace {
thread_local bool t_replaying = false;
}

bool record_if_capturing(State& s, CUstream stream, Node node, CUresult* st) {
  if (t_replaying) return false;
  const auto it = s.captures.find(from_handle(stream));
  if (it == s.captures.end()) return false;
  if (it->second.invalidated) {
    *st = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return true;
  }
  Capture& c = it->second;
  const Handle h = s.new_handle();
  GraphNode n;
  n.graph = c.graph;
  n.captured = std::move(node);
  n.deps = c.deps;
  n.dep_data.assign(c.deps.size(), CUgraphEdgeData{});
  s.graph_nodes[h] = std::move(n);
  s.graphs.at(c.graph).nodes.push_back(h);
  c.deps = {h};
  *st = CUDA_SUCCESS;
  return true;
}

bool capture_call(CUstream stream, Node node, CUresult* st) {
  if (t_replaying) return false;
  bool recorded = false;
  const CUresult r = guarded([&](State& s) -> CUresult {
    CUresult inner = CUDA_SUCCESS;
    recorded = record_if_capturing(s, stream, std::move(node), &inner);
    return inner;
  });
  *st = r;
  return recorded;
}

CUresult replaying(const std::function<CUresult()>& fn) {
  const bool outer = t_replaying;  // a graph launched inside a graph
  t_replaying = true;
  const CUresult st = fn();
  t_replaying = outer;
  return st;
}

CUresult current_context(State& s, Handle* out) {
  const auto& stack = ctx_stack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  Handle h = stack.back();
  if (const auto g = s.converted.find(h); g != s.converted.end())
    h = s.primary[static_cast<std::size_t>(s.greens.at(g->second).device)];
  else if (s.dead_converted.contains(h))
    return CUDA_ERROR_CONTEXT_IS_DESTROYED;  // its green context was destroyed while current
  const auto it = s.contexts.find(h);
  if (it == s.contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  // What the real driver says about a current primary context nobody retains.
  if (!it->second.active) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = it->first;
  return CUDA_SUCCESS;
}

CUresult resolve_context(const State& s, Handle h, Handle* out) {
  if (s.contexts.contains(h)) {
    *out = h;
    return CUDA_SUCCESS;
  }
  const auto g = s.converted.find(h);
  if (g == s.converted.end()) return CUDA_ERROR_INVALID_CONTEXT;
  *out = s.primary[static_cast<std::size_t>(s.greens.at(g->second).device)];
  return CUDA_SUCCESS;
}

Handle current_green(const State& s) {
  const auto& stack = ctx_stack();
  if (stack.empty()) return 0;
  const auto g = s.converted.find(stack.back());
  return g == s.converted.end() ? 0 : g->second;
}

CUresult work_context(State& s, Handle* out) {
  if (const CUresult r = current_context(s, out); r != CUDA_SUCCESS) return r;
  return s.fault_of(*out);
}

CUresult check_stream(const State& s, CUstream stream) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
    return CUDA_SUCCESS;
  const auto it = s.streams.find(from_handle(stream));
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  return orphaned(it->second) ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_SUCCESS;
}

CUresult check_device_range(const State& s, CUdeviceptr p, std::size_t n, const char* file, unsigned line) {
  const auto at = static_cast<std::uintptr_t>(p);
  if (p != 0 && s.find(at, n) != nullptr) return CUDA_SUCCESS;
  note_stray(at, n, file, line);
  return p != 0 && hmm() && mapped(at, n) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace ivcuda::gpu_double
