// The asking end of a line to the daemon's fd broker: a worker's, and a VM
// supervisor's, which asks for its workers' lines (host-daemon/daemon/fd_broker.h
// says what is shared and with whom; the messages are from_worker.h's broker_line).
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>

#include "host-daemon/shared/from_worker.h"
#include "host-daemon/shared/tenant_share.h"
#include "ivcuda/result.h"
#include "ring/sys.h"

namespace ivcuda::host {

// The worker's side: blocking request/answer on its line. One request at a
// time (a worker serves its guest from one thread).
class BrokerClient {
 public:
  static constexpr std::chrono::seconds kAnswerTimeout = broker_line::kAnswerTimeout;

  BrokerClient() = default;
  explicit BrokerClient(int fd) : fd_(fd) {}
  bool connected() const noexcept { return fd_.valid(); }
  // Gives up the line (to hand it to a worker that runs in this process).
  int release() noexcept { return fd_.release(); }
  // Leaves a dup of `fd` with the daemon under `token`, with a value the
  // fetcher gets back (the allocation's size). ENOSPC: a cap is reached.
  Result<void> deposit(const BrokerToken& token, int fd, std::uint64_t value);
  // A dup of the fd deposited under `token` in this line's tenant, and its
  // value. ENOENT: no such deposit.
  Result<std::pair<sys::UniqueFd, std::uint64_t>> fetch(const BrokerToken& token);
  // A line of its own for another worker of the same guest (a VM's
  // supervisor gives one to each process's worker).
  Result<sys::UniqueFd> new_line();
  // The tenant's registry (tenant_share.h), as ShareRegistry's calls of the
  // same names; ENOENT: the lookup found nothing.
  Result<ShareTicket> publish(const ShareEntry& e);
  Result<ShareFound> lookup(ShareKind kind, const ShareTicket& t);
  Result<void> withdraw(ShareKind kind, std::uint64_t key);

 private:
  // A line that failed (timed out, hung up, answered out of turn) is closed:
  // a late answer must never be taken for the next request's.
  template <class M>
  Result<M> ask(const M& m, int fd_out, sys::UniqueFd* fd_in);
  sys::UniqueFd fd_;
};

}  // namespace ivcuda::host
