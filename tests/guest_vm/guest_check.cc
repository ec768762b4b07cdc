// ivcuda_guest_check: the guest half of the VM tests (tests/guest_vm). Linked
// statically so that the test guest needs no shared libraries; it also runs on
// the host, where --file stands in for the UIO device.
//
//   ivcuda_guest_check info
//       lists the ivcuda UIO devices, prints our peer id and the map sizes
//   ivcuda_guest_check fill|check [--file PATH] --seed S --offset O --length L
//       writes / verifies a pattern in the shared memory (BAR2, or PATH)
//   ivcuda_guest_check doorbell --peer P [--rounds R]
//       rings each of our vectors' numbers on peer P and expects the peer to
//       ring the same vector of ours back (tools/guest/ivshmem-test-server.py
//       does), checking that only that vector's /dev/uioN wakes; then times R
//       round trips on vector 0
//
// The driver (uio-driver/ivcuda_uio.c) registers one UIO device per MSI-X
// vector, named "ivcuda-vec<k>", each carrying map 0 = the BAR0 registers
// (page-rounded: maps/map0/offset is where BAR0 starts) and map 1 = BAR2.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <map>
#include <poll.h>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "ivcuda/result.h"
#include "ring/sys.h"
#include "ring/uio.h"

namespace {

using ivcuda::Error;
using ivcuda::make_error;
using ivcuda::Result;
using ivcuda::sys::Mapping;
using ivcuda::sys::UniqueFd;
using ivcuda::uio::Device;
using ivcuda::uio::errno_error;
using ivcuda::uio::open_device;
using ivcuda::uio::parse_u64;
using ivcuda::uio::UioVector;

// What tools/guest/ivshmem-test-server.py writes at the start of the shared
// memory: the magic, then the peer id it assigned to us (u64, little endian).
constexpr char kServerMagic[8] = {'I', 'V', 'C', 'U', 'D', 'A', 'T', '\0'};

constexpr int kWakeTimeoutMs = 5000;
// How long a vector that must stay silent is watched. MSI-X delivery under
// TCG takes well under a millisecond; this is generous.
constexpr int kSilenceMs = 100;

// The shared memory to work on: BAR2 through UIO, or a host file.
struct Shm {
  Device dev;        // only for UIO
  Mapping file_map;  // only for --file
  std::byte* data() const { return file_map.size() != 0 ? file_map.data() : dev.shm.data(); }
  std::size_t size() const { return file_map.size() != 0 ? file_map.size() : dev.shm.size(); }
};

Result<Shm> open_shm(const std::string& file, const std::string& pci) {
  Shm s;
  if (file.empty()) {
    IVCUDA_TRY_ASSIGN(s.dev, open_device(pci));
    return s;
  }
  UniqueFd fd(::open(file.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return errno_error("open " + file);
  IVCUDA_TRY_ASSIGN(const std::uint64_t size, ivcuda::sys::file_size(fd.get()));
  if (size == 0) return make_error(EINVAL, file + " is empty");
  IVCUDA_TRY_ASSIGN(s.file_map, Mapping::map_shared(fd.get(), size, 0));
  return s;
}

// The pattern's word at byte offset `off`: depends on the seed and on the
// offset, so a shifted, stale or foreign copy does not match.
std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t off) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + off;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct Options {
  std::string file, pci;
  std::uint64_t seed = 1, offset = 0, length = 0, peer = 0, rounds = 200;
};

Result<void> fill_or_check(const Options& o, bool fill) {
  IVCUDA_TRY_ASSIGN(Shm shm, open_shm(o.file, o.pci));
  if (o.offset % 8 != 0 || o.length % 8 != 0)
    return make_error(EINVAL, "--offset and --length must be multiples of 8");
  if (o.offset > shm.size() || o.length > shm.size() - o.offset)
    return make_error(ERANGE, "range beyond the shared memory (" + std::to_string(shm.size()) +
                                  " bytes)");
  std::byte* base = shm.data() + o.offset;
  for (std::uint64_t i = 0; i < o.length; i += 8) {
    const std::uint64_t want = pattern_word(o.seed, o.offset + i);
    if (fill) {
      std::memcpy(base + i, &want, 8);
      continue;
    }
    std::uint64_t got = 0;
    std::memcpy(&got, base + i, 8);
    if (got != want) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "pattern mismatch at offset %" PRIu64 ": %#" PRIx64
                    " instead of %#" PRIx64, o.offset + i, got, want);
      return make_error(EIO, msg);
    }
  }
  std::printf("%s %" PRIu64 " bytes at offset %" PRIu64 " (seed %" PRIu64 ") in %s\n",
              fill ? "filled" : "verified", o.length, o.offset, o.seed,
              o.file.empty() ? "BAR2" : o.file.c_str());
  return {};
}

Result<void> info(const Options& o) {
  IVCUDA_TRY_ASSIGN(Device d, open_device(o.pci));
  std::printf("ivcuda device %s: peer id %" PRIu32 ", %zu UIO device(s):",
              d.vectors[0].pci.c_str(), d.peer_id(), d.vectors.size());
  for (const UioVector& v : d.vectors) std::printf(" uio%u", v.minor);
  std::printf("\n  map0 registers: %zu bytes, BAR0 at +%zu; map1 shmem: %zu bytes\n",
              d.regs.size(), d.regs_off, d.shm.size());
  return {};
}

// Waits until vector `want` fires, failing if any other vector fires first or
// within kSilenceMs after it. Consumes the event.
Result<void> expect_only(const std::vector<UniqueFd>& fds, std::size_t want) {
  std::vector<pollfd> p(fds.size());
  for (std::size_t k = 0; k < fds.size(); k++) p[k] = {fds[k].get(), POLLIN, 0};
  bool got = false;
  for (int round = 0; round < 2; round++) {
    const int n = ::poll(p.data(), p.size(), got ? kSilenceMs : kWakeTimeoutMs);
    if (n < 0) return errno_error("poll");
    if (n == 0) {
      if (got) return {};
      return make_error(ETIMEDOUT, "vector " + std::to_string(want) + " never woke");
    }
    for (std::size_t k = 0; k < p.size(); k++) {
      if ((p[k].revents & POLLIN) == 0) continue;
      if (k != want)
        return make_error(EPROTO, "vector " + std::to_string(k) + " woke for a doorbell on vector " +
                                      std::to_string(want));
      std::uint32_t count = 0;
      if (::read(fds[k].get(), &count, sizeof count) != sizeof count)
        return errno_error("read /dev/uio");
      got = true;
    }
  }
  return {};
}

Result<void> doorbell(const Options& o) {
  if (o.peer > 0xffff) return make_error(EINVAL, "--peer must fit in 16 bits");
  IVCUDA_TRY_ASSIGN(Device d, open_device(o.pci));
  const std::uint32_t id = d.peer_id();
  std::printf("peer id %" PRIu32 ", %zu vector(s), ringing peer %" PRIu64 "\n", id,
              d.vectors.size(), o.peer);
  if (d.shm.size() >= 16 && std::memcmp(d.shm.data(), kServerMagic, 8) == 0) {
    std::uint64_t assigned = 0;
    std::memcpy(&assigned, d.shm.data() + 8, 8);
    if (assigned != id)
      return make_error(EPROTO, "IVPosition says peer " + std::to_string(id) +
                                    " but the server assigned " + std::to_string(assigned));
    std::printf("IVPosition matches the id the server wrote into BAR2\n");
  }

  // Opened before ringing: UIO counts events from open(), so an answer that
  // beats our read() is not lost.
  std::vector<UniqueFd> fds;
  for (const UioVector& v : d.vectors) {
    const std::string node = "/dev/uio" + std::to_string(v.minor);
    UniqueFd fd(::open(node.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) return errno_error("open " + node);
    fds.push_back(std::move(fd));
  }
  const auto peer = static_cast<std::uint32_t>(o.peer);
  for (std::size_t k = 0; k < fds.size(); k++) {
    d.ring(peer, static_cast<std::uint32_t>(k));
    IVCUDA_TRY(expect_only(fds, k));
    std::printf("vector %zu: woke alone\n", k);
  }

  std::vector<double> us;
  pollfd p{fds[0].get(), POLLIN, 0};
  for (std::uint64_t r = 0; r < o.rounds; r++) {
    const auto t0 = std::chrono::steady_clock::now();
    d.ring(peer, 0);
    const int n = ::poll(&p, 1, kWakeTimeoutMs);
    if (n < 0) return errno_error("poll");
    if (n == 0) return make_error(ETIMEDOUT, "round trip " + std::to_string(r) + " never came back");
    std::uint32_t count = 0;
    if (::read(fds[0].get(), &count, sizeof count) != sizeof count) return errno_error("read");
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  if (!us.empty()) {
    std::sort(us.begin(), us.end());
    double sum = 0;
    for (double v : us) sum += v;
    std::printf("doorbell round trip guest->host->guest over %zu rounds: min %.1f us, median %.1f us, "
                "mean %.1f us, p99 %.1f us, max %.1f us\n",
                us.size(), us.front(), us[us.size() / 2], sum / static_cast<double>(us.size()),
                us[us.size() * 99 / 100], us.back());
  }
  return {};
}

int usage() {
  std::fprintf(stderr,
               "usage: ivcuda_guest_check info [--pci BDF]\n"
               "       ivcuda_guest_check fill|check [--file PATH | --pci BDF] --seed S --offset O "
               "--length L\n"
               "       ivcuda_guest_check doorbell [--pci BDF] --peer P [--rounds R]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string_view cmd = argv[1];
  Options o;
  for (int i = 2; i < argc; i++) {
    const std::string_view a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    Result<std::uint64_t> n = parse_u64(v, std::string(a));
    std::uint64_t* dst = a == "--seed"     ? &o.seed
                         : a == "--offset" ? &o.offset
                         : a == "--length" ? &o.length
                         : a == "--peer"   ? &o.peer
                         : a == "--rounds" ? &o.rounds
                                           : nullptr;
    if (a == "--file") {
      o.file = v;
    } else if (a == "--pci") {
      o.pci = v;
    } else if (dst == nullptr) {
      return usage();
    } else if (!n) {
      std::fprintf(stderr, "ivcuda_guest_check: %s\n", n.error().what.c_str());
      return 2;
    } else {
      *dst = *n;
    }
  }

  Result<void> r = cmd == "info"       ? info(o)
                   : cmd == "fill"     ? fill_or_check(o, true)
                   : cmd == "check"    ? fill_or_check(o, false)
                   : cmd == "doorbell" ? doorbell(o)
                                       : Result<void>(make_error(EINVAL, "unknown command"));
  if (!r) {
    std::fprintf(stderr, "ivcuda_guest_check %s: %s\n", argv[1], r.error().what.c_str());
    return 1;
  }
  return 0;
}
