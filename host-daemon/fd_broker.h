// Passing file descriptors between the workers of one tenant, through the
// daemon. A physical allocation exported as a POSIX file descriptor
// (cuMemExportToShareableHandle) is an fd in the exporting worker; the guest
// process that imports it is often served by another worker (process mode
// gives each connecting process its own), which needs that very fd to call
// cuMemImportFromShareableHandle. Workers are siblings with no channel of
// their own, and borrowing an fd from a sibling (pidfd_getfd) needs ptrace
// rights that a sandboxed worker should not have. So each worker keeps one
// SOCK_SEQPACKET socket to the daemon: the exporter deposits the fd under a
// fresh 128-bit random token, and a worker of the same tenant fetches a dup
// of it by that token. The guest only ever holds the token; a token from
// another tenant, or a forged one, finds nothing.
//
// The daemon keeps deposits while the tenant has any worker, at most
// kMaxDepositsPerTenant of them (the oldest goes first), and at most
// kMaxDeposits in all (a tenant at that limit can only replace its own
// oldest): an exported fd outlives its exporter in CUDA too, as long as
// somebody holds it, but one tenant must not use up the daemon's fds.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "ivcuda/result.h"
#include "ring/sys.h"

namespace ivcuda::host {

using BrokerToken = std::array<std::uint8_t, 16>;

// A fresh random token (getrandom).
Result<BrokerToken> new_broker_token();

// The worker's side: blocking request/answer on its socket. One request at a
// time (a worker serves its guest from one thread).
class BrokerClient {
 public:
  BrokerClient() = default;
  explicit BrokerClient(int fd) : fd_(fd) {}
  bool connected() const noexcept { return fd_.valid(); }
  // Gives up the line (to hand it to a worker that runs in this process).
  int release() noexcept { return fd_.release(); }
  // Leaves a dup of `fd` with the daemon under `token`, with a value the
  // fetcher gets back (the allocation's size).
  Result<void> deposit(const BrokerToken& token, int fd, std::uint64_t value);
  // A dup of the fd deposited under `token` by a worker of this tenant, and
  // its value. ENOENT: no such deposit.
  Result<std::pair<sys::UniqueFd, std::uint64_t>> fetch(const BrokerToken& token);
  // A line of its own for another worker of the same tenant (a VM's
  // supervisor gives one to each process's worker).
  Result<sys::UniqueFd> new_line();

 private:
  sys::UniqueFd fd_;
};

// The daemon's side.
class FdBroker {
 public:
  static constexpr std::size_t kMaxDepositsPerTenant = 1024;
  static constexpr std::size_t kMaxDeposits = 8192;
  static constexpr std::size_t kMaxLinesPerTenant = 4096;

  // A socket pair for a new worker of `tenant`: the daemon keeps one end,
  // the returned end is the worker's (to hand to BrokerClient after fork).
  Result<sys::UniqueFd> add_worker(std::uint32_t tenant);
  // The daemon's ends, to poll for POLLIN.
  std::vector<int> fds() const;
  // Serves one message on `fd` (readable). A worker that hung up or sent
  // garbage is dropped; a tenant with no workers left loses its deposits.
  void serve(int fd);
  std::size_t deposits(std::uint32_t tenant) const;
  // In a freshly forked worker: closes the daemon's ends (of every worker),
  // which are not the child's to read or write.
  void close_in_child() noexcept;

 private:
  struct Deposit {
    sys::UniqueFd fd;
    std::uint64_t value = 0;
  };
  struct Tenant {
    std::map<BrokerToken, Deposit> by_token;
    std::deque<BrokerToken> order;  // oldest first
    unsigned workers = 0;
  };
  void drop(int fd);
  std::map<int, std::pair<sys::UniqueFd, std::uint32_t>> ends_;  // daemon end -> (fd, tenant)
  std::map<std::uint32_t, Tenant> tenants_;
  std::size_t total_ = 0;  // deposits over all tenants
};

}  // namespace ivcuda::host
