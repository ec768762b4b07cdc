// Both sides of the shared-memory server protocol that stock QEMU's
// `ivshmem-doorbell` device speaks on its chardev UNIX socket
// (docs/specs/ivshmem-spec.rst in QEMU; /work/shared/reference/ivshmem-notes.md).
//
// Wire format: a stream of messages, each one little-endian signed 64-bit
// value, optionally carrying one fd (SCM_RIGHTS). A new peer receives
//   0 (protocol version, no fd)
//   its own id (no fd)
//   -1 with the shared-memory fd
//   for each other peer: that peer's id N times, each with one eventfd
//   its own id N times, each with one of its own eventfds
// and later `id` + fd when a peer gains a vector, `id` without fd when it
// leaves. Vector k of a peer is the k-th fd received for that id.
//
// ivcudad's use of it (architecture.md, decision 3): every guest connection
// gets its own shared memory and its own 2N eventfds; the daemon is the one
// other peer the guest ever sees, the "host peer" with id 0. Guests never
// learn about each other. Because guests start at id 1, QEMU must run with
// `master=off` (the doorbell device's default): `master=on` demands id 0.
//
// Error codes (Error::code): ECONNRESET when the other side closed the
// connection between messages, ETIMEDOUT when a deadline passed, EPROTO for
// anything the protocol does not allow, otherwise the failing call's errno.
#pragma once

#include <chrono>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ivcuda/result.h"
#include "ring/sys.h"

namespace ivcuda::ivshmem {

inline constexpr std::int64_t kProtocolVersion = 0;
// The value that carries the shared-memory fd.
inline constexpr std::int64_t kShmMessage = -1;
// The doorbell register holds the target id in 16 bits, so no peer id above
// this can ever be rung; QEMU refuses larger ids the same way.
inline constexpr std::int64_t kMaxPeerId = 0xffff;
// Eventfds (= MSI-X vectors) per peer that we accept or hand out. QEMU's own
// ivshmem-client and ivshmem-server use the same bound.
inline constexpr std::size_t kMaxVectors = 64;
// The daemon's id on every guest connection.
inline constexpr std::int64_t kHostPeerId = 0;
// Other peers whose eventfds a client keeps by default. Each peer costs up to
// kMaxVectors descriptors; a server with peers that come and stay must not be
// able to run a client out of them. Eventfds of peers beyond the bound are
// closed on arrival and those peers stay unknown (see ignored_peers()).
inline constexpr std::size_t kMaxPeers = 64;

struct Message {
  std::int64_t value = 0;
  sys::UniqueFd fd;  // invalid when the message carried none
};

// ---------------------------------------------------------------------------
// Message primitives.

// Sends one message, with `fd` attached unless it is -1. Never raises SIGPIPE.
Result<void> send_msg(int sock, std::int64_t value, int fd = -1);

// Reassembles messages from a stream socket that may deliver them in pieces.
// Holds the partial message between calls, so a caller polling a socket can
// read without blocking and resume later. Fds that arrive on a message that
// already has one, in excess of one per recvmsg, or truncated by the kernel
// (MSG_CTRUNC) are closed and reported as EPROTO. Received fds are
// close-on-exec.
class MessageReader {
 public:
  // Reads what is queued without blocking: a message, or nullopt if it is not
  // complete yet.
  Result<std::optional<Message>> try_read(int sock);
  // Blocks until a whole message arrived or `deadline` passed (ETIMEDOUT).
  Result<Message> read(int sock, std::chrono::steady_clock::time_point deadline);

 private:
  unsigned char buf_[8] = {};
  std::size_t have_ = 0;
  sys::UniqueFd fd_;
};

// One message from a socket with no partial state to keep (the greeting):
// a timeout loses whatever part of a message had arrived.
Result<Message> recv_msg(int sock, std::chrono::milliseconds timeout);

// ---------------------------------------------------------------------------
// Client side: QEMU's role. Used by the guest library in process mode, and by
// ivcudad to join an existing ivshmem-server, so it handles any number of peers.

// A change processed after the greeting.
struct PeerEvent {
  std::int64_t id = 0;
  // The new vector's index, or nullopt when the peer left.
  std::optional<std::size_t> vector;
};

// Learns the number of own vectors from the shared memory (see ivshmem_connect).
using VectorsOf = std::function<Result<std::size_t>(int shm_fd)>;

class IvshmemClient {
 public:
  std::int64_t id() const noexcept { return id_; }
  int shm_fd() const noexcept { return shm_.get(); }
  std::uint64_t shm_size() const noexcept { return shm_size_; }
  // Other peers' eventfds, by peer id: writing eventfd k rings their vector k.
  const std::map<std::int64_t, std::vector<sys::UniqueFd>>& peers() const noexcept {
    return peers_;
  }
  // Our own eventfds: vector k of our device rings own_eventfds()[k].
  const std::vector<sys::UniqueFd>& own_eventfds() const noexcept { return own_; }
  // The connection, for callers that poll it next to other fds.
  int socket_fd() const noexcept { return sock_.get(); }
  // Eventfds dropped because the peer bound was reached.
  std::uint64_t ignored_eventfds() const noexcept { return ignored_; }

  // Processes every message already queued without blocking. ECONNRESET when
  // the server went away; any error leaves the connection unusable.
  Result<std::vector<PeerEvent>> process_pending();

  // Rings `vector` of `peer` (ENOENT / ERANGE if it has no such vector).
  Result<void> notify(std::int64_t peer, std::size_t vector) const;

 private:
  friend Result<IvshmemClient> ivshmem_client_handshake(sys::UniqueFd, std::size_t,
                                                        std::chrono::milliseconds, const VectorsOf&,
                                                        std::size_t);
  Result<std::optional<PeerEvent>> apply(Message m);
  bool greeting_complete() const noexcept { return shm_.valid() && own_.size() == vectors_; }

  sys::UniqueFd sock_;
  MessageReader reader_;
  std::size_t vectors_ = 0;
  std::int64_t id_ = -1;
  sys::UniqueFd shm_;
  std::uint64_t shm_size_ = 0;
  std::map<std::int64_t, std::vector<sys::UniqueFd>> peers_;
  std::vector<sys::UniqueFd> own_;
  std::size_t max_peers_ = kMaxPeers;
  std::uint64_t ignored_ = 0;
};

// Connects to the server at `path` and reads the greeting within `timeout`.
// With vectors == 0 the count is learned from the shared memory itself:
// `vectors_of` is called with the shm fd as soon as it arrives (before any
// own eventfd in the protocol's order) and returns the count.
// `vectors` is how many eventfds of our own we expect (QEMU's `vectors`
// property, at most kMaxVectors): the greeting is complete once the shared
// memory and that many own eventfds arrived. More own eventfds than that are
// refused, where QEMU would log and drop them. At most `max_peers` other
// peers are tracked at a time.
Result<IvshmemClient> ivshmem_connect(const std::string& path, std::chrono::milliseconds timeout,
                                      std::size_t vectors, const VectorsOf& vectors_of = {},
                                      std::size_t max_peers = kMaxPeers);
// The same on an already connected socket (a socketpair, an inherited fd).
Result<IvshmemClient> ivshmem_client_handshake(sys::UniqueFd sock, std::size_t vectors,
                                               std::chrono::milliseconds timeout,
                                               const VectorsOf& vectors_of = {},
                                               std::size_t max_peers = kMaxPeers);

// ---------------------------------------------------------------------------
// Server side: the daemon's role.

// One guest connection after its greeting. The caller owns all of it, and
// typically forks a worker for it.
struct GuestConnection {
  sys::UniqueFd conn;
  std::int64_t peer_id = 0;
  // The guest rings the host on these (doorbell `kHostPeerId << 16 | k`).
  std::vector<sys::UniqueFd> host_fds;
  // The host rings the guest's vector k by writing guest_fds[k].
  std::vector<sys::UniqueFd> guest_fds;
};

// A connection accepted but not greeted yet: the caller learns the peer id
// first, so that it can prepare that guest's shared memory before the guest
// (a process-mode client may read it at once) sees it.
struct PendingGuest {
  sys::UniqueFd conn;
  std::int64_t peer_id = 0;
};

// Sends the greeting for a guest with `peer_id` on `conn`, creating its 2N
// eventfds. They are created non-blocking: O_NONBLOCK lives in the open file
// description that both sides share, and QEMU sets it on every eventfd it
// receives anyway, so the host must never rely on blocking reads of them.
//
// `vectors` must not exceed the guest's QEMU `vectors` property: QEMU counts
// the eventfds per peer and answers each one beyond its property with "Too many
// eventfd received, device has N vectors", closing that fd. Since these
// eventfds arrive after the shared memory, QEMU processes them asynchronously
// and only logs that error: the device comes up with fewer vectors than the
// daemon believes it has, and doorbells on the missing ones are lost.
// Fewer eventfds than `vectors` are harmless: QEMU ignores a doorbell write to
// a vector the target peer has no eventfd for.
Result<GuestConnection> send_greeting(sys::UniqueFd conn, std::int64_t peer_id, int shm_fd,
                                      std::size_t vectors);
// The 2N eventfds of a guest connection made ahead of the guest (`conn` and
// `peer_id` left unset), so that a worker can start on them before anybody
// connects (ivcudad's warm workers).
Result<GuestConnection> make_doorbells(std::size_t vectors);
// send_greeting() with eventfds made by make_doorbells().
Result<GuestConnection> send_greeting(sys::UniqueFd conn, std::int64_t peer_id, int shm_fd,
                                      GuestConnection doorbells);

// True once the guest connection is over: EOF, hang-up or error. Bytes from
// the guest count as over too, because the protocol gives a guest nothing to
// send (QEMU never writes on this socket). Waits up to timeout_ms (0 = poll,
// -1 = forever).
bool connection_closed(int conn, int timeout_ms) noexcept;

class IvshmemServer {
 public:
  // Listens on `path`, replacing a stale socket file left by a dead server.
  // Refuses (EADDRINUSE) when a live server answers there, and (EEXIST) when
  // the path is something other than a socket. Checking for a live server
  // connects to it, so that server sees one connection come and go.
  static Result<IvshmemServer> listen(const std::string& path, std::size_t vectors);

  IvshmemServer(IvshmemServer&&) noexcept = default;
  IvshmemServer& operator=(IvshmemServer&&) noexcept;
  IvshmemServer(const IvshmemServer&) = delete;
  IvshmemServer& operator=(const IvshmemServer&) = delete;
  // Removes the socket file if it is still ours.
  ~IvshmemServer();

  int listen_fd() const noexcept { return listen_.get(); }
  std::size_t vectors() const noexcept { return vectors_; }
  const std::string& path() const noexcept { return path_; }

  // Waits up to timeout_ms (-1 = forever) for a connection; ETIMEDOUT if none
  // came. Assigns the next peer id.
  Result<PendingGuest> accept(int timeout_ms);
  // send_greeting() with this server's vectors.
  Result<GuestConnection> greet(PendingGuest guest, int shm_fd) const;
  // The same with eventfds made ahead (make_doorbells() with vectors()).
  Result<GuestConnection> greet(PendingGuest guest, int shm_fd, GuestConnection doorbells) const;

 private:
  IvshmemServer() = default;
  void unlink_if_ours() noexcept;

  sys::UniqueFd listen_;
  std::string path_;
  std::uint64_t dev_ = 0, ino_ = 0;  // identify our socket file
  std::size_t vectors_ = 0;
  std::int64_t next_id_ = kHostPeerId + 1;
};

}  // namespace ivcuda::ivshmem
