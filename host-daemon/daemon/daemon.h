// ivcudad's listening side: the sockets guests connect on, the processes that
// serve them, the pool of workers started ahead, and the operator's control
// socket and metrics, in one event loop. Runs unsandboxed and never loads the
// driver; what it reads of workers is the status board, the broker line and a
// warm entry's one-byte words (host-daemon/shared/from_worker.h).
//
// Its parts, each a file:
//   daemon.cc     the set-up, the loop, and the stop
//   guests.cc     a guest's arrival: admission, its memory, its process
//   warm_pool.cc  workers started ahead, recycled workers (warm_policy.h decides)
//   operator.cc   ivcudactl's status, reload and evict; the metrics' snapshot
//   suspend.cc    ivcudactl's suspend, resume, drain and undrain (suspend.h)
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "host-daemon/daemon/control.h"
#include "host-daemon/daemon/fd_broker.h"
#include "host-daemon/daemon/metrics.h"
#include "host-daemon/daemon/options.h"
#include "host-daemon/daemon/status.h"
#include "host-daemon/daemon/suspend.h"
#include "host-daemon/daemon/warm_policy.h"
#include "host-daemon/daemon/worker_budget.h"
#include "host-daemon/shared/from_worker.h"
#include "ring/ivshmem.h"
#include "ring/layout.h"
#include "ring/sys.h"

namespace ivcuda::host {

class Daemon {
 public:
  // `argc`/`argv` are read again by a reload. `gpus`: --gpus as parsed.
  Daemon(Options o, int argc, char** argv, std::vector<int> gpus, ring::Layout layout);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Listens, serves until SIGINT or SIGTERM, stops every guest's process.
  // Returns the process's exit status.
  int run();

  // Where a guest's suspension is (suspend.cc).
  enum class Phase {
    kNone,        // serving
    kHolding,     // asked: its worker is to hold its calls (board.suspend), not yet seen doing so
    kSuspending,  // the checkpointer locks and checkpoints its worker
    kSuspended,   // its device memory is in its worker's host memory
    kResuming,    // the checkpointer restores and unlocks its worker
    kRecovering,  // a checkpointer ended mid-request: another brings its worker back to running
  };

 private:
  using clk = std::chrono::steady_clock;
  static constexpr std::size_t kNoListener = static_cast<std::size_t>(-1);

  // A socket guests connect on: --socket with --gpus, or a --guest-socket.
  struct Listener {
    std::string path;
    std::vector<int> gpus;
    std::uint64_t mem_limit;
    ivshmem::IvshmemServer server;
    unsigned compute = 100;  // % of the SMs under --mps
    unsigned warm = 1;       // workers kept started ahead
    bool huge = false;       // guests' memory on 2 MiB pages
  };
  // A guest served now, by the pid of its connection's process.
  struct Served {
    std::int64_t id = 0;
    uid_t uid = 0;        // the connecting process's (SO_PEERCRED); plain files: the daemon's
    pid_t peer_pid = 0;   // the connecting process; 0 for plain files
    std::string socket;   // the listener's path, or the ivshmem-plain file
    std::vector<int> gpus;
    unsigned compute = 0;                // % of the SMs under --mps; 0: no MPS
    std::size_t listener = kNoListener;  // index into listeners_; kNoListener: a plain file
    // A copy of the guest's connection: when the worker has ended, the
    // daemon hangs up on the guest itself. A worker that died may leave its
    // own reference behind for a while (its io_uring's armed poll is torn
    // down asynchronously), and a process-mode guest learns of the end only
    // from the hang-up.
    std::shared_ptr<sys::UniqueFd> conn;
    std::unique_ptr<GuestBoard> board;  // what its workers report (from_worker.h)
    // Served by a warm entry: our end of the entry's line, on which its
    // process says that the worker ended cleanly and may be recycled
    // ('C', vm_supervisor.h), or that a worker still starting when the guest
    // came is ready ('R'), and that worker's pid (0 until it is known).
    sys::UniqueFd handoff;
    bool by_warm = false;
    pid_t worker_pid = 0;
    // A process-mode guest's worker: a warm entry's child once named, else
    // the connection's own process (conn_pid), which became the worker.
    pid_t process_worker(pid_t conn_pid) const noexcept { return by_warm ? worker_pid : conn_pid; }
    clk::time_point started = clk::now();
    clk::time_point evict_deadline{};  // evicting: its process is killed after this
    struct Suspension {
      Phase phase = Phase::kNone;
      // The workers the checkpointer acts on: a process-mode guest's one; a
      // VM's, every child of its supervisor (its processes' workers and its
      // spares), listed from /proc once they all hold their calls.
      struct Target {
        pid_t pid = 0;
        bool out = false;      // checkpointed (or locked) by this suspension
        bool waiting = false;  // a request for it is with the checkpointer
      };
      std::vector<Target> targets;
      pid_t supervisor = 0;                // a VM's: its targets are this process's children
      std::string failed;                  // the round's first failure
      clk::time_point since{}, deadline{}; // asked at; kHolding: given up after
      clk::time_point out_at{};            // suspended since
      bool by_drain = false;               // undrain resumes it
      std::uint64_t bytes = 0;             // charged when it went out (its board's mem_used then)
      double lock_ms = 0, out_ms = 0, back_ms = 0;
      std::string last;                    // the last suspend's or resume's outcome
      // Whether the daemon may act on target `pid` now (ask the checkpointer
      // about it, kill it): a process-mode guest's worker is the daemon's own
      // child; a VM's only while it is still its supervisor's live child, so
      // that a pid that ended and went to another process is never touched
      // (docs/security.md, suspend-live-child).
      bool may_act_on(pid_t pid) const;
    } susp;
    // The last sampling window, for calls/s and copy bytes/s.
    clk::time_point sample_at = clk::now();
    std::uint64_t sample_calls = 0, sample_bytes = 0;
    double calls_per_s = 0, bytes_per_s = 0;
  };
  // A warm entry (docs/design.md, "Warm workers"): a connection's process
  // started ahead of its guest, with the guest's memory, doorbells and status
  // board made and a worker that has loaded the driver, retained a context
  // and registered the memory. A guest that connects takes one.
  struct Warm {
    pid_t pid = 0;
    std::size_t listener = 0;
    std::int64_t id = 0;               // the guest number it will have
    sys::UniqueFd handoff;             // our end of its line (vm_supervisor.h)
    sys::UniqueFd shm;
    ivshmem::GuestConnection bells;    // its doorbells, for the greeting
    std::unique_ptr<GuestBoard> board;
    bool ready = false;                // its worker said so
    pid_t worker_pid = 0;              // that worker (the entry's process's child)
    // A recycled worker (--recycle-workers): it served a guest of this
    // user, and serves only that user's guests (docs/security.md).
    std::optional<uid_t> tenant_uid;
  };
  // A guest that found no ready entry on its socket, not greeted yet: it
  // takes the first entry that becomes ready (warm_policy.h, kWaitForReady).
  struct Waiting {
    ivshmem::PendingGuest pending;
    uid_t uid = 0;
    pid_t pid = 0;
    WorkerBudget::Ticket unit;
    clk::time_point since = clk::now();
  };
  // A guest whose user has --max-guests-per-uid guests and workers already:
  // it waits, unanswered, for one of them to end, as a native program waits
  // for the GPU's queue, rather than being turned away at once. At most that
  // many more of a user wait (a local user holds no more than twice the
  // limit in connections, and none of them memory), each at most
  // kOverLimitWait: under the guest library's 5 s wait for its greeting.
  struct OverLimit {
    ivshmem::PendingGuest pending;
    uid_t uid = 0;
    pid_t pid = 0;
    clk::time_point since = clk::now();
  };
  static constexpr auto kOverLimitWait = std::chrono::seconds(4);
  // What one pass of the loop polls, and where each kind starts in it.
  struct PollSet;

  // daemon.cc: set-up, the loop's parts, the stop.
  bool add_listener(const std::string& path, std::vector<int> grant, std::uint64_t mem_limit, unsigned compute,
                    unsigned warm, bool huge);
  int open_listeners();        // 0, or the exit status
  int open_operator_side();    // the control socket and metrics: 0, or the exit status
  int start_plain_guests();    // --plain-file: 0, or the exit status
  void reap();                 // processes that ended
  void tend_guests();          // rates over about a second, evictions that do not finish
  void serve_once();           // one poll of every descriptor, and what it found
  void stop_all();
  std::vector<std::string> driver_env(unsigned compute, std::uint64_t mem_limit, const std::vector<int>& grant) const;

  // guests.cc: a guest's arrival.
  void accept_guest(std::size_t li);
  // An admitted guest: it waits for the first ready entry (--wait-for-ready),
  // or takes one, or gets a process of its own.
  void place_guest(std::size_t li, ivshmem::PendingGuest pending, uid_t uid, pid_t pid, WorkerBudget::Ticket unit,
                   clk::time_point arrived);
  // Guests over their user's limit: admitted in arrival order as units come
  // back; turned away after kOverLimitWait, or when they hang up.
  void admit_over_limit();
  std::size_t over_limit_count(uid_t uid) const;
  // Greets the guest and hands it to `warm`'s entry, or (none) to a process made for it.
  void serve_guest(std::size_t li, ivshmem::PendingGuest pending, uid_t uid, pid_t peer_pid, WorkerBudget::Ticket unit,
                   std::optional<Warm> warm, clk::time_point arrived);
  // Waiting guests: each takes the first entry that becomes ready for it, or
  // after kWaitForReady whatever pick_entry gives; one that hung up goes.
  void serve_waiting();
  // Starts entries while fewer are on their way than guests wait (warm_pool.cc).
  void start_for_waiting(std::size_t li);
  std::size_t waiting_count() const;
  std::int64_t next_guest_id();
  std::optional<sys::UniqueFd> guest_memory(std::int64_t id, std::size_t li);
  std::unique_ptr<GuestBoard> new_board(std::uint64_t mem_limit);
  // In a forked guest process: what it must not keep of the daemon's.
  void forget_in_child(const GuestBoard* mine);

  // warm_pool.cc: workers started ahead.
  std::vector<WarmView> pool_views(std::size_t li) const;
  bool start_warm(std::size_t li, int not_theirs = -1);
  void let_go_warm(Warm& e);
  void fill_pools();
  std::optional<Warm> take_warm(std::size_t li, uid_t uid, int not_theirs);
  void recycle_served(pid_t pid);
  bool reap_warm(pid_t pid, int status);  // false: not an entry's process
  void read_served_line(pid_t pid, std::vector<pid_t>* to_recycle);
  void read_warm_line(Warm& e);
  void drop_stale_warm();

  // suspend.cc: suspend, resume, drain (suspend.h).
  static constexpr auto kHoldWait = std::chrono::seconds(2);  // a worker holds its calls within 100 ms
  static constexpr std::uint32_t kLockTimeoutMs = 5000;         // calls under way must end by then
  static const char* suspension_state(const Served& w);
  std::pair<pid_t, Served*> find_served(std::int64_t id);
  nlohmann::json suspend_guest(std::int64_t id, bool by_drain);
  nlohmann::json resume_guest(std::int64_t id);
  nlohmann::json drain_gpu(int gpu);
  nlohmann::json undrain_gpu(int gpu);
  bool serves_gpu(int gpu) const;
  bool on_gpu(const Served& w, int gpu) const;
  bool gpu_drained(const std::vector<int>& grant) const;  // a drained GPU among them
  bool ask_checkpointer(CheckpointOp op, pid_t target);
  void pump_checkpointer();
  // The guest and target whose request about `pid` is with the checkpointer (or queued for it).
  std::pair<Served*, Served::Suspension::Target*> waiting_on(pid_t pid);
  void serve_checkpointer();  // its line is readable
  void checkpointer_gone();
  // A round of requests, one per target that needs `op`; false when the
  // checkpointer cannot be started. A round with nothing to ask ends at once.
  bool start_round(Served& w, CheckpointOp op);
  void finish_round(Served& w, CheckpointOp op);
  // A worker that cannot be brought back ends: a process-mode guest is
  // evicted, a VM loses that process's worker (its calls fail cleanly).
  void give_up_target(Served& w, Served::Suspension::Target& t, const std::string& why);
  void stop_checkpointer_if_idle();
  void tend_suspensions();

  // operator.cc: what ivcudactl asks (the only part that needs all of nlohmann-json).
  DaemonStatus snapshot() const;
  nlohmann::json reload();
  nlohmann::json handle_control(const nlohmann::json& req);
  void serve_control();     // the control socket is readable
  void reload_on_signal();  // SIGHUP

  Options o_;
  int argc_;
  char** argv_;
  const std::vector<int> gpus_;
  const ring::Layout layout_;
  const std::uint64_t generation_;
  const int gpu_count_;
  const clk::time_point started_ = clk::now();
  std::uint64_t refused_ = 0;  // connections turned away (limits)

  std::vector<Listener> listeners_;
  std::vector<bool> huge_short_;       // a socket's want of huge pages said once
  std::map<pid_t, Served> workers_;    // by the connection's process
  std::unique_ptr<WorkerBudget> budget_;
  FdBroker broker_;
  std::optional<ControlServer> control_;
  std::unique_ptr<MetricsServer> metrics_;
  // Guest numbers are the daemon's, across its sockets (each socket's
  // ivshmem server would count from 1): logs, status and evict use them.
  std::int64_t last_id_ = 0;

  // The pool, per socket (warm_pool.cc).
  std::vector<std::vector<Warm>> pools_;
  // After a warm entry failed, the socket's next one waits (1 s, doubling to a minute).
  std::vector<std::pair<clk::time_point, std::chrono::seconds>> warm_backoff_;
  std::set<pid_t> warm_let_go_;                 // entries told to go, not reaped yet
  std::vector<std::deque<clk::time_point>> arrivals_;  // guests' arrivals per socket
  std::vector<clk::time_point> returned_;       // per socket: a worker last came back recycled
  std::vector<std::list<Waiting>> waiting_;     // per socket, in arrival order
  std::vector<std::list<OverLimit>> over_limit_;  // per socket, in arrival order
  bool warm_stale_ = false;                     // a reload changed what they were started with
  // Suspensions (suspend.cc): the checkpointer while one is under way, what
  // it is asked in order (one at a time), and GPUs taken out of service.
  std::optional<Checkpointer> checkpointer_;
  std::deque<CheckpointRequest> checkpoint_queue_;
  bool checkpoint_busy_ = false;
  clk::time_point checkpoint_sent_{};  // the request under way went then
  // A request the checkpointer has not answered by then (a driver stuck in
  // it) ends the checkpointer: the request fails, the daemon goes on. A
  // checkpoint moves about 1.1 GiB/s (H200): 141 GiB take about two minutes.
  static constexpr auto kCheckpointerWait = std::chrono::minutes(10);
  std::set<pid_t> checkpointers_let_go_;  // not reaped yet
  std::set<int> drained_;
};

}  // namespace ivcuda::host
