// See suspend.h: the checkpointer process, and the daemon's side of
// ivcudactl suspend, resume, drain and undrain.
#include "host-daemon/daemon/suspend.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "host-daemon/daemon/daemon.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"

namespace ivcuda::host {

using nlohmann::json;

// The two answers the daemon explains (cuda.h's values; this side does not include it).
constexpr std::int32_t kCudaOutOfMemory = 2;
constexpr std::int32_t kCudaNotReady = 600;
constexpr std::int32_t kCudaOperatingSystem = 304;

namespace {
using clk = std::chrono::steady_clock;
// CUprocessState's names (cuda.h's values).
const char* process_state_name(std::int32_t s) {
  switch (s) {
    case 0: return "running";
    case 1: return "locked";
    case 2: return "checkpointed";
    case 3: return "failed";
    default: return "in a state the driver did not say";
  }
}
double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }
}  // namespace

std::optional<Checkpointer> Checkpointer::fork_with(const std::string& driver, const sandbox::Config& sc,
                                                    void (*in_child)(void*), void* arg) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    IVLOG_ERROR("checkpointer: socketpair: %s", std::strerror(errno));
    return std::nullopt;
  }
  sys::UniqueFd ours(sv[0]), theirs(sv[1]);
  const pid_t pid = ::fork();
  if (pid < 0) {
    IVLOG_ERROR("checkpointer: fork: %s", std::strerror(errno));
    return std::nullopt;
  }
  if (pid == 0) {
    ours.reset();
    in_child(arg);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::prctl(PR_SET_NAME, "ivcuda-ckpt", 0, 0, 0);
    if (auto st = sandbox::for_checkpointer(sc); !st) {
      IVLOG_ERROR("checkpointer: %s", st.error().what.c_str());
      ::_exit(2);
    }
    run_checkpointer(theirs.get(), driver);  // host-daemon/worker/checkpointer.cc: loads the driver
  }
  IVLOG_INFO("checkpointer started: pid %d", static_cast<int>(pid));
  return Checkpointer(pid, std::move(ours));
}

Checkpointer::~Checkpointer() {
  if (pid_ > 0 && line_.valid()) {
    line_.reset();  // it ends at the hang-up; the daemon reaps it
    ::kill(pid_, SIGTERM);
  }
}

bool Checkpointer::send(const CheckpointRequest& r) {
  return ::send(line_.get(), &r, sizeof r, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof r);
}

std::optional<CheckpointReply> Checkpointer::receive() {
  CheckpointReply r{};
  const ssize_t n = ::recv(line_.get(), &r, sizeof r, MSG_DONTWAIT);
  if (n != static_cast<ssize_t>(sizeof r)) return std::nullopt;
  r.result_name[sizeof r.result_name - 1] = '\0';
  return r;
}

// ------------------------------------------------------------------ the daemon's side

namespace {
const char* phase_name(Daemon::Phase p) {
  switch (p) {
    case Daemon::Phase::kNone: return "serving";
    case Daemon::Phase::kHolding:
    case Daemon::Phase::kSuspending: return "suspending";
    case Daemon::Phase::kSuspended: return "suspended";
    case Daemon::Phase::kResuming: return "resuming";
    case Daemon::Phase::kRecovering: return "recovering";
  }
  return "?";
}
}  // namespace

const char* Daemon::suspension_state(const Served& w) { return phase_name(w.susp.phase); }

std::pair<pid_t, Daemon::Served*> Daemon::find_served(std::int64_t id) {
  for (auto& [pid, w] : workers_)
    if (w.id == id) return {pid, &w};
  return {0, nullptr};
}

namespace {
// A process's parent and state from /proc/PID/stat (nullopt: gone).
std::optional<std::pair<pid_t, char>> parent_and_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  // "PID (COMM) S PPID ...": the name may hold spaces and parentheses; the last ')' ends it.
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 4 >= text.size()) return std::nullopt;
  char state = text[close + 2];
  const pid_t ppid = static_cast<pid_t>(std::strtol(text.c_str() + close + 4, nullptr, 10));
  return std::make_pair(ppid, state);
}


}  // namespace

bool live_child_of(pid_t pid, pid_t parent) {
  const auto ps = parent_and_state(pid);
  return ps && ps->first == parent && ps->second != 'Z' && ps->second != 'X';
}

bool Daemon::Served::Suspension::may_act_on(pid_t pid) const {
  if (pid <= 0) return false;
  return supervisor == 0 || !IVCUDA_RULE("suspend-live-child") || live_child_of(pid, supervisor);
}

namespace {
// A supervisor's live children, as the kernel lists them (every thread's).
std::vector<pid_t> live_children(pid_t parent) {
  std::vector<pid_t> out;
  const std::string tasks = "/proc/" + std::to_string(parent) + "/task";
  DIR* d = ::opendir(tasks.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(tasks + "/" + e->d_name + "/children");
    pid_t child = 0;
    while (in >> child)
      if (live_child_of(child, parent) && std::find(out.begin(), out.end(), child) == out.end()) out.push_back(child);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

json Daemon::suspend_guest(std::int64_t id, bool by_drain) {
  auto [conn_pid, w] = find_served(id);
  if (w == nullptr) return {{"ok", false}, {"error", "no guest " + std::to_string(id) + " (see ivcudactl status)"}};
  GuestStats& b = w->board->stats();
  if (w->susp.phase == Phase::kRecovering)
    return {{"ok", false},
            {"error", "guest " + std::to_string(id) + " is recovering from an interrupted suspension; try again"}};
  if (w->susp.phase != Phase::kNone)
    return {{"ok", true}, {"state", phase_name(w->susp.phase)}, {"note", "already"}};
  if (b.evict.load(std::memory_order_relaxed) != 0)
    return {{"ok", false}, {"error", "guest " + std::to_string(id) + " is evicted"}};
  const auto mode = static_cast<GuestMode>(b.mode.load(std::memory_order_relaxed));
  w->susp = Served::Suspension{};
  // The targets are listed once the guest holds its calls (tend_suspensions).
  // A VM: the connection's process is its supervisor, and every worker of the VM its child.
  if (mode != GuestMode::kProcess) w->susp.supervisor = conn_pid;
  w->susp.phase = Phase::kHolding;
  w->susp.since = clk::now();
  w->susp.deadline = clk::now() + kHoldWait;
  w->susp.by_drain = by_drain;
  b.suspend.store(1, std::memory_order_release);
  if (w->susp.supervisor != 0)
    IVLOG_INFO("guest %lld: suspending (a VM: every worker of its supervisor, pid %d): its calls are held",
               static_cast<long long>(id), static_cast<int>(conn_pid));
  else if (const pid_t worker = w->process_worker(conn_pid); worker > 0)
    IVLOG_INFO("guest %lld: suspending (worker pid %d): its calls are held", static_cast<long long>(id),
               static_cast<int>(worker));
  else
    IVLOG_INFO("guest %lld: suspending (its worker is still starting): its calls are held",
               static_cast<long long>(id));
  return {{"ok", true}, {"state", "suspending"}};
}

json Daemon::resume_guest(std::int64_t id) {
  Served* w = find_served(id).second;
  if (w == nullptr) return {{"ok", false}, {"error", "no guest " + std::to_string(id) + " (see ivcudactl status)"}};
  if (w->susp.phase == Phase::kResuming || w->susp.phase == Phase::kNone || w->susp.phase == Phase::kRecovering)
    return {{"ok", true}, {"state", phase_name(w->susp.phase)}, {"note", "already"}};
  if (w->susp.phase != Phase::kSuspended)
    return {{"ok", false}, {"error", "guest " + std::to_string(id) + " is still being suspended; resume it after"}};
  for (int g : w->gpus)
    if (drained_.count(g) != 0)
      return {{"ok", false},
              {"error", "GPU " + std::to_string(g) + " is drained: ivcudactl undrain " + std::to_string(g) + " first"}};
  w->susp.phase = Phase::kResuming;
  w->susp.since = clk::now();
  w->susp.back_ms = 0;
  if (!start_round(*w, CheckpointOp::kResume)) {
    w->susp.phase = Phase::kSuspended;
    return {{"ok", false}, {"error", "the checkpointer could not be started (see ivcudad's log)"}};
  }
  return {{"ok", true}, {"state", phase_name(w->susp.phase)}};
}

// A GPU ivcudad serves: one of --gpus, or with all of them, one of those
// the driver lists (/proc/driver/nvidia/gpus; the GPU test double has no
// such list and stands for one GPU, 0).
bool Daemon::serves_gpu(int gpu) const {
  if (!gpus_.empty()) return std::find(gpus_.begin(), gpus_.end(), gpu) != gpus_.end();
  return gpu >= 0 && gpu < std::max(gpu_count_, 1);
}

bool Daemon::on_gpu(const Served& w, int gpu) const {
  if (w.gpus.empty()) return serves_gpu(gpu);  // granted all
  return std::find(w.gpus.begin(), w.gpus.end(), gpu) != w.gpus.end();
}

json Daemon::drain_gpu(int gpu) {
  if (!serves_gpu(gpu)) return {{"ok", false}, {"error", "GPU " + std::to_string(gpu) + " is not one ivcudad serves"}};
  // Its sockets' warm workers hold contexts on it: fill_pools lets them go
  // and makes none until undrain; accept_guest turns new guests away.
  drained_.insert(gpu);
  json guests = json::array(), refused = json::array();
  std::vector<std::int64_t> ids;
  for (const auto& [pid, w] : workers_)
    if (on_gpu(w, gpu)) ids.push_back(w.id);
  for (const std::int64_t id : ids) {
    json r = suspend_guest(id, true);
    if (r.value("ok", false))
      guests.push_back(id);
    else
      refused.push_back({{"guest", id}, {"error", r.value("error", "")}});
  }
  IVLOG_WARN("GPU %d drained by the operator: %zu guest(s) suspending, %zu not suspendable; no new guest is "
             "served on it until undrain",
             gpu, guests.size(), refused.size());
  return {{"ok", true}, {"gpu", gpu}, {"suspending", guests}, {"not_suspended", refused}};
}

json Daemon::undrain_gpu(int gpu) {
  if (drained_.erase(gpu) == 0) return {{"ok", false}, {"error", "GPU " + std::to_string(gpu) + " is not drained"}};
  json resumed = json::array();
  std::vector<std::int64_t> ids;
  for (const auto& [pid, w] : workers_)
    if (on_gpu(w, gpu) && w.susp.by_drain) ids.push_back(w.id);
  for (const std::int64_t id : ids)
    if (resume_guest(id).value("ok", false)) resumed.push_back(id);
  IVLOG_INFO("GPU %d back in service: %zu guest(s) resuming", gpu, resumed.size());
  return {{"ok", true}, {"gpu", gpu}, {"resuming", resumed}};
}

bool Daemon::gpu_drained(const std::vector<int>& grant) const {
  if (drained_.empty()) return false;
  if (grant.empty()) return true;  // all GPUs, a drained one among them
  return std::any_of(grant.begin(), grant.end(), [&](int d) { return drained_.count(d) != 0; });
}

bool Daemon::ask_checkpointer(CheckpointOp op, pid_t target) {
  if (!checkpointer_) {
    checkpointer_ = Checkpointer::start(o_.driver, o_.sandbox, [this] { forget_in_child(nullptr); });
    if (!checkpointer_) return false;
  }
  checkpoint_queue_.push_back(CheckpointRequest{op, static_cast<std::int32_t>(target), kLockTimeoutMs});
  pump_checkpointer();
  return true;
}

bool Daemon::start_round(Served& w, CheckpointOp op) {
  w.susp.failed.clear();
  for (auto& t : w.susp.targets) {
    if (op == CheckpointOp::kResume && !t.out) continue;
    // A VM's worker that ended meanwhile (its process exited) took its
    // memory with it: nothing is left to act on.
    if (!w.susp.may_act_on(t.pid)) {
      t.out = false;
      continue;
    }
    if (!ask_checkpointer(op, t.pid)) return false;
    t.waiting = true;
  }
  if (std::none_of(w.susp.targets.begin(), w.susp.targets.end(), [](const auto& t) { return t.waiting; }))
    finish_round(w, op);
  return true;
}

std::pair<Daemon::Served*, Daemon::Served::Suspension::Target*> Daemon::waiting_on(pid_t pid) {
  for (auto& [conn, s] : workers_)
    for (auto& x : s.susp.targets)
      if (x.pid == pid && x.waiting && s.susp.phase != Phase::kNone) return {&s, &x};
  return {nullptr, nullptr};
}

void Daemon::pump_checkpointer() {
  while (checkpointer_ && !checkpoint_busy_ && !checkpoint_queue_.empty()) {
    // Checked again as the request goes, not only when it was queued: the
    // checkpointer may have spent seconds on others meanwhile.
    const CheckpointRequest next = checkpoint_queue_.front();
    if (auto [w, t] = waiting_on(next.pid); w != nullptr && !w->susp.may_act_on(next.pid)) {
      checkpoint_queue_.pop_front();
      t->waiting = false;
      t->out = false;
      IVLOG_WARN("guest %lld: its worker pid %d is no longer its supervisor's: it ended before the checkpointer got "
                 "to it, and is left alone",
                 static_cast<long long>(w->id), static_cast<int>(next.pid));
      if (std::none_of(w->susp.targets.begin(), w->susp.targets.end(), [](const auto& x) { return x.waiting; }))
        finish_round(*w, next.op);
      continue;
    }
    if (!checkpointer_->send(next)) {
      IVLOG_ERROR("checkpointer: its line is gone");
      checkpointer_gone();
      return;
    }
    checkpoint_busy_ = true;
    checkpoint_sent_ = clk::now();
  }
}

// The checkpointer ended, or its line broke: what was asked of it failed,
// and a worker it was locking, checkpointing or restoring may be left
// locked or checkpointed: its calls would fail. The guest stays held while
// another checkpointer brings each of its workers back to running
// (CheckpointOp::kRecover), then serves on; a worker that cannot be brought
// back (a second checkpointer ended too, or none starts) ends, and the
// calls it served fail cleanly.
void Daemon::checkpointer_gone() {
  if (checkpointer_ && checkpointer_->pid() > 0) checkpointers_let_go_.insert(checkpointer_->pid());
  checkpointer_.reset();
  checkpoint_busy_ = false;
  checkpoint_queue_.clear();
  std::vector<Served*> recover;
  for (auto& [pid, w] : workers_) {
    if (w.susp.phase == Phase::kSuspending || w.susp.phase == Phase::kResuming) {
      recover.push_back(&w);
    } else if (w.susp.phase == Phase::kRecovering) {
      for (auto& t : w.susp.targets)
        if (t.waiting) give_up_target(w, t, "the checkpointer that was to bring its worker back ended too");
      finish_round(w, CheckpointOp::kRecover);
    }
  }
  for (Served* w : recover) {
    const bool was_suspending = w->susp.phase == Phase::kSuspending;
    w->susp.phase = Phase::kRecovering;
    w->susp.last = std::string(was_suspending ? "suspend" : "resume") +
                   " interrupted: the checkpointer ended; its worker is being brought back";
    IVLOG_WARN("guest %lld: %s", static_cast<long long>(w->id), w->susp.last.c_str());
    for (auto& t : w->susp.targets) t.waiting = false;
    if (!start_round(*w, CheckpointOp::kRecover)) {
      for (auto& t : w->susp.targets)
        give_up_target(*w, t, "no checkpointer could be started to bring its worker back");
      finish_round(*w, CheckpointOp::kRecover);
    }
  }
}

void Daemon::give_up_target(Served& w, Served::Suspension::Target& t, const std::string& why) {
  t.waiting = false;
  t.out = false;
  if (w.susp.supervisor != 0) {
    // One of a VM's workers: the supervisor sees it die and fails that
    // process's calls; the VM's other processes are unaffected.
    IVLOG_ERROR("guest %lld: its worker pid %d was ended: %s (it may be locked or checkpointed, so it could serve "
                "no call)",
                static_cast<long long>(w.id), static_cast<int>(t.pid), why.c_str());
    if (w.susp.may_act_on(t.pid)) ::kill(t.pid, SIGKILL);
    w.susp.failed = "its worker pid " + std::to_string(t.pid) + " was ended: " + why;
    return;
  }
  w.susp.last = "its worker was ended: " + why;
  IVLOG_ERROR("guest %lld: %s (it may be locked or checkpointed, so it could serve no call); the guest's calls "
              "fail from here",
              static_cast<long long>(w.id), w.susp.last.c_str());
  // tend_guests ends a suspended guest's worker on the spot when it is evicted.
  w.board->stats().evict.store(1, std::memory_order_release);
  w.evict_deadline = clk::now();
}

void Daemon::serve_checkpointer() {
  auto r = checkpointer_ ? checkpointer_->receive() : std::nullopt;
  if (!r) {
    IVLOG_ERROR("checkpointer: it ended or said something of the wrong size");
    checkpointer_gone();
    return;
  }
  checkpoint_busy_ = false;
  if (!checkpoint_queue_.empty()) checkpoint_queue_.pop_front();
  auto [w, t] = waiting_on(r->pid);
  pump_checkpointer();
  if (w == nullptr) return;  // its guest ended meanwhile
  t->waiting = false;
  const bool ok = r->step == CheckpointStep::kDone;
  const long long id = w->id;
  std::string why;
  if (!ok) why = std::string(step_name(r->step)) + " -> " + r->result_name;
  switch (r->op) {
    case CheckpointOp::kSuspend:
      t->out = ok;
      w->susp.lock_ms = std::max(w->susp.lock_ms, r->first_ms);
      w->susp.out_ms += r->second_ms;
      if (!ok && r->step == CheckpointStep::kLock && r->result == kCudaNotReady)
        why += " (calls under way did not end within " + std::to_string(kLockTimeoutMs) + " ms)";
      else if (!ok && r->step == CheckpointStep::kCheckpoint && r->result == kCudaOperatingSystem &&
               o_.sandbox.enabled())
        why += " (the driver's part inside the worker failed: its sandbox may refuse a system call a newer driver "
               "makes there; ivcudad --sandbox audit names it, docs/design.md \"Suspend and resume\")";
      break;
    case CheckpointOp::kResume:
      t->out = !ok;
      w->susp.back_ms += r->first_ms;
      if (!ok && r->result == kCudaOutOfMemory)
        why += " (the GPU lacks room for its " + human_bytes(w->susp.bytes) + " now)";
      break;
    case CheckpointOp::kRecover:
      if (ok) {
        t->out = false;
        IVLOG_INFO("guest %lld: its worker pid %d was found %s and is running again (restore %.1f ms, unlock %.1f "
                   "ms)",
                   id, static_cast<int>(t->pid), process_state_name(r->found), r->first_ms, r->second_ms);
      } else {
        give_up_target(*w, *t, "bringing it back failed: " + why);
      }
      break;
  }
  if (!ok && r->op != CheckpointOp::kRecover && w->susp.failed.empty()) w->susp.failed = why;
  if (std::none_of(w->susp.targets.begin(), w->susp.targets.end(), [](const auto& x) { return x.waiting; }))
    finish_round(*w, r->op);
  stop_checkpointer_if_idle();
}

void Daemon::finish_round(Served& w, CheckpointOp op) {
  GuestStats& b = w.board->stats();
  const long long id = w.id;
  const auto out = static_cast<std::size_t>(
      std::count_if(w.susp.targets.begin(), w.susp.targets.end(), [](const auto& t) { return t.out; }));
  const std::string workers = w.susp.supervisor != 0 ? std::to_string(w.susp.targets.size()) + " worker(s)" : "";
  if (op == CheckpointOp::kSuspend) {
    if (w.susp.failed.empty()) {
      w.susp.phase = Phase::kSuspended;
      w.susp.out_at = clk::now();
      w.susp.bytes = b.mem_used.load(std::memory_order_relaxed);
      w.susp.last = "suspended";
      IVLOG_INFO("guest %lld: suspended%s%s: its memory (%s charged) is in its worker's host memory; lock %.1f ms, "
                 "checkpoint %.1f ms, %.0f ms since asked",
                 id, workers.empty() ? "" : ", ", workers.c_str(), human_bytes(w.susp.bytes).c_str(),
                 w.susp.lock_ms, w.susp.out_ms, ms_since(w.susp.since));
    } else if (out == 0) {
      w.susp.phase = Phase::kNone;
      b.suspend.store(0, std::memory_order_release);  // it serves on
      w.susp.last = "suspend failed: " + w.susp.failed + "; it serves on";
      IVLOG_WARN("guest %lld: %s", id, w.susp.last.c_str());
    } else {
      // Some of a VM's workers went out, another did not: all come back.
      w.susp.phase = Phase::kRecovering;
      w.susp.last = "suspend failed: " + w.susp.failed + "; its other workers are being brought back";
      IVLOG_WARN("guest %lld: %s", id, w.susp.last.c_str());
      if (!start_round(w, CheckpointOp::kRecover)) {
        for (auto& t : w.susp.targets)
          if (t.out) give_up_target(w, t, "no checkpointer could be started to bring its worker back");
        finish_round(w, CheckpointOp::kRecover);
      }
    }
  } else if (op == CheckpointOp::kResume) {
    if (out == 0) {
      IVLOG_INFO("guest %lld: resumed%s%s: restore %.1f ms; suspended %.1f s", id, workers.empty() ? "" : ", ",
                 workers.c_str(), w.susp.back_ms,
                 std::chrono::duration<double>(clk::now() - w.susp.out_at).count());
      w.susp.phase = Phase::kNone;
      w.susp.last = "resumed";
      b.suspend.store(0, std::memory_order_release);
    } else {
      w.susp.phase = Phase::kSuspended;
      w.susp.last = "resume failed: " + w.susp.failed + "; still suspended, ivcudactl resume tries again";
      IVLOG_WARN("guest %lld: %s", id, w.susp.last.c_str());
    }
  } else {
    // kRecover: every target is running again or was ended. A process-mode
    // guest given up is being evicted: tend_guests ends it while it still
    // shows as recovering.
    if (b.evict.load(std::memory_order_acquire) != 0) return;
    w.susp.phase = Phase::kNone;
    w.susp.last += w.susp.failed.empty() ? ": done, it serves on" : ": " + w.susp.failed;
    b.suspend.store(0, std::memory_order_release);
    IVLOG_INFO("guest %lld: %s", id, w.susp.last.c_str());
  }
}

void Daemon::stop_checkpointer_if_idle() {
  if (!checkpointer_ || checkpoint_busy_ || !checkpoint_queue_.empty()) return;
  const bool any = std::any_of(workers_.begin(), workers_.end(),
                               [](const auto& kv) { return kv.second.susp.phase != Phase::kNone; });
  if (!any) {
    IVLOG_INFO("checkpointer: no guest is suspended; it ends");
    checkpointers_let_go_.insert(checkpointer_->pid());
    checkpointer_.reset();
  }
}

// Each pass: a guest whose workers all hold their calls is locked and
// checkpointed; one whose workers do not within kHoldWait serves on.
void Daemon::tend_suspensions() {
  if (checkpointer_ && checkpoint_busy_ && clk::now() - checkpoint_sent_ > kCheckpointerWait) {
    IVLOG_ERROR("checkpointer (pid %d): no answer in %lld s; it is killed, and what it was asked fails",
                static_cast<int>(checkpointer_->pid()),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(kCheckpointerWait).count()));
    ::kill(checkpointer_->pid(), SIGKILL);
    checkpointer_gone();
  }
  for (auto& [pid, w] : workers_) {
    if (w.susp.phase != Phase::kHolding) continue;
    const GuestStats& b = w.board->stats();
    const std::uint32_t quiet = b.quiet.load(std::memory_order_acquire);
    bool all_hold = quiet != 0;
    if (w.susp.supervisor != 0) {
      // A VM: each of its supervisor's live children (the supervisor starts
      // none while the guest is held) counts itself in `quiet` once it holds.
      const std::vector<pid_t> kids = live_children(w.susp.supervisor);
      all_hold = quiet >= kids.size();
      if (all_hold) {
        w.susp.targets.clear();
        for (const pid_t k : kids) w.susp.targets.push_back({k});
      }
    } else {
      // A process-mode guest: its worker. A warm entry's is the entry
      // process's child, named on the entry's line once ready (which may be
      // after the guest came); else the connection's process became the
      // worker (vm_supervisor.cc).
      const pid_t worker = w.process_worker(pid);
      all_hold = all_hold && worker > 0;
      if (all_hold) w.susp.targets = {{worker}};
    }
    if (all_hold) {
      w.susp.phase = Phase::kSuspending;
      if (!start_round(w, CheckpointOp::kSuspend)) {
        w.susp.phase = Phase::kNone;
        w.susp.last = "suspend failed: the checkpointer could not be started";
        w.board->stats().suspend.store(0, std::memory_order_release);
      }
    } else if (clk::now() > w.susp.deadline) {
      w.susp.phase = Phase::kNone;
      w.susp.last = "suspend failed: its worker" + std::string(w.susp.supervisor != 0 ? "s" : "") +
                    " did not hold their calls within " +
                    std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kHoldWait).count()) +
                    " s; it serves on";
      w.board->stats().suspend.store(0, std::memory_order_release);
      IVLOG_WARN("guest %lld: %s", static_cast<long long>(w.id), w.susp.last.c_str());
    }
  }
  stop_checkpointer_if_idle();
}

}  // namespace ivcuda::host
