// See options.h.
#include "host-daemon/daemon/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "host-daemon/shared/from_worker.h"

namespace ivcuda::host {

namespace {

// Where guests connect and the shared memory each gets.
void define_memory_options(CLI::App& app, Options& o) {
  app.set_config("--config", "", "read options from an INI/TOML file (keys = long option names)");
  app.add_option("--socket", o.socket, "UNIX socket to listen on (QEMU: -chardev socket,path=...)")
      ->capture_default_str();
  app.add_option("--shm-size", o.shm_size, "shared memory per guest, e.g. 512M, 2G")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--object-limits",
         [&](const std::string& v) {
           if (const std::string bad = parse_object_limits(v, &o.limits); !bad.empty())
             throw CLI::ValidationError("--object-limits", bad);
         },
         "objects one guest process may hold at once, e.g. streams=1000,events=50000 (kinds: contexts, "
         "streams, events, modules, graphs, graph-nodes, graph-execs, arrays, pools, mem-handles, "
         "user-objects; defaults in docs/operating.md)");
  app.add_option("--gpus", o.gpus, "host GPU indices guests may use, e.g. 0,2 (default: all)");
  app.add_option("--vectors", o.vectors, "doorbell vectors per peer (QEMU's ivshmem vectors= must match)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--channels", o.channels, "channels per guest (threads with their own ring)")
      ->check(CLI::Range(2, 256))
      ->capture_default_str();
  app.add_option("--ring-size", o.ring_size, "bytes per ring, a power of two")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--staging-size", o.staging, "staging bytes per channel for pageable copies")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
}

// What a worker loads, and how many guests and workers are served.
void define_worker_options(CLI::App& app, Options& o) {
  app.add_option("--driver", o.driver, "the CUDA driver library to load")->capture_default_str();
  app.add_option("--nvml", o.nvml,
                 "the NVML library workers load to answer their guests' NVML queries (\"none\": guests' NVML "
                 "answers LIBRARY_NOT_FOUND)")
      ->capture_default_str();
  app.add_option("--spin-us", o.spin_us, "how long a worker polls after the last request before sleeping")
      ->capture_default_str();
  app.add_option("--max-guests", o.max_guests, "guests served at once")->capture_default_str();
  app.add_option("--max-guests-per-uid", o.max_guests_per_uid,
                 "guests served at once for one connecting user id (0: no limit besides --max-guests); "
                 "each guest pins --shm-size of RAM and counts one, and each further worker of a VM that "
                 "serves a process one more (each holds a GPU context)")
      ->capture_default_str();
  app.add_option("--max-workers-per-guest", o.max_workers_per_guest,
                 "worker processes one VM may have at once, spare workers included (a VM's CUDA process gets "
                 "a worker each; each holds a context on every GPU); a process past it is refused")
      ->check(CLI::Range(1u, VmShared::kMaxSlots))
      ->capture_default_str();
  app.add_option("--plain-file", o.plain_files,
                 "serve an ivshmem-plain guest through this memory file (QEMU: memory-backend-file, "
                 "share=on, mem-path=FILE, size=--shm-size); repeatable. No interrupts: both sides poll")
      ->take_all();
  app.add_option("--plain-poll-us", o.poll_us, "how often an idle ivshmem-plain worker looks for work")
      ->capture_default_str();
  app.add_option("--join", o.join,
                 "join an existing ivshmem-server at this socket as its host peer, instead of listening; "
                 "it serves one guest at a time (all peers of such a server share one memory)");
}

// Further sockets, who may connect, quotas and what a tenant may share.
void define_socket_options(CLI::App& app, Options& o) {
  app.add_option("--guest-socket", o.guest_sockets,
                 "SOCKET=GPUS[:mem-limit=SIZE][:compute=PCT][:warm=N]: one more socket, whose guests get only "
                 "these host GPUs (e.g. /run/ivcuda/vm2.sock=1:mem-limit=20G); repeatable. One socket per VM "
                 "gives each VM its own GPUs and quota")
      ->take_all();
  app.add_option("--socket-group", o.socket_group,
                 "group given the sockets, so that its members (QEMU's user) may connect; with it the "
                 "sockets' mode is 0660 unless --socket-mode says otherwise");
  app.add_option("--socket-mode", o.socket_mode, "the sockets' permission bits, octal, e.g. 0660")
      ->check([](const std::string& v) {
        char* end = nullptr;
        const unsigned long m = std::strtoul(v.c_str(), &end, 8);
        return v.empty() || *end != '\0' || m > 0777 ? std::string("an octal mode from 0 to 0777") : std::string();
      });
  app.add_option("--mem-limit", o.mem_limit,
                 "device memory each guest may hold, e.g. 20G (0: no limit); a VM's processes share it, "
                 "and cuMemGetInfo/cuDeviceTotalMem show it as the total")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--context-reserve", o.context_reserve,
                 "device memory charged to a guest's quota for each CUDA context its worker holds for it (the "
                 "one it starts with, created ones, other GPUs' primary ones; 0: none); a guest whose quota "
                 "cannot cover its first context gets CUDA_ERROR_OUT_OF_MEMORY from cuInit")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--pin-arena", o.pin_arena,
                 "when a worker page-locks the guest's arena for the GPU: on-use (a channel's staging when "
                 "it is first served, page-locked allocations when made; a worker made for a guest starts "
                 "in milliseconds) or at-start (all of it, about 0.8 s per GiB, before the guest is served)")
      ->check(CLI::IsMember({"on-use", "at-start"}))
      ->capture_default_str();
  app.add_option("--recycle-workers", o.recycle,
                 "on: a warm worker whose process-mode guest ended with nothing under way resets its contexts "
                 "(the driver frees and scrubs their memory) and waits, with new shared memory and doorbells, "
                 "for the next guest of the same user on the same socket, so that programs run back to back "
                 "do not wait for a driver and context to start; keep: the same, but a guest that used only "
                 "what the worker can scrub (plain allocations, modules, streams, events, launches, copies) "
                 "leaves the contexts to the next guest, its memory zeroed, instead of costing the GPU a reset "
                 "and a new context (docs/security.md says what is reset and what is scrubbed). In a VM, the "
                 "worker of a process that exited with nothing under way serves the VM's next process the same "
                 "way (off: it is killed)")
      ->check(CLI::IsMember({"on", "keep", "off"}))
      ->capture_default_str();
  app.add_option("--wait-for-ready", o.wait_for_ready,
                 "with --recycle-workers on: a guest that finds no ready worker waits, unanswered, for the first "
                 "one of its socket that becomes ready (at most 1.5 s), instead of taking one that is still "
                 "starting or being recycled at once and waiting for that one (off by default: on an H100 it shortened "
                 "back-to-back starts' tail but lengthened a burst's and spread arrivals'; docs/performance.md)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--context-turns", o.context_turns,
                 "on: workers make and reset a GPU's contexts one at a time, in the order they asked (the "
                 "driver makes them one after another anyway: asked at once, all are ready only at the end), "
                 "so that the first of several starting workers is ready after one context's time; made: only "
                 "the making takes turns, resets go as they come; off: each as it comes")
      ->check(CLI::IsMember({"on", "made", "off"}))
      ->capture_default_str();
  app.add_option("--share-slots", o.share_slots,
                 "objects (CUDA IPC memory and event handles, pool pointers) one tenant may have exported at "
                 "once (a tenant: a VM, or one user's process-mode programs on one socket)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--share-slots-per-guest", o.share_slots_guest,
                 "of those, what one guest (one VM, one process-mode program) may have exported at once")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
}

// Workers started ahead, their memory's pages, their sandbox, the log.
void define_start_options(CLI::App& app, Options& o) {
  app.add_option("--warm-workers", o.warm_workers,
                 "workers kept started per socket for the next guest, so that it finds its driver, context and "
                 "registered memory ready (each holds a context on the socket's first GPU and --shm-size of "
                 "page-locked RAM; per socket: --guest-socket ...:warm=N; 0: none)")
      ->check(CLI::Range(0u, kMaxWarm))
      ->capture_default_str();
  app.add_option("--warm-burst", o.warm_burst,
                 "while guests arrive faster than workers start, each socket with warm workers keeps up to this "
                 "many more started ahead (one more per guest beyond the first in the last 2 s); 30 s without a guest "
                 "lets the extra ones go (each holds a context; 0: never more than --warm-workers)")
      ->check(CLI::Range(0u, kMaxWarm))
      ->capture_default_str();
  app.add_option("--huge-pages", o.huge_pages,
                 "on: each guest's shared memory on 2 MiB huge pages from the host's reserved pool "
                 "(vm.nr_hugepages), 4 KiB pages when too few are free; its registration with the GPU is "
                 "faster. For VM sockets: a process-mode guest on huge pages cannot register its own memory "
                 "zero-copy (cuMemHostRegister then stages). Per socket: --guest-socket ...:huge-pages=on")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--vm-spare-workers", o.vm_spares,
                 "workers kept started per VM for its next CUDA process (each holds a context per GPU)")
      ->check(CLI::Range(0u, 8u))
      ->capture_default_str();
  app.add_option("--sandbox", o.sandbox_mode,
                 "on: each worker runs with no_new_privs, no capabilities, a seccomp allowlist and Landlock "
                 "once its driver is open, and the daemon does not serve on a kernel below Landlock ABI 6; "
                 "degraded: the same with whatever Landlock the kernel has (said at start); audit: degraded, but a "
                 "system call outside the allowlist is made and the kernel logs it instead of refusing it, to find "
                 "what a driver needs; off: none of it; audit and off for debugging only. Also from the "
                 "environment: IVCUDA_SANDBOX")
      ->check(CLI::IsMember({"on", "degraded", "audit", "off"}))
      ->envname("IVCUDA_SANDBOX")
      ->capture_default_str();
  app.add_option("--user", o.sandbox.user,
                 "workers drop to this user once their driver is open (the daemon must run as root; the "
                 "user needs read-write access to /dev/nvidia*)");
  app.add_flag("--print-syscall-allowlist", o.print_allowlist,
               "print the system calls a sandboxed worker may make, with why, and exit");
  app.add_option("--log-level", o.log_level, "error, warn, info or debug")
      ->check(CLI::IsMember({"error", "warn", "info", "debug"}))
      ->capture_default_str();
}

// The operator's side: control socket, MPS, metrics.
void define_operator_options(CLI::App& app, Options& o) {
  app.add_option("--control-socket", o.control_socket,
                 "the operator's socket (ivcudactl status, evict, reload); only root, the daemon's user and "
                 "--control-group may use it; \"none\": no control socket")
      ->capture_default_str();
  app.add_option("--control-group", o.control_group,
                 "group whose members may use the control socket (its mode becomes 0660)");
  app.add_flag("--mps", o.mps,
               "run every worker as a client of NVIDIA MPS (started here, or joined), so guests' kernels share "
               "the GPU side by side with --compute-share of its SMs each (docs/operating.md)");
  app.add_option("--compute-share", o.compute,
                 "with --mps: the percentage of the GPU's SMs one guest may use (per socket: "
                 "--guest-socket ...:compute=N)")
      ->check(CLI::Range(1u, 100u))
      ->capture_default_str();
  app.add_option("--mps-pipe-dir", o.mps_cfg.pipe_dir, "with --mps: the MPS control daemon's pipe directory")
      ->capture_default_str();
  app.add_option("--mps-log-dir", o.mps_cfg.log_dir, "with --mps: the MPS control daemon's log directory")
      ->capture_default_str();
  app.add_option("--mps-mem-headroom", o.mps_headroom,
                 "with --mps and a quota: MPS caps each guest's device memory at its quota plus this (code and "
                 "what a context holds beyond --context-reserve take memory that the quota does not count)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--metrics-listen", o.metrics_listen,
                 "serve Prometheus metrics at http://ADDR:PORT/metrics, e.g. 127.0.0.1:9400 (DCGM-style names)");
}

// Every option of ivcudad on `app`, writing into `o`.
void define_options(CLI::App& app, Options& o) {
  define_memory_options(app, o);
  define_worker_options(app, o);
  define_socket_options(app, o);
  define_start_options(app, o);
  define_operator_options(app, o);
}

constexpr const char* kAbout = "ivcudad - serves CUDA to QEMU guests and local processes over ivshmem";

// What the options' values do not say by themselves.
void after_parse(const CLI::App& app, Options* o) {
  o->control_socket_given = app.get_option("--control-socket")->count() > 0;
}

}  // namespace

std::string parse_options(int argc, const char* const* argv, Options* o) {
  CLI::App app{kAbout};
  define_options(app, *o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  after_parse(app, o);
  return {};
}

std::optional<int> parse_command_line(int argc, const char* const* argv, Options* o) {
  CLI::App app{kAbout};
  define_options(app, *o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);  // help to stdout, an error and its hint to stderr
  }
  after_parse(app, o);
  return std::nullopt;
}

std::string parse_object_limits(const std::string& spec, ObjectLimits* out) {
  using L = ObjectLimits;
  static const std::pair<const char*, std::uint32_t L::*> kKinds[] = {
      {"contexts", &L::contexts},       {"streams", &L::streams},         {"events", &L::events},
      {"modules", &L::modules},         {"graphs", &L::graphs},           {"graph-nodes", &L::graph_nodes},
      {"graph-execs", &L::graph_execs}, {"arrays", &L::arrays},           {"pools", &L::pools},
      {"mem-handles", &L::mem_handles}, {"user-objects", &L::user_objects}, {"links", &L::links},
      {"green-contexts", &L::green_contexts}, {"resource-descs", &L::resource_descs}, {"resources", &L::resources}};
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    auto kind = std::find_if(std::begin(kKinds), std::end(kKinds), [&](const auto& k) { return key == k.first; });
    if (kind == std::end(kKinds)) {
      std::string known;
      for (const auto& k : kKinds) known += std::string(known.empty() ? "" : ", ") + k.first;
      return "unknown kind '" + key + "' (kinds: " + known + ")";
    }
    char* end = nullptr;
    const std::string value = eq == std::string::npos ? std::string() : item.substr(eq + 1);
    const unsigned long n = std::strtoul(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || n == 0 || n > 0xffffffffu)
      return "'" + item + "': expected " + key + "=N with N from 1 to 4294967295";
    out->*(kind->second) = static_cast<std::uint32_t>(n);
  }
  return {};
}

std::vector<int> parse_gpus(const std::string& s, std::string* err) {
  std::vector<int> out;
  if (s.empty() || s == "all") return out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > 1023) {
      *err = "bad GPU index '" + item + "' in --gpus";
      return {};
    }
    out.push_back(static_cast<int>(v));
  }
  return out;
}

bool parse_socket_spec(const std::string& spec, std::uint64_t default_limit, unsigned default_compute,
                       unsigned default_warm, bool default_huge, SocketSpec* out, std::string* err) {
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ':')) parts.push_back(item);
  const std::string head = parts.empty() ? std::string() : parts[0];
  const auto eq = head.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == head.size()) {
    *err = "no SOCKET=GPUS";
    return false;
  }
  out->path = head.substr(0, eq);
  out->gpus = parse_gpus(head.substr(eq + 1), err);
  if (!err->empty()) return false;
  out->mem_limit = default_limit;
  out->compute = default_compute;
  out->warm = default_warm;
  out->huge = default_huge;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const auto kv = parts[i].find('=');
    const std::string key = parts[i].substr(0, kv);
    std::string value = kv == std::string::npos ? std::string() : parts[i].substr(kv + 1);
    if (key == "compute" && !value.empty()) {
      char* end = nullptr;
      const unsigned long pct = std::strtoul(value.c_str(), &end, 10);
      if (*end != '\0' || pct < 1 || pct > 100) {
        *err = "compute: '" + value + "' is not a percentage from 1 to 100";
        return false;
      }
      out->compute = static_cast<unsigned>(pct);
      continue;
    }
    if (key == "warm" && !value.empty()) {
      char* end = nullptr;
      const unsigned long n = std::strtoul(value.c_str(), &end, 10);
      if (*end != '\0' || n > kMaxWarm) {
        *err = "warm: '" + value + "' is not a count from 0 to " + std::to_string(kMaxWarm);
        return false;
      }
      out->warm = static_cast<unsigned>(n);
      continue;
    }
    if (key == "huge-pages" && (value == "on" || value == "off")) {
      out->huge = value == "on";
      continue;
    }
    if (key != "mem-limit" || value.empty()) {
      *err = "unknown setting '" + parts[i] + "'";
      return false;
    }
    // CLI11's size parser, as for --mem-limit: 20G, 512M, 1073741824.
    try {
      if (const std::string bad = CLI::AsSizeValue(false)(value); !bad.empty()) {
        *err = "mem-limit: " + bad;
        return false;
      }
      out->mem_limit = std::stoull(value);
    } catch (const std::exception& e) {
      *err = std::string("mem-limit: ") + e.what();
      return false;
    }
  }
  return true;
}

}  // namespace ivcuda::host
