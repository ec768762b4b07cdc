// The ivshmem server protocol, both sides: what QEMU's ivshmem-doorbell and a
// process-mode guest will see from ivcudad, and what they must refuse.
#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "ring/ivshmem.h"
#include "ring/sys.h"

namespace iv = ivcuda::ivshmem;
namespace sys = ivcuda::sys;
using namespace std::chrono_literals;
using sys::UniqueFd;

namespace {

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

struct Pair {
  UniqueFd server, client;
};

Pair socket_pair() {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

UniqueFd memfd(std::uint64_t size) {
  auto r = sys::make_memfd("ivshmem-test", size);
  REQUIRE(r.ok());
  return std::move(r).value();
}

UniqueFd eventfd() {
  auto r = sys::make_eventfd(true);
  REQUIRE(r.ok());
  return std::move(r).value();
}

void send(int sock, std::int64_t v, int fd = -1) {
  auto r = iv::send_msg(sock, v, fd);
  INFO((r.ok() ? std::string() : r.error().what));
  REQUIRE(r.ok());
}

// What a broken server might write: any bytes, any number of fds.
void send_raw(int sock, const void* data, std::size_t len, const std::vector<int>& fds) {
  iovec iov{const_cast<void*>(data), len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  std::vector<unsigned char> ctrl(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    mh.msg_control = ctrl.data();
    mh.msg_controllen = ctrl.size();
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  REQUIRE(::sendmsg(sock, &mh, MSG_NOSIGNAL) == static_cast<ssize_t>(len));
}

void le_bytes(std::int64_t v, unsigned char (&b)[8]) {
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i));
}

bool rung(int fd, int timeout_ms) { return sys::wait_readable(fd, timeout_ms) && sys::eventfd_drain(fd); }

std::string temp_socket_path() {
  static std::atomic<int> n{0};
  return "/tmp/ivcuda-ivshmem-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".sock";
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Checks that a client mapping and the server's mapping are the same memory.
void check_same_memory(int client_shm, int server_shm, std::size_t size) {
  auto c = sys::Mapping::map_shared(client_shm, size);
  auto s = sys::Mapping::map_shared(server_shm, size);
  REQUIRE(c.ok());
  REQUIRE(s.ok());
  std::memcpy(c->data() + 100, "from guest", 11);
  CHECK(std::memcmp(s->data() + 100, "from guest", 11) == 0);
  std::memcpy(s->data() + size - 16, "from host", 10);
  CHECK(std::memcmp(c->data() + size - 16, "from host", 10) == 0);
}

// Both directions of every vector: each eventfd rings exactly its own vector.
void check_doorbells(iv::IvshmemClient& client, iv::GuestConnection& g) {
  const std::size_t n = g.host_fds.size();
  REQUIRE(client.peers().at(iv::kHostPeerId).size() == n);
  REQUIRE(client.own_eventfds().size() == n);
  for (std::size_t k = 0; k < n; ++k) {
    REQUIRE(client.notify(iv::kHostPeerId, k).ok());
    for (std::size_t j = 0; j < n; ++j) CHECK(rung(g.host_fds[j].get(), j == k ? 1000 : 0) == (j == k));
    sys::eventfd_signal(g.guest_fds[k].get());
    for (std::size_t j = 0; j < n; ++j)
      CHECK(rung(client.own_eventfds()[j].get(), j == k ? 1000 : 0) == (j == k));
  }
}

}  // namespace

TEST_CASE("messages are little-endian int64 carrying at most one fd", "[ivshmem]") {
  Pair p = socket_pair();
  send(p.server.get(), 0x0102030405060708);
  unsigned char raw[8];
  REQUIRE(::read(p.client.get(), raw, sizeof raw) == 8);
  const unsigned char want[8] = {8, 7, 6, 5, 4, 3, 2, 1};
  CHECK(std::memcmp(raw, want, 8) == 0);

  for (std::int64_t v : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{INT64_MIN},
                         std::int64_t{INT64_MAX}, std::int64_t{65535}}) {
    send(p.server.get(), v);
    auto m = iv::recv_msg(p.client.get(), 1s);
    REQUIRE(m.ok());
    CHECK(m->value == v);
    CHECK_FALSE(m->fd.valid());
  }

  UniqueFd e = eventfd();
  send(p.server.get(), 7, e.get());
  auto m = iv::recv_msg(p.client.get(), 1s);
  REQUIRE(m.ok());
  CHECK(m->value == 7);
  REQUIRE(m->fd.valid());
  CHECK(m->fd.get() != e.get());
  sys::eventfd_signal(m->fd.get());  // the very same eventfd, not a copy
  CHECK(sys::eventfd_drain(e.get()));
  CHECK((::fcntl(m->fd.get(), F_GETFD) & FD_CLOEXEC) != 0);
}

TEST_CASE("a message split across reads is reassembled with its fd", "[ivshmem]") {
  Pair p = socket_pair();
  unsigned char b[8];
  le_bytes(9, b);
  UniqueFd e = eventfd();
  iv::MessageReader reader;
  send_raw(p.server.get(), b, 5, {e.get()});
  auto first = reader.try_read(p.client.get());
  REQUIRE(first.ok());
  CHECK_FALSE(first->has_value());  // incomplete, and nothing blocked
  send_raw(p.server.get(), b + 5, 3, {});
  auto second = reader.try_read(p.client.get());
  REQUIRE(second.ok());
  REQUIRE(second->has_value());
  CHECK((*second)->value == 9);
  CHECK((*second)->fd.valid());
}

TEST_CASE("greeting round trip over a socketpair", "[ivshmem]") {
  Pair p = socket_pair();
  UniqueFd shm = memfd(64 * 1024);
  auto g = iv::send_greeting(std::move(p.server), 5, shm.get(), 2);
  REQUIRE(g.ok());
  CHECK(g->peer_id == 5);
  REQUIRE(g->host_fds.size() == 2);
  REQUIRE(g->guest_fds.size() == 2);

  auto c = iv::ivshmem_client_handshake(std::move(p.client), 2, 1s);
  INFO((c.ok() ? std::string() : c.error().what));
  REQUIRE(c.ok());
  CHECK(c->id() == 5);
  CHECK(c->shm_size() == 64 * 1024);
  CHECK(c->peers().size() == 1);  // the host peer and nobody else
  CHECK(c->peers().count(iv::kHostPeerId) == 1);
  check_doorbells(*c, *g);
  check_same_memory(c->shm_fd(), shm.get(), 64 * 1024);

  CHECK_FALSE(iv::connection_closed(g->conn.get(), 0));
  c = ivcuda::make_error(0, "dropped");  // destroys the client and its socket
  CHECK(iv::connection_closed(g->conn.get(), 1000));
}

TEST_CASE("a client can learn its vector count from the shared memory", "[ivshmem]") {
  UniqueFd shm = memfd(64 * 1024);
  int seen_fd = -1;
  auto learn = [&](int fd) -> ivcuda::Result<std::size_t> {
    seen_fd = fd;
    return std::size_t{3};
  };
  {
    Pair p = socket_pair();
    auto g = iv::send_greeting(std::move(p.server), 4, shm.get(), 3);
    REQUIRE(g.ok());
    auto c = iv::ivshmem_client_handshake(std::move(p.client), 0, 1s, learn);
    INFO((c.ok() ? std::string() : c.error().what));
    REQUIRE(c.ok());
    CHECK(seen_fd == c->shm_fd());
    CHECK(c->own_eventfds().size() == 3);
    check_doorbells(*c, *g);
  }
  SECTION("a count the server does not match is refused") {
    Pair p = socket_pair();
    auto g = iv::send_greeting(std::move(p.server), 4, shm.get(), 5);
    REQUIRE(g.ok());
    CHECK_FALSE(iv::ivshmem_client_handshake(std::move(p.client), 0, 1s, learn).ok());
  }
  SECTION("an impossible count is refused") {
    Pair p = socket_pair();
    auto g = iv::send_greeting(std::move(p.server), 4, shm.get(), 1);
    REQUIRE(g.ok());
    auto zero = [](int) -> ivcuda::Result<std::size_t> { return std::size_t{0}; };
    CHECK_FALSE(iv::ivshmem_client_handshake(std::move(p.client), 0, 1s, zero).ok());
  }
}

TEST_CASE("greeting over a socket path in /tmp, two guests, disconnect", "[ivshmem]") {
  const std::string path = temp_socket_path();
  auto srv = iv::IvshmemServer::listen(path, 3);
  INFO((srv.ok() ? std::string() : srv.error().what));
  REQUIRE(srv.ok());
  constexpr std::size_t kSize = 1 << 20;

  struct Served {
    std::optional<iv::GuestConnection> guest;
    UniqueFd shm;
    std::string error;
  };
  // The server thread learns the peer id first and writes it into that guest's
  // memory before greeting, as the daemon will write its layout.
  auto serve_one = [&srv](Served& out) {
    auto pending = srv->accept(5000);
    if (!pending.ok()) return void(out.error = pending.error().what);
    auto shm = sys::make_memfd("guest", kSize);
    if (!shm.ok()) return void(out.error = shm.error().what);
    {
      auto m = sys::Mapping::map_shared(shm->get(), kSize);
      if (!m.ok()) return void(out.error = m.error().what);
      std::memcpy(m->data(), &pending->peer_id, sizeof pending->peer_id);
    }
    auto g = srv->greet(std::move(pending).value(), shm->get());
    if (!g.ok()) return void(out.error = g.error().what);
    out.guest = std::move(g).value();
    out.shm = std::move(shm).value();
  };

  Served s1, s2;
  std::thread t1(serve_one, std::ref(s1));
  auto c1 = iv::ivshmem_connect(path, 5s, 3);
  t1.join();
  REQUIRE(s1.error.empty());
  INFO((c1.ok() ? std::string() : c1.error().what));
  REQUIRE(c1.ok());

  std::thread t2(serve_one, std::ref(s2));
  auto c2 = iv::ivshmem_connect(path, 5s, 3);
  t2.join();
  REQUIRE(s2.error.empty());
  REQUIRE(c2.ok());

  CHECK(c1->id() == 1);
  CHECK(c2->id() == 2);
  for (auto* c : {&c1.value(), &c2.value()}) {
    CHECK(c->shm_size() == kSize);
    CHECK(c->peers().size() == 1);  // guests never learn about each other
    auto m = sys::Mapping::map_shared(c->shm_fd(), kSize);
    REQUIRE(m.ok());
    std::int64_t id = 0;
    std::memcpy(&id, m->data(), sizeof id);
    CHECK(id == c->id());  // its own memory, prepared before the greeting
  }
  check_doorbells(*c1, *s1.guest);
  check_doorbells(*c2, *s2.guest);
  check_same_memory(c1->shm_fd(), s1.shm.get(), kSize);

  CHECK_FALSE(iv::connection_closed(s1.guest->conn.get(), 0));
  c1 = ivcuda::make_error(0, "dropped");
  CHECK(iv::connection_closed(s1.guest->conn.get(), 1000));
  CHECK_FALSE(iv::connection_closed(s2.guest->conn.get(), 0));  // the other guest is unaffected
}

TEST_CASE("a general client keeps several peers and follows joins and leaves", "[ivshmem]") {
  Pair p = socket_pair();
  const int s = p.server.get();
  UniqueFd shm = memfd(4096);
  std::vector<UniqueFd> fds;
  auto ev = [&fds] { return fds.emplace_back(eventfd()).get(); };
  send(s, 0);
  send(s, 3);
  send(s, -1, shm.get());
  send(s, 0, ev());
  send(s, 0, ev());
  send(s, 5, ev());
  send(s, 5, ev());
  send(s, 3, ev());
  send(s, 3, ev());
  send(s, 9, ev());  // a peer joining right after the greeting

  auto c = iv::ivshmem_client_handshake(std::move(p.client), 2, 1s);
  REQUIRE(c.ok());
  CHECK(c->id() == 3);
  CHECK(c->peers().size() == 3);
  CHECK(c->peers().at(5).size() == 2);
  CHECK(c->peers().at(9).size() == 1);
  CHECK(c->own_eventfds().size() == 2);

  auto none = c->process_pending();
  REQUIRE(none.ok());
  CHECK(none->empty());  // nothing queued, and nothing blocked

  send(s, 9);         // peer 9 leaves
  send(s, 5, ev());   // peer 5 gains a vector
  send(s, 42);        // an unknown peer leaving is harmless
  auto events = c->process_pending();
  REQUIRE(events.ok());
  REQUIRE(events->size() == 3);
  CHECK((*events)[0].id == 9);
  CHECK_FALSE((*events)[0].vector.has_value());
  CHECK((*events)[1].id == 5);
  CHECK((*events)[1].vector == std::optional<std::size_t>(2));
  CHECK(c->peers().count(9) == 0);
  CHECK(c->peers().at(5).size() == 3);

  CHECK(c->notify(5, 2).ok());
  CHECK(sys::eventfd_drain(fds.back().get()));
  CHECK(c->notify(5, 3).error().code == ERANGE);
  CHECK(c->notify(9, 0).error().code == ENOENT);

  send(s, 3);  // the server claims we left
  auto bad = c->process_pending();
  CHECK(bad.error().code == EPROTO);

  Pair q = socket_pair();
  auto g = iv::send_greeting(std::move(q.server), 1, shm.get(), 1);
  REQUIRE(g.ok());
  auto c2 = iv::ivshmem_client_handshake(std::move(q.client), 1, 1s);
  REQUIRE(c2.ok());
  g->conn.reset();
  auto closed = c2->process_pending();
  CHECK(closed.error().code == ECONNRESET);
}

TEST_CASE("malformed greetings are refused and every fd they carried is closed", "[ivshmem]") {
  struct Case {
    const char* name;
    std::size_t vectors;
    int code;
    bool close_after;
    std::function<void(int)> send_bad;
  };
  const auto with_eventfd = [](int s, std::int64_t v) { send(s, v, eventfd().get()); };
  const auto greeting_to_shm = [](int s) {
    send(s, 0);
    send(s, 1);
    send(s, -1, memfd(4096).get());
  };
  unsigned char half[8];
  le_bytes(1, half);

  const std::vector<Case> cases = {
      {"wrong version", 1, EPROTO, false, [](int s) { send(s, 1); }},
      {"version with an fd", 1, EPROTO, false, [&](int s) { with_eventfd(s, 0); }},
      {"own id with an fd", 1, EPROTO, false, [&](int s) { send(s, 0); with_eventfd(s, 1); }},
      {"negative own id", 1, EPROTO, false, [](int s) { send(s, 0); send(s, -5); }},
      {"own id beyond 16 bits", 1, EPROTO, false, [](int s) { send(s, 0); send(s, 70000); }},
      {"shared-memory message without fd", 1, EPROTO, false,
       [](int s) { send(s, 0); send(s, 1); send(s, -1); }},
      {"empty shared memory", 1, EPROTO, false,
       [](int s) { send(s, 0); send(s, 1); send(s, -1, memfd(0).get()); }},
      {"second shared memory", 1, EPROTO, false,
       [&](int s) { greeting_to_shm(s); send(s, -1, memfd(4096).get()); }},
      {"invalid peer id", 1, EPROTO, false, [&](int s) { greeting_to_shm(s); send(s, -7); }},
      {"65 eventfds for one peer", 1, EPROTO, false,
       [&](int s) {
         greeting_to_shm(s);
         for (int i = 0; i < 65; ++i) with_eventfd(s, 0);
       }},
      {"more own eventfds than vectors", 2, EPROTO, false,
       [&](int s) {
         greeting_to_shm(s);
         for (int i = 0; i < 3; ++i) with_eventfd(s, 1);
       }},
      {"two fds on one message", 1, EPROTO, false,
       [&](int s) {
         send(s, 0);
         send(s, 1);
         unsigned char b[8];
         le_bytes(-1, b);
         send_raw(s, b, 8, {memfd(4096).get(), eventfd().get()});
       }},
      {"more fds than one recvmsg takes", 1, EPROTO, false,
       [&](int s) {
         send(s, 0);
         send(s, 1);
         std::vector<UniqueFd> owned;
         std::vector<int> raw;
         for (int i = 0; i < 10; ++i) raw.push_back(owned.emplace_back(eventfd()).get());
         unsigned char b[8];
         le_bytes(-1, b);
         send_raw(s, b, 8, raw);
       }},
      {"truncated message, then close", 1, EPROTO, true,
       [&](int s) { send(s, 0); send_raw(s, half, 4, {}); }},
      {"truncated message, server stays", 1, ETIMEDOUT, false,
       [&](int s) { send(s, 0); send_raw(s, half, 4, {}); }},
      {"server closed mid-greeting", 1, ECONNRESET, true, [](int s) { send(s, 0); send(s, 1); }},
      {"server sends nothing", 1, ETIMEDOUT, false, [](int) {}},
      {"no shared memory ever", 1, ETIMEDOUT, false,
       [&](int s) { send(s, 0); send(s, 1); with_eventfd(s, 1); }},
  };

  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const std::size_t before = open_fds();
      {
        Pair p = socket_pair();
        c.send_bad(p.server.get());
        if (c.close_after) p.server.reset();
        const auto t0 = std::chrono::steady_clock::now();
        auto r = iv::ivshmem_client_handshake(std::move(p.client), c.vectors, 200ms);
        const auto took = std::chrono::steady_clock::now() - t0;
        REQUIRE_FALSE(r.ok());
        INFO(r.error().what);
        CHECK(r.error().code == c.code);
        CHECK(r.error().what.size() > 10);
        if (c.code == ETIMEDOUT) CHECK(took >= 200ms);
        CHECK(took < 2s);
      }
      CHECK(open_fds() == before);
    }
  }
}

TEST_CASE("the server's socket file: stale replaced, live refused, removed on exit", "[ivshmem]") {
  const std::string path = temp_socket_path();
  {
    // A server that died without removing its socket file.
    UniqueFd dead(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::bind(dead.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  }
  REQUIRE(exists(path));
  {
    auto srv = iv::IvshmemServer::listen(path, 1);
    INFO((srv.ok() ? std::string() : srv.error().what));
    REQUIRE(srv.ok());

    auto second = iv::IvshmemServer::listen(path, 1);
    REQUIRE_FALSE(second.ok());
    CHECK(second.error().code == EADDRINUSE);
    CHECK(exists(path));

    // The live server still serves after the refused attempt (whose probe
    // is the connection it accepts first).
    UniqueFd shm = memfd(4096);
    std::optional<iv::GuestConnection> guest;
    std::thread t([&] {
      for (int i = 0; i < 2 && !guest; ++i) {
        auto pg = srv->accept(5000);
        if (!pg.ok()) return;
        auto g = srv->greet(std::move(pg).value(), shm.get());
        if (g.ok()) guest = std::move(g).value();
        // The probe hung up: its greeting may fail with EPIPE, or succeed.
        if (guest && iv::connection_closed(guest->conn.get(), 0)) guest.reset();
      }
    });
    auto c = iv::ivshmem_connect(path, 5s, 1);
    t.join();
    REQUIRE(c.ok());
    REQUIRE(guest.has_value());
    CHECK(c->id() == guest->peer_id);
  }
  CHECK_FALSE(exists(path));  // the destructor removed its socket file

  {
    std::ofstream(path) << "not a socket";
    auto srv = iv::IvshmemServer::listen(path, 1);
    REQUIRE_FALSE(srv.ok());
    CHECK(srv.error().code == EEXIST);
    CHECK(exists(path));
    ::unlink(path.c_str());
  }
}

TEST_CASE("bad arguments and timeouts are refused with clear errors", "[ivshmem]") {
  CHECK(iv::IvshmemServer::listen("/tmp/" + std::string(200, 'x'), 1).error().code == ENAMETOOLONG);
  CHECK(iv::IvshmemServer::listen(temp_socket_path(), 0).error().code == EINVAL);
  CHECK(iv::IvshmemServer::listen(temp_socket_path(), iv::kMaxVectors + 1).error().code == EINVAL);
  CHECK(iv::ivshmem_connect(temp_socket_path(), 100ms, 1).error().code == ENOENT);

  UniqueFd shm = memfd(4096);
  CHECK(iv::send_greeting(socket_pair().server, iv::kHostPeerId, shm.get(), 1).error().code == EINVAL);
  CHECK(iv::send_greeting(socket_pair().server, 1, shm.get(), 0).error().code == EINVAL);
  CHECK(iv::send_greeting(socket_pair().server, 1, -1, 1).error().code == EBADF);

  const std::string path = temp_socket_path();
  auto srv = iv::IvshmemServer::listen(path, 1);
  REQUIRE(srv.ok());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(srv->accept(50).error().code == ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - t0 >= 50ms);

  // A client whose server accepts but never greets.
  auto c = iv::ivshmem_connect(path, 100ms, 1);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().code == ETIMEDOUT);

  // Socket-pair disconnect detection without any greeting at all.
  Pair p = socket_pair();
  CHECK_FALSE(iv::connection_closed(p.server.get(), 0));
  p.client.reset();
  CHECK(iv::connection_closed(p.server.get(), 0));
}
