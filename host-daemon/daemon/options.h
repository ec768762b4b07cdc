// ivcudad's command line and configuration file: what the operator sets, and
// the small parsers of its compound values. A function of their own, so that
// a reload (ivcudactl reload, SIGHUP) reads them again into fresh Options the
// same way, and so that tests can parse them without a daemon.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "host-daemon/daemon/mps.h"
#include "host-daemon/sandbox/sandbox.h"
#include "host-daemon/shared/tenant_share.h"
#include "host-daemon/shared/to_worker.h"

namespace ivcuda::host {

struct Options {
  std::string socket = "/run/ivcuda/ivcudad.sock";
  std::uint64_t shm_size = 1ull << 30;
  std::string gpus;
  std::size_t vectors = 8;
  std::uint32_t channels = 32;
  std::uint64_t ring_size = 256 * 1024;
  std::uint64_t staging = 8ull << 20;
  std::string driver = "libcuda.so.1";
  std::string nvml = "libnvidia-ml.so.1";
  unsigned spin_us = 200;
  unsigned max_guests = 64;
  unsigned max_guests_per_uid = 16;
  std::string log_level = "info";
  std::vector<std::string> plain_files;
  unsigned poll_us = 500;
  std::string join;
  std::vector<std::string> guest_sockets;  // SOCKET=GPUS
  std::uint32_t share_slots = ShareRegistry::kDefaultSlots;           // per tenant
  std::uint32_t share_slots_guest = ShareRegistry::kDefaultPerGuest;  // per guest
  std::uint32_t vm_spares = 1;
  std::uint32_t max_workers_per_guest = 8;  // a VM's workers at once, spares included
  unsigned warm_workers = 1;  // per socket: started ahead of the next guest
  unsigned warm_burst = 4;    // --warm-burst: more ahead while guests arrive fast
  std::string huge_pages = "off";  // --huge-pages on|off: guests' memory on 2 MiB pages
  std::uint64_t mem_limit = 0;  // device memory per guest; 0: no limit
  std::uint64_t context_reserve = kDefaultContextReserve;  // --context-reserve: per context, charged
  std::string recycle = "keep";      // --recycle-workers: a warm worker serves the tenant's next guest too (keep: its context too, scrubbed)
  std::string wait_for_ready = "off"; // --wait-for-ready: a guest with no ready worker takes the first one ready
  std::string context_turns = "off";  // --context-turns: workers make (and reset) a GPU's contexts one at a time
  std::string pin_arena = "on-use";  // --pin-arena: when a worker page-locks the guest's arena
  ObjectLimits limits;     // --object-limits
  std::string socket_group;              // --socket-group: who may connect (QEMU's user)
  std::string socket_mode;               // --socket-mode, octal
  sandbox::Config sandbox;  // --sandbox, --user
  std::string sandbox_mode = "on";
  bool print_allowlist = false;
  std::string control_socket = "/run/ivcuda/control.sock";  // ivcudactl's; "" or "none": off
  bool control_socket_given = false;     // on the command line or in the config file
  std::string control_group;             // --control-group: who besides root may use it
  std::string metrics_listen;            // --metrics-listen ADDR:PORT; "": off
  bool mps = false;                      // --mps: workers are MPS clients (host-daemon/daemon/mps.h)
  MpsConfig mps_cfg;       // --mps-pipe-dir, --mps-log-dir
  unsigned compute = 100;                // --compute-share: % of the SMs per guest under MPS
  std::uint64_t mps_headroom = 2ull << 30;  // --mps-mem-headroom: MPS's memory cap is quota + this
};

// ivcudad's command line (argv[0] first, as main() gets it) into `o`. CLI11
// is large and header-only: options.cc alone includes it, so that main(),
// a reload and the options' test do not compile it again.
//
// parse_options: "" when it parses, else why not (CLI11's words).
std::string parse_options(int argc, const char* const* argv, Options* o);
// parse_command_line, for main(): a --help is printed to stdout, an error
// with a hint to stderr, and the status to exit with returned; nullopt when
// the daemon goes on.
std::optional<int> parse_command_line(int argc, const char* const* argv, Options* o);

// --object-limits KIND=N[,KIND=N...]: how many objects of a kind one guest
// process may hold at once (to_worker.h, ObjectLimits). Returns "" or why not.
std::string parse_object_limits(const std::string& spec, ObjectLimits* out);

// Workers a socket keeps started ahead at most (--warm-workers, warm=N).
constexpr unsigned kMaxWarm = 8;

// A --guest-socket entry:
// SOCKET=GPUS[:mem-limit=SIZE][:compute=PCT][:warm=N][:huge-pages=on|off].
// The socket's path holds no ':'. Returns false with *err set.
struct SocketSpec {
  std::string path;
  std::vector<int> gpus;
  std::uint64_t mem_limit = 0;
  unsigned compute = 100;  // % of the SMs under --mps
  unsigned warm = 1;       // workers started ahead (--warm-workers)
  bool huge = false;       // guests' memory on 2 MiB pages (--huge-pages)
};
bool parse_socket_spec(const std::string& spec, std::uint64_t default_limit, unsigned default_compute,
                       unsigned default_warm, bool default_huge, SocketSpec* out, std::string* err);

// --gpus: "all" or "" (every GPU: an empty list), or host indices "0,2".
// Sets *err on a bad entry.
std::vector<int> parse_gpus(const std::string& s, std::string* err);

}  // namespace ivcuda::host
