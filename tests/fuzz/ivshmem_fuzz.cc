// libFuzzer harness: what the daemon reads from sockets it does not trust.
//  - the ivshmem server protocol as a client reads it (ring/ivshmem.cc:
//    MessageReader, the greeting in ivshmem_client_handshake, IvshmemClient's
//    later peer changes): the daemon with --join reads it from somebody
//    else's ivshmem-server, and the guest library from the daemon;
//  - the fd broker's requests (host-daemon/daemon/fd_broker.cc, FdBroker::serve),
//    which the daemon reads from every worker, a worker being only as
//    trustworthy as the guest memory it parses.
// The bytes go through a real socket pair with real descriptors attached
// (SCM_RIGHTS), written in full before the code under test reads, so nothing
// ever waits.
//
// Input: [mode u8] then chunks.
//   mode bit 0 clear: ivshmem. [vectors u8][max_peers u8][learned vectors u8]
//     then messages [kind u8][value]: kind bits 0-1 attach none / an eventfd /
//     a memfd (bit 5: of one page, else empty) / two eventfds; bit 2: the
//     value is one signed byte, else eight; bit 3: send the value's bytes in
//     two writes (the fd with the second); bit 4: stop after the first
//     byte(s) of the value (a message cut short by the end of the stream).
//     After the greeting: [peer u8][vector u8] pairs to notify.
//   mode bit 0 set: fd broker. Two worker lines (bit 1: of two tenants), then
//     requests [sel u8][op u8][token byte u8][value u64]: sel bit 0 picks the
//     line, bits 1-2 the fds attached (0-2 eventfds), bit 3 a short datagram.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "host-daemon/daemon/fd_broker.h"
#include "ring/ivshmem.h"
#include "ring/sys.h"
#include "tests/fuzz/fuzz_input.h"

using namespace ivcuda;

namespace {

constexpr std::size_t kMaxMessages = 200;  // descriptors in flight stay well under any limit

using fuzz::Input;

// Sends bytes with up to two descriptors; the descriptors are the kernel's
// to pass on (and the receiver's to close) once sent.
void send_raw(int sock, const void* p, std::size_t n, std::span<const int> fds) {
  iovec iov{const_cast<void*>(p), n};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) unsigned char ctl[CMSG_SPACE(sizeof(int) * 2)] = {};
  if (!fds.empty()) {
    mh.msg_control = ctl;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  (void)::sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

// The descriptors a message carries (closed here once sent: the kernel
// holds its own reference while they are in flight).
std::vector<sys::UniqueFd> make_fds(unsigned kind, bool page) {
  std::vector<sys::UniqueFd> fds;
  switch (kind & 3) {
    case 1:
      if (auto e = sys::make_eventfd(true)) fds.push_back(std::move(*e));
      break;
    case 2:
      if (auto m = sys::make_memfd("ivcuda-fuzz-shm", page ? 4096 : 0)) fds.push_back(std::move(*m));
      break;
    case 3:
      for (int i = 0; i < 2; ++i)
        if (auto e = sys::make_eventfd(true)) fds.push_back(std::move(*e));
      break;
    default:
      break;
  }
  return fds;
}

void fuzz_ivshmem(Input& in) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
  sys::UniqueFd server(sv[0]), client(sv[1]);
  const std::size_t vectors = in.take<std::uint8_t>() % 5;  // 0: learned from the memory
  const std::size_t max_peers = in.take<std::uint8_t>() % 4 + 1;
  const std::size_t learned = in.take<std::uint8_t>() % 70;
  for (std::size_t i = 0; i < kMaxMessages && !in.done(); ++i) {
    const auto kind = in.take<std::uint8_t>();
    if (kind == 0xff) break;  // the rest of the input is for after the greeting
    std::int64_t value = (kind & 4) != 0 ? in.take<std::int8_t>() : in.take<std::int64_t>();
    unsigned char bytes[8];
    std::memcpy(bytes, &value, sizeof bytes);  // the wire is little-endian, as is this host
    const std::size_t len = (kind & 0x10) != 0 ? 1 + (kind >> 6) : sizeof bytes;
    std::vector<sys::UniqueFd> owned = make_fds(kind, (kind & 0x20) != 0);
    std::vector<int> fds;
    for (auto& f : owned) fds.push_back(f.get());
    if ((kind & 8) != 0 && len > 1) {
      send_raw(server.get(), bytes, 1, {});
      send_raw(server.get(), bytes + 1, len - 1, fds);
    } else {
      send_raw(server.get(), bytes, len, fds);
    }
    if (len != sizeof bytes) break;  // a cut-short message ends the stream
  }
  // Later notifications are read after the greeting; the stream ends here,
  // so every read ends at EOF at the latest instead of waiting.
  ::shutdown(server.get(), SHUT_WR);
  auto vectors_of = [&](int) -> Result<std::size_t> { return learned; };
  auto c = ivshmem::ivshmem_client_handshake(std::move(client), vectors, std::chrono::milliseconds(0), vectors_of,
                                             max_peers);
  if (!c) return;
  (void)c->process_pending();
  for (int i = 0; i < 8 && !in.done(); ++i) {
    const auto peer = in.take<std::uint8_t>();
    const auto vec = in.take<std::uint8_t>();
    (void)c->notify(peer == 0xff ? c->id() : peer, vec);
  }
}

void fuzz_broker(Input& in, std::uint8_t mode) {
  host::FdBroker broker;
  auto w0 = broker.add_worker(1);
  auto w1 = broker.add_worker((mode & 2) != 0 ? 2 : 1);
  if (!w0 || !w1) return;
  const int lines[2] = {w0->get(), w1->get()};
  for (std::size_t i = 0; i < kMaxMessages && !in.done(); ++i) {
    const auto sel = in.take<std::uint8_t>();
    struct {
      std::uint32_t op;
      std::uint32_t status;
      std::uint8_t token[16];
      std::uint64_t value;
    } m{};
    m.op = in.take<std::uint8_t>();
    std::memset(m.token, in.take<std::uint8_t>(), sizeof m.token);
    m.value = in.take<std::uint64_t>();
    std::vector<sys::UniqueFd> owned;
    for (unsigned k = 0; k < ((sel >> 1) & 3) && k < 2; ++k)
      if (auto e = sys::make_eventfd(true)) owned.push_back(std::move(*e));
    std::vector<int> fds;
    for (auto& f : owned) fds.push_back(f.get());
    const int line = lines[sel & 1];
    send_raw(line, &m, (sel & 8) != 0 ? sel % sizeof m : sizeof m, fds);
    // The daemon serves a line when poll says it is readable.
    for (const int fd : broker.fds())
      if (sys::wait_readable(fd, 0)) broker.serve(fd);
    // The worker reads its answer (and closes any fd it got).
    char buf[64];
    alignas(cmsghdr) unsigned char ctl[CMSG_SPACE(sizeof(int) * 4)];
    iovec iov{buf, sizeof buf};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    if (::recvmsg(line, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        for (std::size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++k) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
          ::close(fd);
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const auto mode = in.take<std::uint8_t>();
  if ((mode & 1) == 0) {
    fuzz_ivshmem(in);
  } else {
    fuzz_broker(in, mode);
  }
  return 0;
}
