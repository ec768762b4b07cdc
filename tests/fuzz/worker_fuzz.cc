// libFuzzer harness: the worker's request decoding and dispatch, in process,
// against the GPU test double. The fuzzer plays a hostile guest: it writes
// arbitrary records into the request rings of several channels, arbitrary
// bytes into the arena, and scribbles on ring indices and channel
// descriptors; the worker must answer or refuse each without undefined
// behaviour (ASan/UBSan) and without waiting.
//
// Input: a sequence of chunks, each starting with a tag byte (low two bits):
//   0 record  [tag][channel u8][op u16][len u16][payload]   tag 0x04: wants a
//             reply, 0x08: serve right after it, 0x10: seq u32 follows the
//             len instead of the next ticket
//   1 arena   [tag][offset u32][len u16][bytes]             into the arena
//   2 poke    [tag][channel u8][field u8][value u32]        a guest-writable
//             ring index, sleep flag or descriptor field
//   3 serve   [tag]                                         serve_once + read replies
// Integers are little-endian; a chunk cut short by the end of the input is
// taken as far as it goes. Handles and addresses are only known once the
// worker handed them out, so an 8-byte aligned payload word 0xF0CC00NN'xxxxxxxx
// is replaced by the NN-th newest (0: the newest; modulo their count) of the
// nonzero words the replies so far carried (the first four of each reply
// payload), plus xxxxxxxx: a seed can name "the pointer the MemAlloc above
// returned, + 64". A word 0xF0CC01'OO'wa'aaaaaa names a reply by its op
// instead, which keeps naming the same object when the fuzzer inserts or
// drops records before it: OO the op (its low byte), w (3 bits) which of the
// first eight payload words of that op's successful replies, a (5 bits) the
// age (0: the newest; modulo their count), plus the 24-bit addend aaaaaa.
// tests/fuzz/make_seeds.py writes such seeds, one or more per op.
//
// An input whose first byte is 0x83 (a serve chunk with its top bit set) gets
// a worker that maps the BAR at a random address, as ivcudad's workers do
// (WorkerConfig::random_bar_address; off for the others: see kMaxRandomBars).
//
// A fresh worker serves every input (Worker::create per input, on freshly
// formatted shared memory), so inputs replay deterministically: handles are
// numbered the same way each time. Only the double's own state outlives a
// worker, as a driver's would outlive a process that leaked (objects not
// tied to a context, such as VMM allocations). The shared memory is small
// (1 MiB, 4 channels of 16 KiB rings) to keep clearing it cheap. After each
// input the double's device memory must be free again: what a worker leaves
// behind when it ends (virtual memory, pools) it must give back itself.
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/tenant_share.h"
#include "host-daemon/worker/worker.h"
#include "host-daemon/worker/worker_internal.h"
#include "ring/layout.h"
#include "ring/spsc_ring.h"
#include "ring/sys.h"
#include "tests/fuzz/fuzz_input.h"

using namespace ivcuda;

namespace {

constexpr std::uint32_t kChannels = 4;
constexpr std::uint64_t kShmBytes = 1u << 20;
constexpr std::uint32_t kRingBytes = 16 * 1024;
constexpr std::uint64_t kStagingBytes = 64 * 1024;
constexpr std::uint64_t kSubstTag = 0xF0CC00;  // bits 63..40 of a word to replace
constexpr std::uint64_t kReplyTag = 0xF0CC01;  // the same, naming a reply by its op
constexpr std::uint8_t kRandomBarByte = 0x83;
// Under ASan each new BAR address grows the page tables of the shadow memory
// for good (about 2 KB each, measured: docs/security.md, "Fuzzing"). A process
// maps at most this many BARs at random addresses (some 32 MB of page tables);
// past it such inputs get the fixed address too, which bounds the growth in a
// run of any length.
constexpr unsigned kMaxRandomBars = 16384;
// Bounds on the work one input can ask for.
constexpr int kMaxServes = 64;
static_assert(static_cast<unsigned>(proto::Op::kCount) <= 256, "kReplyTag names an op in 8 bits");

struct Env {
  sys::UniqueFd shm;
  sys::Mapping bar;  // the guest's view
  ring::Layout l;
  sys::UniqueFd host_efd, guest_efd;
  std::string driver;
  std::string nvml;  // the NVML test double (NVML queries)
  unsigned random_bars = 0;
  // Per op over the whole run: replies seen, and those that said CUDA_SUCCESS
  // (IVCUDA_FUZZ_OPSTATS=1 prints them at exit; tests/fuzz/coverage.py reads them).
  std::uint64_t replies[256] = {};
  std::uint64_t successes[256] = {};
};

void print_op_stats();

Env& env() {
  static Env* e = [] {
    auto* n = new Env;
    // The double gives up on waits at once and stays quiet; two devices so
    // that peer and device-ordinal paths are reachable.
    ::setenv("IVCUDA_GPU_DOUBLE_FUZZ", "1", 1);
    ::setenv("IVCUDA_GPU_DOUBLE_DEVICES", "2", 1);
    // The worker's log would print a line for most hostile inputs: nothing at all.
    log::set_level(static_cast<log::Level>(-1));
    // A host node of a graph waits for the guest to run its function; no
    // guest runs it here. A worker sets this when it ends, so every input but
    // the first would see it set anyway: set it before the first.
    host::abandon_host_nodes();
    const char* drv = std::getenv("IVCUDA_FUZZ_DOUBLE");  // the long run carries the .so elsewhere
    n->driver = drv != nullptr && *drv != '\0' ? drv : IVCUDA_GPU_DOUBLE_PATH;
    const char* nvml = std::getenv("IVCUDA_FUZZ_NVML_DOUBLE");
    n->nvml = nvml != nullptr && *nvml != '\0' ? nvml : IVCUDA_NVML_DOUBLE_PATH;
    // Without the NVML double every Nvml request would answer
    // LIBRARY_NOT_FOUND before the per-function code: not fuzzing it at all.
    for (const std::string* lib : {&n->driver, &n->nvml})
      if (::access(lib->c_str(), R_OK) != 0) {
        std::fprintf(stderr, "worker_fuzz: %s: %s (IVCUDA_FUZZ_DOUBLE, IVCUDA_FUZZ_NVML_DOUBLE name them)\n",
                     lib->c_str(), std::strerror(errno));
        std::abort();
      }
    if (std::getenv("IVCUDA_FUZZ_OPSTATS") != nullptr) std::atexit(print_op_stats);
    ring::LayoutParams p;
    p.shm_size = kShmBytes;
    p.channels = kChannels;
    p.ring_bytes = kRingBytes;
    p.staging_bytes = kStagingBytes;
    auto l = ring::plan_layout(p);
    auto fd = sys::make_memfd("ivcuda-fuzz", kShmBytes);
    auto h = sys::make_eventfd(true);
    auto g = sys::make_eventfd(true);
    if (!l || !fd || !h || !g) {
      std::fprintf(stderr, "worker_fuzz: cannot set up the shared memory\n");
      std::abort();
    }
    n->l = *l;
    n->shm = std::move(*fd);
    n->host_efd = std::move(*h);
    n->guest_efd = std::move(*g);
    auto m = sys::Mapping::map_shared(n->shm.get(), kShmBytes);
    if (!m) std::abort();
    n->bar = std::move(*m);
    return n;
  }();
  return *e;
}

void print_op_stats() {
  const Env& e = env();
  unsigned answered = 0, ok = 0;
  for (unsigned op = 1; op < static_cast<unsigned>(proto::Op::kCount); ++op) {
    answered += e.replies[op] != 0 ? 1 : 0;
    ok += e.successes[op] != 0 ? 1 : 0;
    std::fprintf(stderr, "OPSTAT: %s replies %llu success %llu\n", proto::op_name(static_cast<std::uint16_t>(op)),
                 static_cast<unsigned long long>(e.replies[op]), static_cast<unsigned long long>(e.successes[op]));
  }
  std::fprintf(stderr, "OPSTAT: %u of %u ops answered, %u with CUDA_SUCCESS\n", answered,
               static_cast<unsigned>(proto::Op::kCount) - 1, ok);
}

// Aborts (a finding) when the ended worker left device memory allocated in
// the double. A device whose kernel faulted answers nothing: not checked.
void check_nothing_left(const Env& e) {
  struct Api {
    decltype(&cuDevicePrimaryCtxRetain) retain;
    decltype(&cuDevicePrimaryCtxRelease_v2) release;
    decltype(&cuCtxSetCurrent) set_current;
    decltype(&cuMemGetInfo_v2) info;
  };
  static const Api api = [&] {
    void* lib = ::dlopen(e.driver.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) std::abort();
    Api a{};
    a.retain = reinterpret_cast<decltype(a.retain)>(::dlsym(lib, "cuDevicePrimaryCtxRetain"));
    a.release = reinterpret_cast<decltype(a.release)>(::dlsym(lib, "cuDevicePrimaryCtxRelease_v2"));
    a.set_current = reinterpret_cast<decltype(a.set_current)>(::dlsym(lib, "cuCtxSetCurrent"));
    a.info = reinterpret_cast<decltype(a.info)>(::dlsym(lib, "cuMemGetInfo_v2"));
    if (a.retain == nullptr || a.release == nullptr || a.set_current == nullptr || a.info == nullptr) std::abort();
    return a;
  }();
  for (CUdevice d = 0; d < 2; ++d) {
    CUcontext c = nullptr;
    if (api.retain(&c, d) != CUDA_SUCCESS) continue;
    std::size_t free = 0, total = 0;
    const bool known = api.set_current(c) == CUDA_SUCCESS && api.info(&free, &total) == CUDA_SUCCESS;
    (void)api.set_current(nullptr);
    (void)api.release(d);
    if (known && free != total) {
      std::fprintf(stderr, "worker_fuzz: the worker left %zu bytes of device %d allocated\n", total - free, d);
      std::abort();
    }
  }
}

using fuzz::Input;

// The guest's ends of one channel.
struct GuestChannel {
  bool open = false;
  ring::Producer req;
  ring::Consumer cpl;
  bool awaiting = false;
  std::uint32_t awaited_seq = 0;
};

struct Session {
  Session(Env& environment, host::Worker& worker) : e(environment), w(worker) {}
  Env& e;
  host::Worker& w;
  GuestChannel ch[kChannels];
  std::uint32_t ticket = 1;
  std::vector<std::uint64_t> vals;  // words the replies carried
  struct Reply {
    std::uint16_t op;
    std::uint64_t w[8];  // the payload's first 64 bytes, zero-padded
  };
  std::vector<Reply> replies;  // the successful ones, oldest first
  int serves = 0;

  GuestChannel& open(std::uint32_t c) {
    GuestChannel& g = ch[c];
    if (!g.open) {
      g.req = ring::Producer(ring::request_ring(e.bar.data(), e.l, c), nullptr);
      g.cpl = ring::Consumer(ring::completion_ring(e.bar.data(), e.l, c));
      auto* sb = ring::superblock(e.bar.data());
      std::atomic_ref<std::uint64_t>(sb->active_mask[0]).fetch_or(1ull << c, std::memory_order_release);
      g.open = true;
    }
    return g;
  }

  void drain() {
    for (GuestChannel& g : ch) {
      if (!g.open) continue;
      ring::Record rec;
      while (g.cpl.poll(&rec) == ring::RingStatus::kOk) {
        // IVCUDA_FUZZ_TRACE=1: each reply's op, status and first payload words, for writing seeds.
        static const bool trace = std::getenv("IVCUDA_FUZZ_TRACE") != nullptr;
        if (trace) {
          std::uint64_t head[4] = {};
          std::memcpy(head, rec.payload.data(), std::min(sizeof head, rec.payload.size()));
          std::fprintf(stderr, "worker_fuzz: reply op %u %s status %d payload %llx %llx %llx %llx\n", rec.hdr.op,
                       proto::op_name(rec.hdr.op), rec.hdr.status, static_cast<unsigned long long>(head[0]),
                       static_cast<unsigned long long>(head[1]), static_cast<unsigned long long>(head[2]),
                       static_cast<unsigned long long>(head[3]));
        }
        const bool known = rec.hdr.op < static_cast<std::uint16_t>(proto::Op::kCount);
        e.replies[rec.hdr.op & 0xff] += known ? 1 : 0;
        if (rec.hdr.status == CUDA_SUCCESS) {
          e.successes[rec.hdr.op & 0xff] += known ? 1 : 0;
          Reply r{rec.hdr.op, {}};
          std::memcpy(r.w, rec.payload.data(), std::min(sizeof r.w, rec.payload.size()));
          replies.push_back(r);
          if (replies.size() > 1024) replies.erase(replies.begin(), replies.begin() + 512);
        }
        for (std::size_t i = 0; i + 8 <= rec.payload.size() && i < 32; i += 8) {
          std::uint64_t v;
          std::memcpy(&v, rec.payload.data() + i, 8);
          if (v != 0) vals.push_back(v);
        }
        if (g.awaiting && rec.hdr.seq == g.awaited_seq) g.awaiting = false;
        if (vals.size() > 1024) vals.erase(vals.begin(), vals.begin() + 512);
        g.cpl.consume();
      }
      g.cpl.publish_head();
    }
  }

  bool serve() {
    if (serves >= kMaxServes) return false;
    ++serves;
    w.serve_once();
    drain();
    return true;
  }

  void record(Input& in, std::uint8_t tag) {
    const std::uint32_t c = in.take<std::uint8_t>() % kChannels;
    abi::RecordHeader h{};
    h.op = in.take<std::uint16_t>();
    h.len = in.take<std::uint16_t>();
    const bool wants_reply = (tag & 0x04) != 0;
    h.flags = wants_reply ? abi::kRecNeedsReply : 0;
    h.seq = (tag & 0x10) != 0 ? in.take<std::uint32_t>() : ticket++;
    auto payload = in.bytes(h.len);
    h.len = static_cast<std::uint32_t>(payload.size());
    GuestChannel& g = open(c);
    // A guest whose completion ring broke cannot read replies: the worker
    // would only fill that ring. A well-behaved guest waits for its reply
    // before the next call; give the worker that chance first.
    if (g.cpl.corrupt()) return;
    if (g.awaiting && !serve()) return;
    ring::RingStatus st;
    std::byte* p = g.req.reserve(h, &st);
    if (p == nullptr && st == ring::RingStatus::kFull && serve()) p = g.req.reserve(h, &st);
    if (p == nullptr) return;
    std::memcpy(p, payload.data(), payload.size());
    for (std::size_t i = 0; i + 8 <= payload.size(); i += 8) {
      std::uint64_t v;
      std::memcpy(&v, p + i, 8);
      if ((v >> 40) == kSubstTag && !vals.empty()) {
        v = vals[vals.size() - 1 - ((v >> 32) & 0xff) % vals.size()] + (v & 0xffffffffu);
      } else if ((v >> 40) == kReplyTag) {
        if (!from_reply(&v)) continue;
      } else {
        continue;
      }
      std::memcpy(p + i, &v, 8);
    }
    g.req.commit();
    g.req.publish();
    if (wants_reply) {
      g.awaiting = true;
      g.awaited_seq = h.seq;
    }
    if ((tag & 0x08) != 0) serve();
  }

  // A kReplyTag word: the word of the op's reply it names, plus the addend.
  bool from_reply(std::uint64_t* v) const {
    const auto op = static_cast<std::uint16_t>((*v >> 32) & 0xff);
    const unsigned word = (*v >> 29) & 7, age = (*v >> 24) & 31;
    std::size_t n = 0;
    for (const Reply& r : replies) n += r.op == op ? 1 : 0;
    if (n == 0) return false;
    std::size_t skip = age % n;
    for (auto it = replies.rbegin(); it != replies.rend(); ++it) {
      if (it->op != op || skip-- != 0) continue;
      *v = it->w[word] + (*v & 0xffffff);
      return true;
    }
    return false;
  }

  void arena(Input& in) {
    const std::uint64_t off = in.take<std::uint32_t>() % e.l.arena_size;
    const std::size_t len = in.take<std::uint16_t>();
    auto b = in.bytes(std::min<std::uint64_t>(len, e.l.arena_size - off));
    std::memcpy(e.bar.data() + e.l.arena_off + off, b.data(), b.size());
  }

  void poke(Input& in) {
    const std::uint32_t c = in.take<std::uint8_t>() % kChannels;
    const std::uint8_t field = in.take<std::uint8_t>();
    const std::uint32_t v = in.take<std::uint32_t>();
    const ring::RingView req = ring::request_ring(e.bar.data(), e.l, c);
    const ring::RingView cpl = ring::completion_ring(e.bar.data(), e.l, c);
    auto* d = ring::channel_desc(e.bar.data(), e.l, c);
    switch (field % 6) {
      case 0: ring::store_release(req.ctl->tail, v); break;
      case 1: ring::store_release(req.ctl->head, v); break;
      case 2: ring::store_release(cpl.ctl->tail, v); break;
      case 3: ring::store_release(cpl.ctl->head, v); break;
      case 4: ring::store_release(req.ctl->consumer_sleeping, v); break;
      default: ring::store_release(d->guest_vector, v); break;
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Env& e = env();
  // Fresh shared memory, formatted as the daemon formats it.
  std::memset(e.bar.data(), 0, kShmBytes);
  (void)ring::format_bar(e.bar.data(), e.l, 1, 0, 1, abi::kFeatDoorbell | abi::kFeatArenaRegistered);
  host::WorkerConfig cfg;
  cfg.guest_id = 1;
  cfg.shm_fd = e.shm.get();
  cfg.layout = e.l;
  cfg.generation = 1;
  cfg.host_fds = {e.host_efd.get()};
  cfg.guest_fds = {e.guest_efd.get()};
  cfg.driver_path = e.driver;
  cfg.nvml_path = e.nvml;
  cfg.forward_stdout = false;  // stdout stays the fuzzer's
  // No fd-broker line: IPC and pool-pointer exports go to the worker's own
  // registry (its guest is a tenant of one worker).
  // See WorkerConfig and kMaxRandomBars: ASan's shadow page tables.
  cfg.random_bar_address = size != 0 && data[0] == kRandomBarByte && e.random_bars < kMaxRandomBars;
  e.random_bars += cfg.random_bar_address ? 1 : 0;
  auto w = host::Worker::create(std::move(cfg));
  if (!w) {
    std::fprintf(stderr, "worker_fuzz: Worker::create: %s\n", w.error().what.c_str());
    std::abort();
  }
  Session s(e, **w);
  Input in(data, size);
  while (!in.done()) {
    const auto tag = in.take<std::uint8_t>();
    switch (tag & 3) {
      case 0: s.record(in, tag); break;
      case 1: s.arena(in); break;
      case 2: s.poke(in); break;
      default: s.serve(); break;
    }
  }
  // Whatever is still queued: serve until nothing moves (parked calls the
  // double has finished answer on the next pass).
  while (s.serves < kMaxServes) {
    ++s.serves;
    const int handled = (*w)->serve_once();
    s.drain();
    if (handled == 0) break;
  }
  (void)sys::eventfd_drain(e.host_efd.get());
  (void)sys::eventfd_drain(e.guest_efd.get());
  w->reset();
  check_nothing_left(e);
  return 0;
}
