// Tenants (docs/security.md, "Tenants and what they share"): a tenant is one
// VM (its connection), or in process mode one user on one socket. Processes of
// one tenant share CUDA IPC handles, pool tokens and exported allocations;
// another user or VM on the same socket gets nothing of them, cannot use up
// their room, and its worker maps none of their driver handles. What a guest
// exported is charged to it while it exists and goes when the guest leaves;
// what a guest imported is charged to the importer.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ivcuda/proto.h"
#include "tests/process/raw_guest.h"
#include "tests/skip.h"

using namespace ivcuda;
using namespace ivcuda::testing;
using proto::Op;

namespace {

constexpr std::uint32_t kFd = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
constexpr std::uint64_t kMiB = 1ull << 20;
constexpr uid_t kNobody = 65534;

// Hello and the primary context on channel c, for guest process `pid`.
std::uint64_t start(RawGuest& g, std::uint32_t c = 0, std::uint32_t pid = 1) {
  std::vector<std::byte> out;
  REQUIRE(g.call(c, Op::kHello, proto::ReqHello{proto::kProtoVersion, pid, 0, 0, {}}) == CUDA_SUCCESS);
  REQUIRE(g.call(c, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  return RawGuest::as<proto::RepHandle>(out).handle;
}

proto::MemProp fd_prop() {
  proto::MemProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.handle_types = kFd;
  p.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
  return p;
}

// A physical allocation of `bytes` (POSIX-fd exportable); 0 when refused.
std::uint64_t create(RawGuest& g, std::uint32_t c, std::uint64_t bytes, CUresult* st = nullptr) {
  std::vector<std::byte> out;
  const CUresult r = g.call(c, Op::kMemCreate, proto::ReqMemCreate{fd_prop(), bytes, 0}, &out);
  if (st != nullptr) *st = r;
  return r == CUDA_SUCCESS ? RawGuest::as<proto::RepHandle>(out).handle : 0;
}

CUresult export_fd(RawGuest& g, std::uint32_t c, std::uint64_t handle, proto::RepShareToken* token) {
  std::vector<std::byte> out;
  const CUresult r = g.call(c, Op::kMemExportShareable, proto::ReqMemExport{handle, kFd, 0, 0}, &out);
  if (r == CUDA_SUCCESS) *token = RawGuest::as<proto::RepShareToken>(out);
  return r;
}

CUresult import_fd(RawGuest& g, std::uint32_t c, const proto::RepShareToken& token, std::uint64_t* handle = nullptr) {
  proto::ReqMemImport imp{};
  std::memcpy(imp.token, token.token, sizeof imp.token);
  imp.handle_type = kFd;
  std::vector<std::byte> out;
  const CUresult r = g.call(c, Op::kMemImportShareable, imp, &out);
  if (r == CUDA_SUCCESS && handle != nullptr) *handle = RawGuest::as<proto::RepHandle>(out).handle;
  return r;
}

std::uint64_t quota_free(RawGuest& g, std::uint32_t c, std::uint64_t ctx) {
  std::vector<std::byte> out;
  REQUIRE(g.call(c, Op::kMemGetInfo, proto::ReqCtx{ctx}, &out) == CUDA_SUCCESS);
  return RawGuest::as<proto::RepMemInfo>(out).free;
}

// cuIpcGetMemHandle of a fresh 64 KiB allocation.
CUresult ipc_mem(RawGuest& g, std::uint32_t c, std::uint64_t ctx, std::uint32_t proc, std::vector<std::byte>* h) {
  std::vector<std::byte> out;
  if (CUresult r = g.call(c, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 1 << 16, 0, 0, 0, 0}, &out); r != CUDA_SUCCESS)
    return r;
  const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  const CUresult r = g.call(c, Op::kIpcGetMemHandle, proto::ReqIpcGet{ctx, dptr, proc, 0}, h);
  return r;
}

// cuIpcGetEventHandle of a fresh interprocess event.
CUresult ipc_event(RawGuest& g, std::uint32_t c, std::uint64_t ctx, std::uint32_t proc,
                   std::vector<std::byte>* h = nullptr) {
  std::vector<std::byte> out;
  CUresult r = g.call(c, Op::kEventCreate,
                      proto::ReqEventCreate{ctx, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, 0}, &out);
  if (r != CUDA_SUCCESS) return r;
  const auto ev = RawGuest::as<proto::RepHandle>(out).handle;
  return g.call(c, Op::kIpcGetEventHandle, proto::ReqIpcGet{ctx, ev, proc, 0}, h != nullptr ? h : &out);
}

proto::ReqIpcOpen ipc_open(std::uint64_t ctx, std::uint32_t proc, const std::vector<std::byte>& handle) {
  proto::ReqIpcOpen r{};
  r.ctx = ctx;
  r.flags = CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
  r.proc = proc;
  std::memcpy(r.handle, handle.data(), std::min(handle.size(), sizeof r.handle));
  return r;
}

// Exports IPC events until one is refused: how many succeeded, and the refusal.
std::pair<int, CUresult> fill(RawGuest& g, std::uint64_t ctx, int at_most) {
  for (int n = 0; n < at_most; ++n)
    if (CUresult r = ipc_event(g, 0, ctx, 1); r != CUDA_SUCCESS) return {n, r};
  return {at_most, CUDA_SUCCESS};
}

// ------------------------------------------------------------ host processes

// p and everything under it.
std::vector<pid_t> tree(pid_t p) {
  std::vector<pid_t> out{p};
  for (std::size_t i = 0; i < out.size(); ++i)
    for (pid_t c : Daemon::children_of(out[i])) out.push_back(c);
  return out;
}

struct SharedMap {
  std::uint64_t lo = 0, hi = 0;
  std::uint64_t ino = 0;
  std::string path;
};

// p's shared mappings, but for the GPU's device files (the real driver maps
// those in every worker).
std::vector<SharedMap> shared_maps(pid_t p) {
  std::vector<SharedMap> out;
  std::ifstream f("/proc/" + std::to_string(p) + "/maps");
  for (std::string line; std::getline(f, line);) {
    std::istringstream s(line);
    std::string range, perms, offset, dev;
    SharedMap m;
    s >> range >> perms >> offset >> dev >> m.ino;
    std::getline(s >> std::ws, m.path);
    if (perms.size() < 4 || perms[3] != 's' || m.path.rfind("/dev/nvidia", 0) == 0) continue;
    m.lo = std::stoull(range.substr(0, range.find('-')), nullptr, 16);
    m.hi = std::stoull(range.substr(range.find('-') + 1), nullptr, 16);
    out.push_back(m);
  }
  return out;
}

// The daemon's processes that serve the guest whose memory file is `shm_ino`
// (its connection process and its worker map it).
std::vector<pid_t> serving(const Daemon& d, std::uint64_t shm_ino) {
  std::vector<pid_t> out;
  for (pid_t p : tree(d.pid)) {
    if (p == d.pid) continue;
    for (const auto& m : shared_maps(p))
      if (m.ino == shm_ino) {
        out.push_back(p);
        break;
      }
  }
  return out;
}

std::uint64_t inode_of(int fd) {
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  return st.st_ino;
}

// Raw driver IPC handles of processes `exporters` (the GPU test double's:
// magic "DIPM" and the exporter's pid, tests/gpu_double/api_ipc.cc) found in
// memory that processes `readers` map shared, their guests' own memory aside.
int raw_handles_in_shared_memory(const std::vector<pid_t>& readers, const std::vector<pid_t>& exporters) {
  int found = 0;
  for (pid_t r : readers) {
    sys::UniqueFd mem(::open(("/proc/" + std::to_string(r) + "/mem").c_str(), O_RDONLY | O_CLOEXEC));
    if (!mem.valid()) continue;
    for (const auto& m : shared_maps(r)) {
      if (m.path.find("ivcuda-guest") != std::string::npos || m.hi - m.lo > (64ull << 20)) continue;
      std::vector<unsigned char> bytes(m.hi - m.lo);
      if (::pread(mem.get(), bytes.data(), bytes.size(), static_cast<off_t>(m.lo)) != static_cast<ssize_t>(bytes.size()))
        continue;
      for (pid_t e : exporters) {
        unsigned char pattern[8];
        const std::uint32_t magic = 0x4d504944u;
        const std::int32_t pid = e;
        std::memcpy(pattern, &magic, 4);
        std::memcpy(pattern + 4, &pid, 4);
        for (std::size_t i = 0; i + sizeof pattern <= bytes.size(); i += 4)
          if (std::memcmp(bytes.data() + i, pattern, sizeof pattern) == 0) ++found;
      }
    }
  }
  return found;
}

// Shared mappings (the same file or shared anonymous memory) that a process
// of `a` and a process of `b` both have.
int memory_in_common(const std::vector<pid_t>& a, const std::vector<pid_t>& b) {
  std::set<std::pair<std::uint64_t, std::string>> of_a;
  for (pid_t p : a)
    for (const auto& m : shared_maps(p)) of_a.insert({m.ino, m.path});
  int n = 0;
  for (pid_t p : b)
    for (const auto& m : shared_maps(p)) n += of_a.count({m.ino, m.path}) != 0 ? 1 : 0;
  return n;
}

// Descriptors of process p whose target contains `name`.
int fds_named(pid_t p, const char* name) {
  int n = 0;
  for (int fd = 0; fd < 65536; ++fd) {
    char target[256];
    const std::string link = "/proc/" + std::to_string(p) + "/fd/" + std::to_string(fd);
    const ssize_t len = ::readlink(link.c_str(), target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = '\0';
    if (std::strstr(target, name) != nullptr) ++n;
  }
  return n;
}

// Waits up to `ms` for cond().
bool eventually(const std::function<bool()>& cond, int ms = 5000) {
  for (int i = 0; i < ms / 10; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

// A guest of another local user: a child process that becomes `nobody`
// before it connects (so that the daemon's SO_PEERCRED names nobody), runs
// `body` and sends back the numbers it returns. The child lives on until this
// object goes, so that a guest it keeps connected can be inspected meanwhile.
class Stranger {
 public:
  explicit Stranger(const std::function<std::vector<std::int64_t>()>& body) {
    int up[2], down[2];
    REQUIRE(::pipe2(up, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(down, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(up[0]);
      ::close(down[1]);
      std::vector<std::int64_t> r;
      if (::setgid(kNobody) == 0 && ::setuid(kNobody) == 0) {
        try {
          r = body();
        } catch (...) {  // a REQUIRE that failed in the child: the parent sees no answer
          r.clear();
        }
      }
      const auto n = static_cast<std::int64_t>(r.size());
      (void)!::write(up[1], &n, sizeof n);
      if (n > 0) (void)!::write(up[1], r.data(), r.size() * sizeof r[0]);
      char c;
      (void)!::read(down[0], &c, 1);  // until the parent is done looking
      ::_exit(0);
    }
    ::close(up[1]);
    ::close(down[0]);
    release_ = sys::UniqueFd(down[1]);
    sys::UniqueFd from(up[0]);
    pollfd p{from.get(), POLLIN, 0};
    std::int64_t n = 0;
    if (::poll(&p, 1, 60000) == 1 && ::read(from.get(), &n, sizeof n) == sizeof n && n > 0 && n < 1024) {
      results.resize(static_cast<std::size_t>(n));
      const auto want = static_cast<ssize_t>(results.size() * sizeof results[0]);
      if (::read(from.get(), results.data(), static_cast<std::size_t>(want)) != want) results.clear();
    }
  }
  ~Stranger() {
    release_.reset();
    ::waitpid(pid_, nullptr, 0);
  }
  Stranger(const Stranger&) = delete;
  Stranger& operator=(const Stranger&) = delete;
  std::vector<std::int64_t> results;

 private:
  pid_t pid_ = -1;
  sys::UniqueFd release_;
};

}  // namespace

TEST_CASE("two users on one socket are two tenants: nothing one exports opens for the other, neither fills the "
          "other's registry, and neither's worker maps the other's driver handles",
          "[process][hostile]") {
  if (::geteuid() != 0) IVCUDA_SKIP("needs root, to run a guest as user nobody");
  // A warm worker takes each guest: its line gets its tenant at hand-off, when the user is known.
  Daemon d({"--socket-mode", "0666", "--share-slots", "64", "--warm-workers", "1"}, "-users");
  REQUIRE(d.alive());
  RawGuest a(d.sock);
  a.open(0);
  const std::uint64_t ctx = start(a);
  std::vector<std::byte> mem, event;
  REQUIRE(ipc_mem(a, 0, ctx, 1, &mem) == CUDA_SUCCESS);
  REQUIRE(ipc_event(a, 0, ctx, 1, &event) == CUDA_SUCCESS);
  const std::uint64_t phys = create(a, 0, 2 * kMiB);
  REQUIRE(phys != 0);
  proto::RepShareToken token{};
  REQUIRE(export_fd(a, 0, phys, &token) == CUDA_SUCCESS);

  // Another process of the same user shares (torch.multiprocessing).
  {
    RawGuest a2(d.sock);
    a2.open(0);
    const std::uint64_t ctx2 = start(a2);
    CHECK(a2.call(0, Op::kIpcOpenMemHandle, ipc_open(ctx2, 1, mem)) == CUDA_SUCCESS);
    CHECK(a2.call(0, Op::kIpcOpenEventHandle, ipc_open(ctx2, 1, event)) == CUDA_SUCCESS);
    CHECK(import_fd(a2, 0, token) == CUDA_SUCCESS);
  }
  // The user fills its registry.
  const auto [exported, refusal] = fill(a, ctx, 200);
  CHECK(exported == 62);
  CHECK(refusal == CUDA_ERROR_OUT_OF_MEMORY);

  const std::string sock = d.sock;
  Stranger b([&] {
    static std::unique_ptr<RawGuest> keep;  // connected until the child ends
    keep = std::make_unique<RawGuest>(sock);
    RawGuest& g = *keep;
    g.open(0);
    const std::uint64_t bctx = start(g);
    std::vector<std::int64_t> r;
    r.push_back(static_cast<std::int64_t>(inode_of(g.client.shm_fd())));
    r.push_back(g.call(0, Op::kIpcOpenMemHandle, ipc_open(bctx, 1, mem)));
    r.push_back(g.call(0, Op::kIpcOpenEventHandle, ipc_open(bctx, 1, event)));
    r.push_back(import_fd(g, 0, token));
    r.push_back(ipc_event(g, 0, bctx, 1));
    std::vector<std::byte> own;
    r.push_back(ipc_mem(g, 0, bctx, 1, &own));
    return r;
  });
  REQUIRE(b.results.size() == 6);
  CHECK(b.results[1] == CUDA_ERROR_INVALID_HANDLE);
  CHECK(b.results[2] == CUDA_ERROR_INVALID_HANDLE);
  CHECK(b.results[3] == CUDA_ERROR_UNKNOWN);
  CHECK(b.results[4] == CUDA_SUCCESS);  // the other user's full registry is not this one's
  CHECK(b.results[5] == CUDA_SUCCESS);

  const auto of_a = serving(d, inode_of(a.client.shm_fd()));
  const auto of_b = serving(d, static_cast<std::uint64_t>(b.results[0]));
  REQUIRE_FALSE(of_a.empty());
  REQUIRE_FALSE(of_b.empty());
  // Not a byte of the first user's driver handles in memory the other's worker maps,
  // and no memory the two users' workers have in common.
  CHECK(raw_handles_in_shared_memory(of_b, of_a) == 0);
  CHECK(memory_in_common(of_a, of_b) == 0);
  CHECK(d.alive());
}

TEST_CASE("an exported allocation stays charged to its exporter, and goes with it: a later guest finds none of "
          "its tokens and the daemon holds none of its memory",
          "[process][hostile]") {
  // A warm worker is always there: the socket never runs out of workers.
  Daemon d({"--mem-limit", "64M", "--context-reserve", "0", "--warm-workers", "1"}, "-gone");
  REQUIRE(d.alive());
  std::vector<proto::RepShareToken> tokens;
  {
    RawGuest a(d.sock);
    a.open(0);
    const std::uint64_t ctx = start(a);
    for (int i = 0; i < 2; ++i) {
      const std::uint64_t h = create(a, 0, 32 * kMiB);
      REQUIRE(h != 0);
      proto::RepShareToken t{};
      REQUIRE(export_fd(a, 0, h, &t) == CUDA_SUCCESS);
      tokens.push_back(t);
      REQUIRE(a.call(0, Op::kMemRelease, proto::ReqHandle{ctx, h}) == CUDA_SUCCESS);
    }
    // Released, but an exported fd is a reference: both still count.
    CHECK(quota_free(a, 0, ctx) == 0);
    CUresult st = CUDA_SUCCESS;
    CHECK(create(a, 0, 32 * kMiB, &st) == 0);
    CHECK(st == CUDA_ERROR_OUT_OF_MEMORY);
  }
  // The guest left: its exports go with it, also from the daemon.
  CHECK(eventually([&] { return fds_named(d.pid, "ivcuda-gpu-double-vmm") == 0; }, 3000));
  RawGuest later(d.sock);
  later.open(0);
  (void)start(later);
  for (const auto& t : tokens) CHECK(import_fd(later, 0, t) == CUDA_ERROR_UNKNOWN);
  CHECK(d.alive());
}

TEST_CASE("memory one guest imported from another counts against the importer, also after the exporter left",
          "[process][hostile]") {
  Daemon d({"--mem-limit", "64M", "--context-reserve", "0"}, "-import");
  REQUIRE(d.alive());
  RawGuest b(d.sock);
  b.open(0);
  const std::uint64_t bctx = start(b);
  std::vector<std::byte> out;
  {
    RawGuest a(d.sock);
    a.open(0);
    const std::uint64_t actx = start(a);
    // Three ways to share memory: an fd-exported allocation (32 MiB), an IPC handle (16 MiB),
    // a pool pointer (8 MiB).
    const std::uint64_t h = create(a, 0, 32 * kMiB);
    REQUIRE(h != 0);
    proto::RepShareToken token{};
    REQUIRE(export_fd(a, 0, h, &token) == CUDA_SUCCESS);
    REQUIRE(a.call(0, Op::kMemAlloc, proto::ReqMemAlloc{actx, 16 * kMiB, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
    const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
    std::vector<std::byte> mem;
    REQUIRE(a.call(0, Op::kIpcGetMemHandle, proto::ReqIpcGet{actx, dptr, 1, 0}, &mem) == CUDA_SUCCESS);
    proto::ReqMemPoolCreate pc{};
    pc.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
    pc.handle_types = kFd;
    pc.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
    REQUIRE(a.call(0, Op::kMemPoolCreate, pc, &out) == CUDA_SUCCESS);
    const auto pool = RawGuest::as<proto::RepHandle>(out).handle;
    REQUIRE(a.call(0, Op::kMemAllocAsync, proto::ReqMemAllocAsync{actx, 0, pool, 8 * kMiB}, &out) == CUDA_SUCCESS);
    const auto pptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
    REQUIRE(a.call(0, Op::kMemPoolExport, proto::ReqPoolExport{pool, 0, kFd, 1}, &out) == CUDA_SUCCESS);
    const auto pool_token = RawGuest::as<proto::RepShareToken>(out);
    std::vector<std::byte> ptr_ticket;
    REQUIRE(a.call(0, Op::kMemPoolExportPtr, proto::ReqPoolPtr{actx, pptr, 1, 0}, &ptr_ticket) == CUDA_SUCCESS);

    const std::uint64_t own = create(b, 0, 16 * kMiB);
    REQUIRE(own != 0);
    REQUIRE(b.call(0, Op::kIpcOpenMemHandle, ipc_open(bctx, 1, mem)) == CUDA_SUCCESS);
    CHECK(quota_free(b, 0, bctx) == 32 * kMiB);  // 16 MiB its own, 16 MiB opened
    proto::ReqPoolImport pi{};
    std::memcpy(pi.token, pool_token.token, sizeof pi.token);
    pi.handle_type = kFd;
    pi.proc = 1;
    REQUIRE(b.call(0, Op::kMemPoolImport, pi, &out) == CUDA_SUCCESS);
    proto::ReqPoolPtrImport pp{};
    pp.ctx = bctx;
    pp.pool = RawGuest::as<proto::RepHandle>(out).handle;
    pp.proc = 1;
    std::memcpy(pp.data, ptr_ticket.data(), std::min(ptr_ticket.size(), sizeof pp.data));
    REQUIRE(b.call(0, Op::kMemPoolImportPtr, pp) == CUDA_SUCCESS);
    CHECK(quota_free(b, 0, bctx) == 24 * kMiB);  // and 8 MiB imported from the pool
    CHECK(import_fd(b, 0, token) == CUDA_ERROR_OUT_OF_MEMORY);  // 32 MiB more do not fit
    REQUIRE(b.call(0, Op::kMemRelease, proto::ReqHandle{bctx, own}) == CUDA_SUCCESS);
    std::uint64_t imported = 0;
    REQUIRE(import_fd(b, 0, token, &imported) == CUDA_SUCCESS);
    CHECK(imported != 0);
    CHECK(quota_free(b, 0, bctx) == 8 * kMiB);
  }
  // The exporter is gone; the importer still holds the memory, and still pays for it.
  CHECK(eventually([&] { return d.workers().size() == 1; }));
  CHECK(quota_free(b, 0, bctx) == 8 * kMiB);
  CHECK(d.alive());
}

TEST_CASE("one guest cannot use up its tenant's registry, nor a tenant the daemon's", "[process][hostile]") {
  Daemon d({"--share-slots", "12", "--share-slots-per-guest", "5"}, "-caps");
  REQUIRE(d.alive());
  RawGuest a1(d.sock), a2(d.sock), a3(d.sock);
  for (RawGuest* g : {&a1, &a2, &a3}) g->open(0);
  const auto f1 = fill(a1, start(a1), 20);
  const auto f2 = fill(a2, start(a2), 20);
  const auto f3 = fill(a3, start(a3), 20);
  CHECK(f1.first == 5);  // the guest's own cap
  CHECK(f1.second == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(f2.first == 5);  // its sibling still has room
  CHECK(f3.first == 2);  // the tenant's cap
  CHECK(f3.second == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(d.alive());
}

TEST_CASE("two VMs of one user on one socket are two tenants, a VM is none of its user's process-mode guests, "
          "and a VM's processes share",
          "[process][hostile]") {
  Daemon d({"--vm-spare-workers", "0"}, "-vms");
  REQUIRE(d.alive());
  const std::uint32_t p1 = static_cast<std::uint32_t>(::getpid()) + 100000, p2 = p1 + 1, p3 = p1 + 2;
  RawGuest vm(d.sock), other_vm(d.sock), process(d.sock);
  vm.open(0, static_cast<pid_t>(p1));
  vm.open(1, static_cast<pid_t>(p2));
  other_vm.open(0, static_cast<pid_t>(p3));
  process.open(0);
  const std::uint64_t c1 = start(vm, 0, p1), c2 = start(vm, 1, p2), c3 = start(other_vm, 0, p3);
  const std::uint64_t cp = start(process);
  std::vector<std::byte> mem, from_process;
  REQUIRE(ipc_mem(vm, 0, c1, p1, &mem) == CUDA_SUCCESS);
  const std::uint64_t h = create(vm, 0, 2 * kMiB);
  REQUIRE(h != 0);
  proto::RepShareToken token{};
  REQUIRE(export_fd(vm, 0, h, &token) == CUDA_SUCCESS);
  REQUIRE(ipc_mem(process, 0, cp, 1, &from_process) == CUDA_SUCCESS);

  // Another process of the VM (another worker): the same tenant.
  CHECK(vm.call(1, Op::kIpcOpenMemHandle, ipc_open(c2, p2, mem)) == CUDA_SUCCESS);
  CHECK(import_fd(vm, 1, token) == CUDA_SUCCESS);
  // Another VM of the same user, and a process-mode guest of that user: others.
  CHECK(other_vm.call(0, Op::kIpcOpenMemHandle, ipc_open(c3, p3, mem)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(import_fd(other_vm, 0, token) == CUDA_ERROR_UNKNOWN);
  CHECK(process.call(0, Op::kIpcOpenMemHandle, ipc_open(cp, 1, mem)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(import_fd(process, 0, token) == CUDA_ERROR_UNKNOWN);
  CHECK(vm.call(1, Op::kIpcOpenMemHandle, ipc_open(c2, p2, from_process)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(d.alive());
}
