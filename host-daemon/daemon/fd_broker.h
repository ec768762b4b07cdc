// What the processes of one tenant share, kept by the daemon: driver file
// descriptors of exported allocations and pools (deposits), and the registry
// of everything the driver exports as plain bytes (tenant_share.h).
//
// Every worker has one SOCK_SEQPACKET line to the daemon. A physical
// allocation exported as a POSIX file descriptor (cuMemExportToShareableHandle)
// is an fd in the exporting worker; the guest process that imports it is
// often served by another worker (process mode gives each connecting process
// its own), which needs that very fd for cuMemImportFromShareableHandle.
// Workers are siblings with no channel of their own, and borrowing an fd from
// a sibling (pidfd_getfd) needs ptrace rights that a sandboxed worker should
// not have. So the exporter deposits a dup under a fresh 128-bit random token,
// and a worker of the same tenant fetches a dup of it by that token; the
// guest only ever holds the token. Registry entries travel the same lines.
//
// Tenants (docs/security.md, "Tenants and what they share"). The daemon makes
// each line for one guest, i.e. one connection (a VM, a process-mode program,
// an ivshmem-plain file), and files that guest under a tenant:
//  - a VM, a plain file, a --join guest: the connection is its own tenant;
//  - a process-mode program: its user on its socket (socket, peer uid), so
//    that processes of one user share as torch.multiprocessing needs, and
//    other users on the socket never do.
// A socket's connection is either, and the daemon learns which from the
// connection's first use of its line: a VM's supervisor asks a line for each
// guest process's worker before any such worker runs (vm_supervisor.h), a
// process-mode worker never asks one. So a guest whose first request is
// kNewLine is a VM; one whose first request shares something is a process.
// A warm worker's line is made before its guest's user is known: it shares
// nothing until the daemon admits the guest at hand-off.
//
// A request is answered from the asking line's tenant only: a token or ticket
// from another tenant, or a forged one, finds nothing. What a guest shared
// goes when the line it came on ends (its worker ended) and when the guest's
// connection ends; nothing outlives its guest. Caps per guest, per tenant and
// in all bound the daemon's descriptors and memory, so one guest cannot use
// up its tenant's room, nor a tenant the daemon's.
//
// The daemon never waits on a worker (answers are sent MSG_DONTWAIT; a worker
// that does not read them, or sends anything malformed, loses its line), and
// a worker waits for an answer at most kAnswerTimeout (then its line is gone
// and it shares only with itself).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "host-daemon/shared/from_worker.h"
#include "host-daemon/shared/tenant_share.h"
#include "ivcuda/result.h"
#include "ring/sys.h"

namespace ivcuda::host {

// How the daemon files a guest's lines (see above).
struct Tenancy {
  enum class Kind : std::uint8_t {
    kPending,  // a warm worker's, before its guest came: shares nothing
    kOwn,      // the connection is a tenant of its own
    kUser,     // (socket, uid) if the guest is one process, else its connection
  };
  Kind kind = Kind::kOwn;
  std::uint32_t socket = 0;
  std::uint32_t uid = 0;
  static Tenancy pending() { return {Kind::kPending, 0, 0}; }
  static Tenancy own() { return {Kind::kOwn, 0, 0}; }
  static Tenancy user(std::uint32_t socket, std::uint32_t uid) { return {Kind::kUser, socket, uid}; }
};

// What the daemon keeps for its tenants, at most.
struct BrokerLimits {
  std::uint32_t entries_per_tenant = ShareRegistry::kDefaultSlots;    // --share-slots
  std::uint32_t entries_per_guest = ShareRegistry::kDefaultPerGuest;  // --share-slots-per-guest
  std::size_t deposits_per_guest = 1024;
  std::size_t deposits_per_tenant = 4096;
  std::size_t deposits = 8192;        // in all: each is an fd of the daemon's
  std::size_t lines_per_guest = 512;  // a VM's workers (each an fd of the daemon's)
};

// The daemon's side.
class FdBroker {
 public:
  using Limits = BrokerLimits;
  FdBroker() = default;
  explicit FdBroker(Limits l) : lim_(l) {}

  // A socket pair for a new worker of guest `guest` (filed as `t` if the
  // guest is new): the daemon keeps one end, the returned end is the
  // worker's (to hand to BrokerClient after fork).
  Result<sys::UniqueFd> add_worker(std::uint32_t guest, Tenancy t = Tenancy::own());
  // A warm worker's guest arrived: from now on its lines are filed as `t`.
  void admit(std::uint32_t guest, Tenancy t);
  // The guest's connection ended: its lines are closed, what it shared goes.
  void end_guest(std::uint32_t guest);
  // A recycled worker (main.cc) serves the tenant's next guest under the
  // same number: what the last one shared goes, its lines and tenant stay.
  void forget_shares(std::uint32_t guest);
  // The daemon's ends, to poll for POLLIN.
  std::vector<int> fds() const;
  // Serves one message on `fd` (readable). A worker that hung up or sent
  // garbage loses its line, and what it shared goes with it.
  void serve(int fd);
  // What guest `guest` has shared now (tests, logs).
  std::size_t deposits_of(std::uint32_t guest) const;
  std::size_t entries_of(std::uint32_t guest) const;
  // In a freshly forked worker: closes the daemon's ends (of every worker),
  // which are not the child's to read or write, and forgets the rest.
  void close_in_child() noexcept;

 private:
  struct TenantKey {
    std::uint32_t kind = 0;  // 1: a connection (a = its guest), 2: a user (a = socket, b = uid)
    std::uint32_t a = 0, b = 0;
    auto operator<=>(const TenantKey&) const = default;
  };
  struct Deposit {
    sys::UniqueFd fd;
    std::uint64_t value = 0;
    std::uint64_t line = 0;
    std::uint32_t guest = 0;
  };
  struct Tenant {
    ShareRegistry registry;
    std::map<BrokerToken, Deposit> deposits;
    unsigned guests = 0;
  };
  struct Guest {
    Tenancy tenancy;
    std::optional<TenantKey> tenant;  // decided at the first request that needs it
    std::size_t lines = 0;
    std::size_t deposits = 0;
  };
  struct Line {
    sys::UniqueFd fd;
    std::uint64_t id = 0;
    std::uint32_t guest = 0;
  };
  Tenant* tenant_of(std::uint32_t guest, bool asks_line);
  Result<sys::UniqueFd> make_line(std::uint32_t guest);
  void drop(int fd);
  void forget_deposits(Tenant& t, bool (*match)(const Deposit&, std::uint64_t), std::uint64_t what);
  // Serve one request of each family; false: the line broke the protocol.
  bool serve_fds(Line& line, const void* msg, std::size_t n, sys::UniqueFd passed);
  bool serve_share(Line& line, const void* msg, std::size_t n);

  Limits lim_;
  std::map<int, Line> lines_;  // by the daemon's end
  std::map<std::uint32_t, Guest> guests_;
  std::map<TenantKey, Tenant> tenants_;
  std::size_t total_deposits_ = 0;
  std::uint64_t next_line_ = 1;
};

}  // namespace ivcuda::host
