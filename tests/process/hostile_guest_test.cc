// A hostile guest: speaks the ring protocol by hand and sends what no
// well-behaved libcuda would. The worker must answer each with the right
// CUresult, never touch memory outside what the guest owns, and keep serving.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <elf.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <optional>
#include <fcntl.h>
#include <fstream>
#include <future>
#include <sstream>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ivcuda/proto.h"
#include "ring/ivshmem.h"
#include "ring/layout.h"
#include "ring/spsc_ring.h"
#include "ring/sys.h"
#include "ring/wait.h"
#include "tests/process/double_strays.h"
#include "tests/process/raw_guest.h"

using namespace ivcuda;
using proto::Op;

using namespace ivcuda::testing;

namespace {

// Where the worker maps the BAR (RepHello's arena_device_base): below the
// arena lie the superblock and the rings, the worker's own memory at an
// address the guest knows. No device memory of the guest's, but a driver
// with HMM (and the double here) would take it.
std::uint64_t worker_bar(RawGuest& g) {
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, 1, 0, 0, {}}, &out) == CUDA_SUCCESS);
  const auto base = RawGuest::as<proto::RepHello>(out).arena_device_base;
  REQUIRE(base != 0);
  return base;
}

// Rings of the last channel, which no test here uses: what a copy aimed at
// the worker's memory would write to.
std::uint64_t worker_rings(RawGuest& g, std::uint64_t bar) {
  return bar + g.l.rings_off + std::uint64_t{g.l.channels - 1} * g.l.channel_stride;
}

}  // namespace

TEST_CASE("a hostile guest gets clear errors and the worker keeps serving", "[process][hostile]") {
  Strays strays;
  Daemon d;
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  std::vector<std::byte> out;

  proto::ReqHello hello{proto::kProtoVersion, 1, 0, 0, {}};
  REQUIRE(g.call(0, Op::kHello, hello, &out) == CUDA_SUCCESS);

  SECTION("unknown ops and truncated requests") {
    CHECK(g.send(0, 999, nullptr, 0, true) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.send(0, 0, nullptr, 0, true) == CUDA_ERROR_INVALID_VALUE);
    const std::uint32_t four = 4;
    CHECK(g.send(0, static_cast<std::uint16_t>(Op::kMemAlloc), &four, 4, true) == CUDA_ERROR_INVALID_VALUE);
    proto::ReqHello old{proto::kProtoVersion + 7, 1, 0, 0, {}};
    CHECK(g.call(0, Op::kHello, old) == CUDA_ERROR_NOT_SUPPORTED);
  }

  SECTION("devices, contexts and handles it does not own") {
    CHECK(g.call(0, Op::kDeviceInfo, proto::ReqDevice{-1, 0}) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{64, 0}) == CUDA_ERROR_INVALID_DEVICE);
    // A P2P attribute outside the driver's enum (found by tests/fuzz/worker_fuzz).
    CHECK(g.call(0, Op::kPeerQuery, proto::ReqPeerQuery{0, 0, 5644, 0}) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kPeerQuery, proto::ReqPeerQuery{0, 0, 0xffffffffu, 0}) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{0x0100000100000007ull, 64, 0, 0, 0, 0}) ==
          CUDA_ERROR_INVALID_CONTEXT);
    REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
    const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
    // Numbers outside a CUDA enum's range (the bit-field of its enumerators)
    // are refused before they become the enum: CUlimit's range is 0..15,
    // CUfunc_cache's 0..3, CUstreamCaptureMode's 0..3.
    for (std::int32_t limit : {16, -1, 0x7fffffff})
      CHECK(g.call(0, Op::kCtxGetLimit, proto::ReqLimit{ctx, 0, limit, 0}) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kCtxSetLimit, proto::ReqLimit{ctx, 1, 16, 0}) == CUDA_ERROR_INVALID_VALUE);
    for (std::uint32_t config : {4u, 0x7fffffffu, 0x80000000u})
      CHECK(g.call(0, Op::kCtxMisc, proto::ReqCtxMisc{ctx, 0, proto::kCtxSetCacheConfig, config}) ==
            CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kCaptureMode, proto::ReqCaptureMode{4, 0}) == CUDA_ERROR_INVALID_VALUE);
    // inside the range the driver answers, as on bare metal
    CHECK(g.call(0, Op::kCtxMisc, proto::ReqCtxMisc{ctx, 0, proto::kCtxSetCacheConfig, 1}) == CUDA_SUCCESS);
    // a stream handle of the right kind but a slot that was never handed out
    CHECK(g.call(0, Op::kStreamDestroy, proto::ReqHandle{ctx, 0x0400000100000009ull}) == CUDA_ERROR_INVALID_HANDLE);
    // a context handle passed where a stream handle belongs
    CHECK(g.call(0, Op::kStreamSynchronize, proto::ReqHandle{ctx, ctx}) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(g.call(0, Op::kCtxDestroy, proto::ReqHandle{0, ctx}) == CUDA_ERROR_INVALID_CONTEXT);  // primary
    proto::ReqModuleName mn{ctx, 0x0200000100000000ull, 3, 0};
    const char name[] = "abc";
    CHECK(g.call(0, Op::kModuleGetFunction, mn, nullptr, {reinterpret_cast<const std::byte*>(name), 3}) ==
          CUDA_ERROR_INVALID_HANDLE);
    mn.name_len = 100;  // says 100 bytes, sends 3
    CHECK(g.call(0, Op::kModuleGetFunction, mn, nullptr, {reinterpret_cast<const std::byte*>(name), 3}) ==
          CUDA_ERROR_INVALID_VALUE);
  }

  SECTION("addresses, offsets and lengths outside what it owns") {
    REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
    const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
    REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 4096, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
    const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
    proto::ReqCopy c{};
    c.ctx = ctx;
    c.dst = dptr;
    c.bytes = 64;
    c.arena_off = ~0ull - 8;  // would wrap when added to the length
    CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);
    c.arena_off = 0;  // the superblock: not the arena
    CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);
    c.arena_off = g.l.arena_off + g.l.arena_size - 32;  // runs off the end of the arena
    CHECK(g.call(0, Op::kMemcpyDtoHArena, c) == CUDA_ERROR_INVALID_VALUE);
    c.arena_off = g.l.arena_off;
    c.src = dptr + 4090;  // runs off the end of the allocation
    CHECK(g.call(0, Op::kMemcpyDtoHArena, c) == CUDA_ERROR_INVALID_VALUE);
    c.src = dptr;
    c.dst = dptr ^ 0x100000000ull;  // someone else's memory
    CHECK(g.call(0, Op::kMemcpyDtoD, c) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kMemFree, proto::ReqPtr{ctx, dptr + 8}) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kHostFree, proto::ReqArenaOff{g.l.arena_off + 4096}) == CUDA_ERROR_INVALID_VALUE);
    proto::ReqMemset ms{};
    ms.ctx = ctx;
    ms.dptr = dptr;
    ms.elem_size = 4;
    ms.width = ~0ull / 2;  // width * 4 overflows
    ms.height = 1;
    CHECK(g.call(0, Op::kMemset, ms) == CUDA_ERROR_INVALID_VALUE);
    ms.width = 100;
    ms.pitch = 1ull << 62;  // 2D footprint overflows
    ms.height = 8;
    CHECK(g.call(0, Op::kMemset, ms) == CUDA_ERROR_INVALID_VALUE);
    proto::ReqCopy2D c2{};
    c2.ctx = ctx;
    c2.src_type = CU_MEMORYTYPE_DEVICE;
    c2.src_device = dptr;
    c2.src_pitch = 64;
    c2.dst_type = CU_MEMORYTYPE_HOST;
    c2.dst_arena_off = g.l.arena_off;
    c2.dst_pitch = 64;
    c2.width_bytes = 64;
    c2.height = 65;  // 65 rows of 64 bytes: one row past the allocation
    CHECK(g.call(0, Op::kMemcpy2D, c2) == CUDA_ERROR_INVALID_VALUE);
    c2.height = 64;
    CHECK(g.call(0, Op::kMemcpy2D, c2) == CUDA_SUCCESS);

    // The worker's own memory and a freed allocation: the driver (with HMM,
    // and the double here) would take both, only the worker's books refuse.
    const std::uint64_t bar = worker_bar(g), rings = worker_rings(g, bar);
    const std::uint64_t arena_dev = bar + g.l.arena_off;
    // Channel 0's staging area (a chunk of a pageable copy) and the
    // page-locked memory after every channel's staging area.
    const std::uint64_t staging = ring::staging_off(g.l, 0), pinned = ring::staging_off(g.l, g.l.channels);
    REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 4096, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
    const auto freed = RawGuest::as<proto::RepMemAlloc>(out).dptr;
    REQUIRE(g.call(0, Op::kMemFree, proto::ReqPtr{ctx, freed}) == CUDA_SUCCESS);
    for (const std::uint64_t theirs : {rings, freed}) {
      INFO("a copy to 0x" << std::hex << theirs);
      proto::ReqCopy w{};
      w.ctx = ctx;
      w.dst = theirs;
      w.bytes = 64;
      w.arena_off = pinned;
      CHECK(g.call(0, Op::kMemcpyHtoDArena, w) == CUDA_ERROR_INVALID_VALUE);
      w.arena_off = staging;
      CHECK(g.call(0, Op::kMemcpyHtoDArena, w) == CUDA_ERROR_INVALID_VALUE);
      w.src = dptr;
      CHECK(g.call(0, Op::kMemcpyDtoD, w) == CUDA_ERROR_INVALID_VALUE);
      const std::vector<std::byte> data(64);
      CHECK(g.call(0, Op::kMemcpyHtoDInline, w, nullptr, data) == CUDA_ERROR_INVALID_VALUE);
      proto::ReqMemset m{};
      m.ctx = ctx;
      m.dptr = theirs;
      m.elem_size = 4;
      m.width = 16;
      m.height = 1;
      CHECK(g.call(0, Op::kMemset, m) == CUDA_ERROR_INVALID_VALUE);
      m.pitch = 64;
      m.height = 2;
      CHECK(g.call(0, Op::kMemset, m) == CUDA_ERROR_INVALID_VALUE);
      proto::ReqCopyPeer pc{};
      pc.ctx = ctx;
      pc.dst = theirs;
      pc.src = dptr;
      pc.bytes = 64;
      CHECK(g.call(0, Op::kMemcpyPeer, pc) == CUDA_ERROR_INVALID_VALUE);
    }
    for (const std::uint64_t theirs : {bar, freed, arena_dev - 32}) {  // the last runs into the arena
      INFO("a copy from 0x" << std::hex << theirs);
      proto::ReqCopy r{};
      r.ctx = ctx;
      r.src = theirs;
      r.bytes = 64;
      r.arena_off = pinned;
      CHECK(g.call(0, Op::kMemcpyDtoHArena, r) == CUDA_ERROR_INVALID_VALUE);
      r.arena_off = staging;
      CHECK(g.call(0, Op::kMemcpyDtoHArena, r) == CUDA_ERROR_INVALID_VALUE);
      CHECK(g.call(0, Op::kMemcpyDtoHInline, r) == CUDA_ERROR_INVALID_VALUE);
      r.dst = dptr;
      CHECK(g.call(0, Op::kMemcpyDtoD, r) == CUDA_ERROR_INVALID_VALUE);
      auto r2 = c2;
      r2.src_device = theirs;
      r2.height = 1;
      CHECK(g.call(0, Op::kMemcpy2D, r2) == CUDA_ERROR_INVALID_VALUE);
    }
    // A posted copy that is refused surfaces at the next synchronising call.
    c.dst = dptr + 4095;
    c.bytes = 2;
    c.arena_off = g.l.arena_off;
    g.post(0, Op::kMemcpyHtoDArena, c);
    CHECK(g.call(0, Op::kFlush, proto::ReqCtx{ctx}) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kFlush, proto::ReqCtx{ctx}) == CUDA_SUCCESS);
    // The allocation survived all of it.
    c.dst = dptr;
    c.bytes = 4096;
    CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_SUCCESS);
    CHECK(g.call(0, Op::kMemFree, proto::ReqPtr{ctx, dptr}) == CUDA_SUCCESS);
  }

  SECTION("a corrupt ring loses that channel only") {
    auto& bad = g.open(1);
    (void)bad;
    // Claim the producer published far more than the ring holds.
    auto v = ring::request_ring(g.bar.data(), g.l, 1);
    ring::store_release(v.ctl->tail, v.cells * 4 + 3);
    ring::EventfdDoorbell(g.client.peers().at(0)[0].get()).ring();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(g.call(0, Op::kHello, hello) == CUDA_SUCCESS);  // channel 0 still served
    // and a second guest is served as if nothing happened
    RawGuest other(d.sock);
    other.open(0);
    CHECK(other.call(0, Op::kHello, hello) == CUDA_SUCCESS);
  }
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

namespace {

// A guest's handle of device 0's primary context.
std::uint64_t primary_ctx(RawGuest& g) {
  std::vector<std::byte> out;
  proto::ReqHello hello{proto::kProtoVersion, 1, 0, 0, {}};
  REQUIRE(g.call(0, Op::kHello, hello) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  return RawGuest::as<proto::RepHandle>(out).handle;
}

// Stages `image` at the start of the arena and loads it as a module.
CUresult load_module(RawGuest& g, std::uint64_t ctx, const std::vector<std::byte>& image,
                     std::uint64_t* module = nullptr) {
  std::memcpy(g.bar.data() + g.l.arena_off, image.data(), image.size());
  std::vector<std::byte> out;
  const CUresult r = g.call(0, Op::kModuleLoad, proto::ReqModuleLoad{ctx, image.size(), g.l.arena_off, 0, 0}, &out);
  if (module != nullptr && r == CUDA_SUCCESS) *module = RawGuest::as<proto::RepHandle>(out).handle;
  return r;
}

template <class... Fields>
std::vector<std::byte> bytes_of(const Fields&... f) {
  std::vector<std::byte> v;
  auto add = [&](const auto& x) {
    const auto* p = reinterpret_cast<const std::byte*>(&x);
    v.insert(v.end(), p, p + sizeof x);
  };
  (add(f), ...);
  return v;
}

std::vector<std::byte> text(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// PTX of one kernel `name` taking `n` one-byte parameters.
std::string ptx_with_params(const std::string& name, int n) {
  std::ostringstream o;
  o << ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry " << name << "(";
  for (int i = 0; i < n; ++i) o << (i ? ",\n" : "") << ".param .u8 p" << i;
  o << ")\n{\nret;\n}\n";
  return o.str();
}

CUresult get_function(RawGuest& g, std::uint64_t ctx, std::uint64_t module, const std::string& name,
                      proto::RepFunction* rep = nullptr) {
  std::vector<std::byte> out;
  proto::ReqModuleName mn{ctx, module, static_cast<std::uint32_t>(name.size()), 0};
  const CUresult r = g.call(0, Op::kModuleGetFunction, mn, &out, std::as_bytes(std::span(name)));
  if (rep != nullptr) *rep = RawGuest::as<proto::RepFunction>(out);
  return r;
}

}  // namespace

// issue 12, hole 2: the worker must pass the driver a pointer for every
// parameter the function has, or the driver reads past the worker's array.
TEST_CASE("a kernel with more parameters than the worker can pass is refused", "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock);
  g.open(0);
  const std::uint64_t ctx = primary_ctx(g);
  std::uint64_t big = 0, max = 0;
  REQUIRE(load_module(g, ctx, text(ptx_with_params("too_many", proto::kMaxParams + 4)), &big) == CUDA_SUCCESS);
  CHECK(get_function(g, ctx, big, "too_many") == CUDA_ERROR_NOT_SUPPORTED);
  // Exactly as many as the protocol carries still works, launch included.
  REQUIRE(load_module(g, ctx, text(ptx_with_params("just_enough", proto::kMaxParams)), &max) == CUDA_SUCCESS);
  proto::RepFunction f{};
  REQUIRE(get_function(g, ctx, max, "just_enough", &f) == CUDA_SUCCESS);
  CHECK(f.param_count == proto::kMaxParams);
  proto::ReqLaunch l{};
  l.ctx = ctx;
  l.function = f.function;
  l.grid[0] = l.grid[1] = l.grid[2] = l.block[0] = l.block[1] = l.block[2] = 1;
  l.param_bytes = f.param_bytes;
  std::vector<std::byte> params(f.param_bytes);
  // The double has no CPU version of this kernel: NOT_SUPPORTED, after it
  // read every parameter through the pointers the worker passed.
  CHECK(g.call(0, Op::kLaunch, l, nullptr, params) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(g.call(0, Op::kFlush, proto::ReqCtx{ctx}) == CUDA_SUCCESS);
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

// issue 12, holes 3 and 4: the driver takes images without a length and
// follows what they say about themselves.
TEST_CASE("images that would make the driver follow a pointer or read past the copy are refused",
          "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock);
  g.open(0);
  const std::uint64_t ctx = primary_ctx(g);

  SECTION("a fatbin wrapper: magic, version, a pointer the guest chose") {
    CHECK(load_module(g, ctx, bytes_of(0x466243B1u, 1u, std::uint64_t{0x10}, std::uint64_t{0})) ==
          CUDA_ERROR_INVALID_IMAGE);
    // aimed at guest-writable memory: the arena's device alias
    std::vector<std::byte> out;
    proto::ReqHello hello{proto::kProtoVersion, 1, 0, 0, {}};
    REQUIRE(g.call(0, Op::kHello, hello, &out) == CUDA_SUCCESS);
    const auto base = RawGuest::as<proto::RepHello>(out).arena_device_base;
    CHECK(load_module(g, ctx, bytes_of(0x466243B1u, 1u, base + g.l.arena_off + 4096, std::uint64_t{0})) ==
          CUDA_ERROR_INVALID_IMAGE);
  }
  SECTION("a fatbin header that declares more payload than was sent") {
    CHECK(load_module(g, ctx, bytes_of(0xBA55ED50u, std::uint16_t{1}, std::uint16_t{16},
                                       std::uint64_t{64 << 10})) == CUDA_ERROR_INVALID_IMAGE);
    // a fatbin entry that claims more than its fatbin
    CHECK(load_module(g, ctx, bytes_of(0xBA55ED50u, std::uint16_t{1}, std::uint16_t{16}, std::uint64_t{64},
                                       std::uint16_t{1}, std::uint16_t{0}, 64u, std::uint64_t{1} << 20,
                                       std::array<std::uint64_t, 6>{})) == CUDA_ERROR_INVALID_IMAGE);
  }
  SECTION("ELF images whose tables and sections lie outside the bytes sent") {
    Elf64_Ehdr eh{};
    std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_ident[EI_VERSION] = EV_CURRENT;
    eh.e_type = ET_EXEC;
    eh.e_machine = 190;  // EM_CUDA
    eh.e_version = EV_CURRENT;
    eh.e_ehsize = sizeof eh;
    eh.e_shentsize = sizeof(Elf64_Shdr);
    eh.e_phentsize = sizeof(Elf64_Phdr);
    Elf64_Ehdr far = eh;
    far.e_shoff = 1 << 20;  // a section header table a megabyte past the image
    far.e_shnum = 8;
    CHECK(load_module(g, ctx, bytes_of(far)) == CUDA_ERROR_INVALID_IMAGE);
    Elf64_Ehdr one = eh;  // one section, whose bytes lie past the image
    one.e_shoff = sizeof eh;
    one.e_shnum = 2;
    Elf64_Shdr null{}, sec{};
    sec.sh_type = SHT_PROGBITS;
    sec.sh_offset = 64;
    sec.sh_size = 1 << 20;
    CHECK(load_module(g, ctx, bytes_of(one, null, sec)) == CUDA_ERROR_INVALID_IMAGE);
    Elf64_Ehdr seg = eh;  // a program segment past the image
    seg.e_phoff = sizeof eh;
    seg.e_phnum = 1;
    Elf64_Phdr ph{};
    ph.p_type = PT_LOAD;
    ph.p_offset = 16;
    ph.p_filesz = 1 << 20;
    CHECK(load_module(g, ctx, bytes_of(seg, ph)) == CUDA_ERROR_INVALID_IMAGE);
  }
  // Real images still load, and the worker kept serving through all of it.
  CHECK(load_module(g, ctx, text(ptx_with_params("fine", 2))) == CUDA_SUCCESS);
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

// The JIT linker's request (host-daemon/worker/link.cc): forged handles, pointers
// passed as options, inputs whose bytes are not what they claim or lie past
// the arena, and reads of an output that does not exist get clear errors.
TEST_CASE("linker requests with forged handles, options or inputs are refused", "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock);
  g.open(0);
  const std::uint64_t ctx = primary_ctx(g);
  auto link = [&](proto::ReqLink r, std::span<const std::byte> tail = {}, std::vector<std::byte>* out = nullptr) {
    r.ctx = ctx;
    return g.call(0, Op::kLink, r, out, tail);
  };
  std::vector<std::byte> out;
  proto::ReqLink create{};
  create.kind = proto::kLinkCreate;
  // an option whose value the driver would take as a pointer (a log buffer) is not passed on
  const auto log_buffer = bytes_of(proto::LinkOption{CU_JIT_INFO_LOG_BUFFER, 0x1000});
  create.count = 1;
  CHECK(link(create, log_buffer) == CUDA_ERROR_INVALID_VALUE);
  create.count = 2;  // more options announced than sent
  CHECK(link(create, bytes_of(proto::LinkOption{CU_JIT_MAX_REGISTERS, 32})) == CUDA_ERROR_INVALID_VALUE);
  create.count = proto::kLinkMaxOptions + 1;
  CHECK(link(create) == CUDA_ERROR_INVALID_VALUE);
  create.count = 0;
  REQUIRE(link(create, {}, &out) == CUDA_SUCCESS);
  const std::uint64_t h = RawGuest::as<proto::RepLink>(out).link;

  proto::ReqLink add{};
  add.kind = proto::kLinkAdd;
  add.link = h ^ 0x1;  // forged
  add.input_type = CU_JIT_INPUT_PTX;
  const std::string ptx = ptx_with_params("linked", 1);
  std::memcpy(g.bar.data() + g.l.arena_off, ptx.data(), ptx.size());
  add.arena_off = g.l.arena_off;
  add.bytes = ptx.size();
  CHECK(link(add) == CUDA_ERROR_INVALID_HANDLE);
  add.link = h;
  add.name_len = 4;  // a name announced and not sent
  CHECK(link(add) == CUDA_ERROR_INVALID_VALUE);
  add.name_len = 0;
  add.input_type = CU_JIT_NUM_INPUT_TYPES;
  CHECK(link(add) == CUDA_ERROR_INVALID_VALUE);
  add.input_type = CU_JIT_INPUT_CUBIN;  // PTX text claimed to be a cubin
  CHECK(link(add) == CUDA_ERROR_INVALID_IMAGE);
  add.input_type = CU_JIT_INPUT_LIBRARY;
  CHECK(link(add) == CUDA_ERROR_NOT_SUPPORTED);
  add.input_type = CU_JIT_INPUT_FATBINARY;  // a fatbin header declaring more than was sent
  const auto fatbin = bytes_of(0xBA55ED50u, std::uint16_t{1}, std::uint16_t{16}, std::uint64_t{64 << 10});
  std::memcpy(g.bar.data() + g.l.arena_off, fatbin.data(), fatbin.size());
  add.bytes = fatbin.size();
  CHECK(link(add) == CUDA_ERROR_INVALID_IMAGE);
  add.input_type = CU_JIT_INPUT_PTX;
  add.arena_off = g.l.arena_off + g.l.arena_size - 8;  // running past the arena
  add.bytes = 64;
  CHECK(link(add) == CUDA_ERROR_INVALID_VALUE);

  proto::ReqLink read{};
  read.kind = proto::kLinkRead;  // before anything was linked
  read.link = h;
  read.arena_off = g.l.arena_off;
  read.bytes = 16;
  CHECK(link(read) == CUDA_ERROR_INVALID_VALUE);
  proto::ReqLink bad{};
  bad.kind = 99;
  bad.link = h;
  CHECK(link(bad) == CUDA_ERROR_INVALID_VALUE);
  proto::ReqLink destroy{};
  destroy.kind = proto::kLinkDestroy;
  destroy.link = h;
  CHECK(link(destroy) == CUDA_SUCCESS);
  CHECK(link(destroy) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(d.alive());
  CHECK(strays.seen() == "");
}

// issue 12, hole 5: what the guest learns of the worker, and what it can do
// to the memory it shares with it.
TEST_CASE("the guest learns no address of the worker's own and cannot reseal its memory", "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest a(d.sock), b(d.sock);
  a.open(0);
  b.open(0);
  // A process-mode guest that adds a seal before its worker maps the memory
  // would break that mapping: the memory comes with its seals sealed.
  errno = 0;
  CHECK(::fcntl(a.client.shm_fd(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == -1);
  CHECK(errno == EPERM);
  CHECK((::fcntl(a.client.shm_fd(), F_GET_SEALS) & F_SEAL_SEAL) != 0);

  std::vector<std::byte> out;
  proto::ReqHello hello{proto::kProtoVersion, 1, 0, 0, {}};
  REQUIRE(a.call(0, Op::kHello, hello, &out) == CUDA_SUCCESS);
  const auto base_a = RawGuest::as<proto::RepHello>(out).arena_device_base;
  REQUIRE(b.call(0, Op::kHello, hello, &out) == CUDA_SUCCESS);
  const auto base_b = RawGuest::as<proto::RepHello>(out).arena_device_base;
  CHECK(base_a != base_b);  // placed at random per worker
  // The arena's device alias is the BAR's host address in the worker (the
  // double, like the driver with unified addressing, maps registered memory at
  // its own address). It must lie far from the worker's libraries.
  const auto workers = d.workers();
  REQUIRE(workers.size() == 2);
  for (pid_t w : workers) {
    std::ifstream maps("/proc/" + std::to_string(w) + "/maps");
    std::string line;
    std::uint64_t libc = 0;
    while (std::getline(maps, line))
      if (line.find("/libc.so") != std::string::npos) libc = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    REQUIRE(libc != 0);
    for (std::uint64_t base : {base_a, base_b}) {
      const std::uint64_t dist = base > libc ? base - libc : libc - base;
      CHECK(dist > (std::uint64_t{1} << 40));
    }
  }
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

TEST_CASE("one user id gets at most --max-guests-per-uid guests at once and the next waits a while for one to end",
          "[process][hostile]") {
  using namespace std::chrono_literals;
  Strays strays;
  Daemon d({"--max-guests-per-uid", "2"});
  auto connect = [&](std::chrono::milliseconds patience) { return ivshmem::ivshmem_connect(d.sock, patience, 8); };
  std::optional<RawGuest> first(std::in_place, d.sock);
  RawGuest second(d.sock);
  // A third is not greeted while both are served...
  CHECK_FALSE(connect(1000ms).ok());
  // ...and is, once one of them leaves (the daemon holds it meanwhile).
  auto third = std::async(std::launch::async, [&] { return connect(3000ms); });
  std::this_thread::sleep_for(500ms);
  first.reset();
  auto admitted = third.get();
  CHECK(admitted.ok());

  // Served two again: one more waits at most the daemon's 4 s, then is turned away.
  const auto t0 = std::chrono::steady_clock::now();
  auto waiter = std::async(std::launch::async, [&] { return connect(8000ms); });
  std::this_thread::sleep_for(300ms);
  // Two more waiting are the most a user may have: the next is turned away at once.
  auto waiter2 = std::async(std::launch::async, [&] { return connect(8000ms); });
  std::this_thread::sleep_for(300ms);
  const auto t1 = std::chrono::steady_clock::now();
  CHECK_FALSE(connect(3000ms).ok());
  CHECK(std::chrono::steady_clock::now() - t1 < 2000ms);
  CHECK_FALSE(waiter.get().ok());
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= 3500ms);
  CHECK(waited < 6500ms);
  CHECK_FALSE(waiter2.get().ok());
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

// Virtual memory management (host-daemon/worker/vmm.cc): a guest maps only its own
// handles into its own reservations, and owns only what is mapped.
TEST_CASE("VMM requests outside what the guest reserved and created are refused", "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock), other(d.sock);
  g.open(0);
  other.open(0);
  const std::uint64_t ctx = primary_ctx(g);
  (void)primary_ctx(other);
  std::vector<std::byte> out;
  proto::MemProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.loc_id = 0;
  REQUIRE(g.call(0, Op::kMemGranularity, proto::ReqMemGranularity{prop, 0, 0}, &out) == CUDA_SUCCESS);
  const auto gran = static_cast<std::uint64_t>(RawGuest::as<proto::RepValue>(out).value);
  REQUIRE(gran != 0);
  REQUIRE(g.call(0, Op::kMemAddressReserve, proto::ReqMemAddressReserve{4 * gran, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto base = RawGuest::as<proto::RepRange>(out).base;
  REQUIRE(g.call(0, Op::kMemCreate, proto::ReqMemCreate{prop, 2 * gran, 0}, &out) == CUDA_SUCCESS);
  const auto handle = RawGuest::as<proto::RepHandle>(out).handle;

  // a forged handle, another kind's handle, a location of a device it was not given
  CHECK(g.call(0, Op::kMemMap, proto::ReqMemMap{base, gran, 0, handle ^ 0x100000000ull, 0}) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(g.call(0, Op::kMemMap, proto::ReqMemMap{base, gran, 0, ctx, 0}) == CUDA_ERROR_INVALID_HANDLE);
  proto::MemProp far = prop;
  far.loc_id = 7;
  CHECK(g.call(0, Op::kMemCreate, proto::ReqMemCreate{far, gran, 0}) == CUDA_ERROR_INVALID_DEVICE);
  // outside its reservation, across its end, past the allocation
  CHECK(g.call(0, Op::kMemMap, proto::ReqMemMap{base + 4 * gran, gran, 0, handle, 0}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemMap, proto::ReqMemMap{base + 3 * gran, 2 * gran, 0, handle, 0}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemMap, proto::ReqMemMap{base, 2 * gran, gran, handle, 0}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemMap, proto::ReqMemMap{~0ull - gran + 1, gran, 0, handle, 0}) == CUDA_ERROR_INVALID_VALUE);
  // another guest can neither map this guest's handle nor into its range
  CHECK(other.call(0, Op::kMemMap, proto::ReqMemMap{base, gran, 0, handle, 0}) == CUDA_ERROR_INVALID_HANDLE);
  // reserved but not mapped: not memory it may copy to
  proto::ReqCopy c{};
  c.ctx = ctx;
  c.dst = base;
  c.bytes = 64;
  c.arena_off = g.l.arena_off;
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);

  REQUIRE(g.call(0, Op::kMemMap, proto::ReqMemMap{base, 2 * gran, 0, handle, 0}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemMap, proto::ReqMemMap{base + gran, gran, 0, handle, 0}) == CUDA_ERROR_INVALID_VALUE);
  proto::MemAccess a{CU_MEM_LOCATION_TYPE_DEVICE, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 0};
  const auto tail = std::as_bytes(std::span(&a, 1));
  CHECK(g.call(0, Op::kMemSetAccess, proto::ReqMemSetAccess{base, 3 * gran, 1, 0}, nullptr, tail) ==
        CUDA_ERROR_INVALID_VALUE);  // beyond the mapping
  CHECK(g.call(0, Op::kMemSetAccess, proto::ReqMemSetAccess{base, 2 * gran, 2, 0}, nullptr, tail) ==
        CUDA_ERROR_INVALID_VALUE);  // says two descriptors, sends one
  REQUIRE(g.call(0, Op::kMemSetAccess, proto::ReqMemSetAccess{base, 2 * gran, 1, 0}, nullptr, tail) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_SUCCESS);  // mapped: its memory now
  c.dst = base + 2 * gran - 32;
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);  // runs off the mapping
  // a mapping is not an allocation, and not half of it can go
  CHECK(g.call(0, Op::kMemFree, proto::ReqPtr{ctx, base}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemUnmap, proto::ReqMemRange{base, gran}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemAddressFree, proto::ReqMemRange{base, 4 * gran}) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(g.call(0, Op::kMemUnmap, proto::ReqMemRange{base, 2 * gran}) == CUDA_SUCCESS);
  c.dst = base;
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);  // gone with the mapping
  CHECK(g.call(0, Op::kMemRelease, proto::ReqHandle{0, handle}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemRelease, proto::ReqHandle{0, handle}) == CUDA_ERROR_INVALID_VALUE);  // stale
  CHECK(g.call(0, Op::kMemAddressFree, proto::ReqMemRange{base, 2 * gran}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(other.call(0, Op::kMemAddressFree, proto::ReqMemRange{base, 4 * gran}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemAddressFree, proto::ReqMemRange{base, 4 * gran}) == CUDA_SUCCESS);
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

TEST_CASE("shareable-handle tokens import only in their tenant, and only as the host issued them",
          "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock), sibling(d.sock);  // two workers of one tenant
  g.open(0);
  sibling.open(0);
  (void)primary_ctx(g);
  (void)primary_ctx(sibling);
  std::vector<std::byte> out;
  proto::MemProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
  REQUIRE(g.call(0, Op::kMemGranularity, proto::ReqMemGranularity{prop, 0, 0}, &out) == CUDA_SUCCESS);
  const auto gran = static_cast<std::uint64_t>(RawGuest::as<proto::RepValue>(out).value);
  REQUIRE(g.call(0, Op::kMemCreate, proto::ReqMemCreate{prop, gran, 0}, &out) == CUDA_SUCCESS);
  const auto handle = RawGuest::as<proto::RepHandle>(out).handle;

  // Export: only its own handles, and only as a POSIX fd travels.
  constexpr std::uint32_t kFd = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CHECK(sibling.call(0, Op::kMemExportShareable, proto::ReqMemExport{handle, kFd, 0, 0}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemExportShareable, proto::ReqMemExport{handle ^ 0x100000000ull, kFd, 0, 0}) ==
        CUDA_ERROR_INVALID_VALUE);
  REQUIRE(g.call(0, Op::kMemExportShareable, proto::ReqMemExport{handle, kFd, 0, 0}, &out) == CUDA_SUCCESS);
  const auto token = RawGuest::as<proto::RepShareToken>(out);

  // The tenant's other worker imports it (through the daemon's broker).
  proto::ReqMemImport imp{};
  std::memcpy(imp.token, token.token, sizeof imp.token);
  imp.handle_type = kFd;
  CHECK(sibling.call(0, Op::kMemImportShareable, imp) == CUDA_SUCCESS);
  // Forged: each byte of the token flipped; another handle type.
  for (std::size_t i = 0; i < sizeof imp.token; ++i) {
    auto bad = imp;
    bad.token[i] ^= 0x40;
    CHECK(sibling.call(0, Op::kMemImportShareable, bad) == CUDA_ERROR_UNKNOWN);
  }
  auto other_type = imp;
  other_type.handle_type = CU_MEM_HANDLE_TYPE_FABRIC;
  CHECK(sibling.call(0, Op::kMemImportShareable, other_type) == CUDA_ERROR_INVALID_VALUE);
  // Another daemon (another tenant) does not know it.
  {
    Daemon d2({}, "-share");
    RawGuest stranger(d2.sock);
    stranger.open(0);
    (void)primary_ctx(stranger);
    CHECK(stranger.call(0, Op::kMemImportShareable, imp) == CUDA_ERROR_UNKNOWN);
  }
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

TEST_CASE("array copies and texture objects outside what the guest created are refused", "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock), other(d.sock);
  g.open(0);
  other.open(0);
  const std::uint64_t ctx = primary_ctx(g);
  const std::uint64_t other_ctx = primary_ctx(other);
  std::vector<std::byte> out;
  proto::ReqArrayCreate ac{};
  ac.ctx = ctx;
  ac.desc = proto::ArrayDesc{16, 8, 2, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SURFACE_LDST, 0};
  ac.kind = proto::kArrayCreate3D;
  REQUIRE(g.call(0, Op::kArrayCreate, ac, &out) == CUDA_SUCCESS);
  const auto arr = RawGuest::as<proto::RepHandle>(out).handle;
  ac.kind = proto::kArrayCreateMipmap;
  ac.desc.depth = 0;
  ac.desc.flags = 0;
  ac.levels = 2;
  REQUIRE(g.call(0, Op::kArrayCreate, ac, &out) == CUDA_SUCCESS);
  const auto mip = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kMipmapLevel, proto::ReqMipmapLevel{ctx, mip, 1, 0}, &out) == CUDA_SUCCESS);
  const auto level = RawGuest::as<proto::RepHandle>(out).handle;

  // The whole array from the start of the arena: fine.
  proto::ReqCopy3D c{};
  c.ctx = ctx;
  c.src.type = CU_MEMORYTYPE_HOST;
  c.src.arena_off = g.l.arena_off;
  c.src.pitch = 64;
  c.src.height = 8;
  c.dst.type = CU_MEMORYTYPE_ARRAY;
  c.dst.array = arr;
  c.width_bytes = 64;
  c.height = 8;
  c.depth = 2;
  CHECK(g.call(0, Op::kMemcpy3D, c) == CUDA_SUCCESS);
  // Past the right edge, the last row, the last slice of the array.
  auto bad = c;
  bad.dst.x_bytes = 4;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_VALUE);
  bad = c;
  bad.dst.y = 1;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_VALUE);
  bad = c;
  bad.dst.z = ~0ull;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_VALUE);
  // Forged, stale-kind and another guest's handles.
  bad = c;
  bad.dst.array = arr ^ 0x100000000ull;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_HANDLE);
  bad.dst.array = mip;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_HANDLE);
  auto theirs = c;
  theirs.ctx = other_ctx;
  theirs.src.arena_off = other.l.arena_off;
  CHECK(other.call(0, Op::kMemcpy3D, theirs) == CUDA_ERROR_INVALID_HANDLE);
  // Host sides outside the arena (also by overflowing pitch * height), device
  // sides outside the guest's memory, overlapping rows.
  bad = c;
  bad.src.arena_off = g.l.arena_off + g.l.arena_size - 64;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_VALUE);
  bad = c;
  bad.src.pitch = 1ull << 40;
  bad.src.height = 1ull << 30;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_VALUE);
  bad = c;
  bad.src.pitch = 32;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_VALUE);
  bad = c;
  bad.src.type = CU_MEMORYTYPE_DEVICE;
  bad.src.device = 0x10000;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t bar = worker_bar(g);  // the worker's own memory, which the double takes here
  bad.src.device = bar;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_VALUE);
  bad = c;
  bad.src.type = 9;
  CHECK(g.call(0, Op::kMemcpy3D, bad) == CUDA_ERROR_INVALID_VALUE);

  // Destroys of the wrong kind: a mipmap level alone, an array as a mipmapped array.
  CHECK(g.call(0, Op::kArrayDestroy, proto::ReqArrayQuery{ctx, level, proto::kDestroyArray, 0}) ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK(g.call(0, Op::kArrayDestroy, proto::ReqArrayQuery{ctx, arr, proto::kDestroyMipmap, 0}) ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK(other.call(0, Op::kArrayDestroy, proto::ReqArrayQuery{other_ctx, arr, proto::kDestroyArray, 0}) ==
        CUDA_ERROR_INVALID_HANDLE);

  // Texture objects: resources the guest does not own, objects it did not make.
  proto::ReqTexCreate t{};
  t.ctx = ctx;
  t.res.type = CU_RESOURCE_TYPE_LINEAR;
  t.res.dptr = 0x10000;
  t.res.format = CU_AD_FORMAT_FLOAT;
  t.res.channels = 1;
  t.res.size_bytes = 4096;
  CHECK(g.call(0, Op::kTexCreate, t) == CUDA_ERROR_INVALID_VALUE);
  t.res.dptr = bar;
  CHECK(g.call(0, Op::kTexCreate, t) == CUDA_ERROR_INVALID_VALUE);
  t.res.type = CU_RESOURCE_TYPE_ARRAY;
  t.res.handle = arr ^ 0x100000000ull;
  CHECK(g.call(0, Op::kTexCreate, t) == CUDA_ERROR_INVALID_HANDLE);
  t.res.handle = arr;
  REQUIRE(g.call(0, Op::kTexCreate, t, &out) == CUDA_SUCCESS);
  const auto tex = RawGuest::as<proto::RepHandle>(out).handle;
  // Destroying an object one did not make is a no-op that succeeds, as the
  // driver answers for an unknown object: the object lives on.
  CHECK(other.call(0, Op::kTexDestroy, proto::ReqTexObject{other_ctx, tex, 0, 0}) == CUDA_SUCCESS);
  CHECK(other.call(0, Op::kTexQuery, proto::ReqTexObject{other_ctx, tex, 0, proto::kTexQueryResource}) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kTexDestroy, proto::ReqTexObject{ctx, tex, proto::kTexSurface, 0}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kTexDestroy, proto::ReqTexObject{ctx, tex + 1000, 0, 0}) == CUDA_SUCCESS);
  // The resource comes back as the guest's handle, never the driver's.
  REQUIRE(g.call(0, Op::kTexQuery, proto::ReqTexObject{ctx, tex, 0, proto::kTexQueryResource}, &out) == CUDA_SUCCESS);
  CHECK(RawGuest::as<proto::RepTexInfo>(out).res.handle == arr);
  CHECK(g.call(0, Op::kTexDestroy, proto::ReqTexObject{ctx, tex, 0, 0}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kTexQuery, proto::ReqTexObject{ctx, tex, 0, proto::kTexQueryResource}) ==
        CUDA_ERROR_INVALID_VALUE);  // now it is gone

  CHECK(g.call(0, Op::kArrayDestroy, proto::ReqArrayQuery{ctx, mip, proto::kDestroyMipmap, 0}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kArrayQuery, proto::ReqArrayQuery{ctx, level, proto::kArrayQuery3D, 0}) ==
        CUDA_ERROR_INVALID_HANDLE);  // died with its mipmapped array
  CHECK(g.call(0, Op::kArrayDestroy, proto::ReqArrayQuery{ctx, arr, proto::kDestroyArray, 0}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemcpy3D, c) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

TEST_CASE("sparse array maps name only the guest's arrays, memory and devices, and keep mapped memory alive",
          "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock), other(d.sock);
  g.open(0);
  other.open(0);
  const std::uint64_t ctx = primary_ctx(g);
  const std::uint64_t other_ctx = primary_ctx(other);
  std::vector<std::byte> out;
  // A sparse 256x256 float array, a plain one, a mipmapped one; tile pools.
  proto::ReqArrayCreate ac{};
  ac.ctx = ctx;
  ac.desc = proto::ArrayDesc{256, 256, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE, 0};
  ac.kind = proto::kArrayCreate3D;
  REQUIRE(g.call(0, Op::kArrayCreate, ac, &out) == CUDA_SUCCESS);
  const auto arr = RawGuest::as<proto::RepHandle>(out).handle;
  ac.kind = proto::kArrayCreateMipmap;
  ac.levels = 2;
  REQUIRE(g.call(0, Op::kArrayCreate, ac, &out) == CUDA_SUCCESS);
  const auto mip = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kArrayQuery, proto::ReqArrayQuery{ctx, arr, proto::kArrayQuerySparse, 0}, &out) ==
          CUDA_SUCCESS);
  const auto props = RawGuest::as<proto::RepArrayQuery>(out);
  REQUIRE((props.tile_width != 0 && props.tile_width <= 128 && props.tile_height != 0 && props.tile_height <= 128));
  // The kind the guest named: an array's handle is no mipmapped array.
  CHECK(g.call(0, Op::kArrayQuery, proto::ReqArrayQuery{ctx, arr, proto::kArrayQueryMipmapSparse, 0}) ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK(other.call(0, Op::kArrayQuery, proto::ReqArrayQuery{other_ctx, arr, proto::kArrayQuerySparse, 0}) ==
        CUDA_ERROR_INVALID_HANDLE);
  proto::MemProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
  REQUIRE(g.call(0, Op::kMemGranularity, proto::ReqMemGranularity{prop, 0, 0}, &out) == CUDA_SUCCESS);
  const auto gran = static_cast<std::uint64_t>(RawGuest::as<proto::RepValue>(out).value);
  auto create = [&](RawGuest& who) {
    REQUIRE(who.call(0, Op::kMemCreate, proto::ReqMemCreate{prop, gran, 0}, &out) == CUDA_SUCCESS);
    return RawGuest::as<proto::RepHandle>(out).handle;
  };
  auto free_mem = [&]() {
    REQUIRE(g.call(0, Op::kMemGetInfo, proto::ReqCtx{ctx}, &out) == CUDA_SUCCESS);
    return RawGuest::as<proto::RepMemInfo>(out).free;
  };
  const std::uint64_t free_before = free_mem();
  const auto mem = create(g);
  // Another guest's handle: its second (its first has the value of this guest's first).
  const auto theirs_first = create(other);
  const auto theirs = create(other);
  REQUIRE(theirs != mem);
  CHECK(free_mem() == free_before - gran);

  // One entry mapping tile (tx, 0) of `res` onto `m` at `off`.
  auto entry = [&](std::uint64_t res, std::uint64_t m, std::uint32_t tx, std::uint64_t off = 0) {
    proto::ArrayMapEntry e{};
    e.resource = res;
    e.resource_type = CU_RESOURCE_TYPE_ARRAY;
    e.mem_handle = m;
    e.offset = off;
    e.op = m != 0 ? CU_MEM_OPERATION_TYPE_MAP : CU_MEM_OPERATION_TYPE_UNMAP;
    e.mem_handle_type = CU_MEM_HANDLE_TYPE_GENERIC;
    e.device_mask = 1;
    e.subresource_type = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
    const std::uint32_t level[8] = {0, 0, tx * props.tile_width, 0, 0, props.tile_width, props.tile_height, 1};
    std::memcpy(e.subresource, level, sizeof level);
    return e;
  };
  auto map = [&](RawGuest& who, std::uint64_t c, std::vector<proto::ArrayMapEntry> list, std::uint32_t count,
                 std::uint32_t flags = 0, std::uint64_t stream = 0) {
    proto::ReqMapArrays r{c, stream, 0, count, flags};
    return who.call(0, Op::kMemMapArrays, r, nullptr, std::as_bytes(std::span(list)));
  };
  // Reads back tile (tx, 0)'s first row: whether the copy went in (pattern) or was dropped (zero).
  auto tile_row = [&](std::uint32_t tx) {
    std::vector<float> row(props.tile_width);
    for (std::size_t i = 0; i < row.size(); ++i) row[i] = 1.0f + static_cast<float>(i);
    std::memcpy(g.bar.data() + g.l.arena_off, row.data(), row.size() * 4);
    proto::ReqCopy3D c{};
    c.ctx = ctx;
    c.src.type = CU_MEMORYTYPE_HOST;
    c.src.arena_off = g.l.arena_off;
    c.src.pitch = row.size() * 4;
    c.src.height = 1;
    c.dst.type = CU_MEMORYTYPE_ARRAY;
    c.dst.array = arr;
    c.dst.x_bytes = std::uint64_t{tx} * props.tile_width * 4;
    c.width_bytes = row.size() * 4;
    c.height = 1;
    c.depth = 1;
    REQUIRE(g.call(0, Op::kMemcpy3D, c) == CUDA_SUCCESS);
    std::swap(c.src, c.dst);
    c.dst.arena_off = g.l.arena_off + 4096;
    REQUIRE(g.call(0, Op::kMemcpy3D, c) == CUDA_SUCCESS);
    std::vector<float> back(row.size());
    std::memcpy(back.data(), g.bar.data() + g.l.arena_off + 4096, back.size() * 4);
    return back == row;
  };

  CHECK(map(g, ctx, {entry(arr, mem, 0)}, 1) == CUDA_SUCCESS);
  CHECK(tile_row(0));
  CHECK_FALSE(tile_row(1));  // not mapped: the copy's bytes are dropped
  // Forged, other-kind and another guest's handles; a list with one of them maps nothing.
  CHECK(map(g, ctx, {entry(arr ^ 0x100000000ull, mem, 1)}, 1) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(map(g, ctx, {entry(mip, mem, 1)}, 1) == CUDA_ERROR_INVALID_HANDLE);  // a mipmap named as an array
  CHECK(map(g, ctx, {entry(arr, mem ^ 0x100000000ull, 1)}, 1) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(map(g, ctx, {entry(arr, ctx, 1)}, 1) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(map(g, ctx, {entry(arr, theirs, 1)}, 1) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(map(other, other_ctx, {entry(arr, theirs, 1)}, 1) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(map(other, other_ctx, {entry(arr, 0, 0)}, 1) == CUDA_ERROR_INVALID_HANDLE);  // nor unmap theirs
  CHECK(map(g, ctx, {entry(arr, mem, 1, 65536), entry(arr ^ 0x100000000ull, mem, 2)}, 2) ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK_FALSE(tile_row(1));
  CHECK(tile_row(0));  // the unmap of a foreign guest touched nothing
  // Resource types, operations, subresources and device bits it cannot have.
  auto bad = entry(arr, mem, 1);
  bad.resource_type = CU_RESOURCE_TYPE_LINEAR;
  CHECK(map(g, ctx, {bad}, 1) == CUDA_ERROR_INVALID_VALUE);
  bad = entry(arr, mem, 1);
  bad.op = 9;
  CHECK(map(g, ctx, {bad}, 1) == CUDA_ERROR_INVALID_VALUE);
  bad = entry(arr, mem, 1);
  bad.subresource_type = 5;
  CHECK(map(g, ctx, {bad}, 1) == CUDA_ERROR_INVALID_VALUE);
  for (const std::uint32_t mask : {1u << 1, 1u << 7, 1u << 31, 3u}) {
    bad = entry(arr, mem, 1);
    bad.device_mask = mask;
    CHECK(map(g, ctx, {bad}, 1) == CUDA_ERROR_INVALID_VALUE);
  }
  // A map of no memory, or at an offset past the allocation: neither may reach
  // the driver (the H200's crashes on the first).
  bad = entry(arr, mem, 1);
  bad.mem_handle = 0;
  CHECK(map(g, ctx, {bad}, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(g, ctx, {entry(arr, mem, 1, gran)}, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK_FALSE(tile_row(1));
  // Counts that do not fit what was sent, flags it does not know, a forged stream.
  CHECK(map(g, ctx, {entry(arr, mem, 1)}, 2) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(g, ctx, {entry(arr, mem, 1), entry(arr, mem, 2)}, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(g, ctx, {entry(arr, mem, 1)}, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(g, ctx, {entry(arr, mem, 1)}, ~0u) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(g, ctx, {}, proto::kMaxArrayMaps + 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(g, ctx, {entry(arr, mem, 1)}, 1, proto::kMapListNull) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(g, ctx, {entry(arr, mem, 1)}, 1, 1u << 7) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(g, ctx, {entry(arr, mem, 1)}, 1, 0, 0x0400000100000001ull) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(map(g, ctx, {}, 0, proto::kMapListNull) == CUDA_SUCCESS);  // an empty list, as the driver takes it
  // Truncated: the request itself, and an entry cut short.
  proto::ReqMapArrays whole{ctx, 0, 0, 1, 0};
  CHECK(g.send(0, static_cast<std::uint16_t>(Op::kMemMapArrays), &whole, sizeof whole - 8, true) ==
        CUDA_ERROR_INVALID_VALUE);
  const auto one = entry(arr, mem, 1);
  std::vector<std::byte> cut(sizeof whole + sizeof one - 8);
  std::memcpy(cut.data(), &whole, sizeof whole);
  std::memcpy(cut.data() + sizeof whole, &one, sizeof one - 8);
  CHECK(g.send(0, static_cast<std::uint16_t>(Op::kMemMapArrays), cut.data(), cut.size(), true) ==
        CUDA_ERROR_INVALID_VALUE);
  // A list in the arena: inside it only, and not as well as one in the record.
  const std::uint64_t list_off = g.l.arena_off + 8192;
  std::memcpy(g.bar.data() + list_off, &one, sizeof one);
  proto::ReqMapArrays in_arena{ctx, 0, g.l.arena_off + g.l.arena_size - 16, 1, proto::kMapListInArena};
  CHECK(g.call(0, Op::kMemMapArrays, in_arena) == CUDA_ERROR_INVALID_VALUE);
  in_arena.arena_off = ~0ull - 8;
  CHECK(g.call(0, Op::kMemMapArrays, in_arena) == CUDA_ERROR_INVALID_VALUE);
  in_arena.arena_off = list_off;
  in_arena.count = proto::kMaxArrayMaps;
  CHECK(g.call(0, Op::kMemMapArrays, in_arena) == CUDA_ERROR_INVALID_VALUE);  // the arena has no such list
  in_arena.count = 1;
  CHECK(g.call(0, Op::kMemMapArrays, in_arena, nullptr, std::as_bytes(std::span(&one, 1))) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemMapArrays, in_arena) == CUDA_SUCCESS);
  CHECK(tile_row(1));

  // Released while mapped: the handle is gone for the guest, the memory is not.
  CHECK(g.call(0, Op::kMemRelease, proto::ReqHandle{0, mem}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemRelease, proto::ReqHandle{0, mem}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(map(g, ctx, {entry(arr, mem, 2)}, 1) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(g.call(0, Op::kMemGetProperties, proto::ReqHandle{0, mem}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(tile_row(0));
  CHECK(tile_row(1));
  CHECK(free_mem() == free_before - gran);  // (the other guest's memory is its worker's)
  // The first tile out: the second still holds it.
  CHECK(map(g, ctx, {entry(arr, 0, 0)}, 1) == CUDA_SUCCESS);
  CHECK_FALSE(tile_row(0));
  CHECK(tile_row(1));
  CHECK(free_mem() == free_before - gran);
  // The last one out: it goes.
  CHECK(map(g, ctx, {entry(arr, 0, 1)}, 1) == CUDA_SUCCESS);
  CHECK(free_mem() == free_before);
  // Mapped again, released, then the array destroyed: it goes with the array.
  const auto mem2 = create(g);
  CHECK(map(g, ctx, {entry(arr, mem2, 0), entry(arr, mem2, 1, 65536)}, 2) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemRelease, proto::ReqHandle{0, mem2}) == CUDA_SUCCESS);
  CHECK(free_mem() == free_before - gran);
  CHECK(g.call(0, Op::kArrayDestroy, proto::ReqArrayQuery{ctx, arr, proto::kDestroyArray, 0}) == CUDA_SUCCESS);
  CHECK(free_mem() == free_before);
  CHECK(map(g, ctx, {entry(arr, 0, 0)}, 1) == CUDA_ERROR_INVALID_HANDLE);  // the array is gone too
  CHECK(other.call(0, Op::kMemRelease, proto::ReqHandle{0, theirs}) == CUDA_SUCCESS);
  CHECK(other.call(0, Op::kMemRelease, proto::ReqHandle{0, theirs_first}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kArrayDestroy, proto::ReqArrayQuery{ctx, mip, proto::kDestroyMipmap, 0}) == CUDA_SUCCESS);
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

TEST_CASE("pool requests name only the guest's own pools and descriptors it sent", "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock), other(d.sock);
  g.open(0);
  other.open(0);
  const std::uint64_t ctx = primary_ctx(g);
  const std::uint64_t other_ctx = primary_ctx(other);
  std::vector<std::byte> out;
  proto::ReqMemPoolCreate pc{};
  pc.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
  pc.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
  REQUIRE(g.call(0, Op::kMemPoolCreate, pc, &out) == CUDA_SUCCESS);
  const auto pool = RawGuest::as<proto::RepHandle>(out).handle;
  auto pool_req = [](std::uint64_t c, std::uint64_t p, std::uint32_t kind) {
    proto::ReqMemPool r{};
    r.ctx = c;
    r.pool = p;
    r.kind = kind;
    return r;
  };

  // the props' pointer and reserved bytes never reach the driver; a device it was not given
  proto::ReqMemPoolCreate bad = pc;
  bad.win32_attrs = 1;
  CHECK(g.call(0, Op::kMemPoolCreate, bad) == CUDA_ERROR_INVALID_VALUE);
  bad = pc;
  bad.reserved_set = 1;
  CHECK(g.call(0, Op::kMemPoolCreate, bad) == CUDA_ERROR_INVALID_VALUE);
  bad = pc;
  bad.loc_id = 7;
  CHECK(g.call(0, Op::kMemPoolCreate, bad) == CUDA_ERROR_INVALID_DEVICE);
  bad = pc;
  bad.loc_type = CU_MEM_LOCATION_TYPE_HOST;
  CHECK(g.call(0, Op::kMemPoolCreate, bad) == CUDA_ERROR_NOT_SUPPORTED);
  // descriptors: more than it sent, more than any machine has
  proto::MemAccess a{CU_MEM_LOCATION_TYPE_DEVICE, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 0};
  const auto tail = std::as_bytes(std::span(&a, 1));
  CHECK(g.call(0, Op::kMemPoolSetAccess, proto::ReqMemPoolSetAccess{pool, 2, 0}, nullptr, tail) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolSetAccess, proto::ReqMemPoolSetAccess{pool, 1u << 31, 0}, nullptr, tail) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolSetAccess, proto::ReqMemPoolSetAccess{pool, 1, 0}, nullptr, tail) == CUDA_SUCCESS);
  // another guest's pool, a forged one, another kind's handle, an unknown kind
  CHECK(other.call(0, Op::kMemPoolSetAccess, proto::ReqMemPoolSetAccess{pool, 1, 0}, nullptr, tail) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(other.call(0, Op::kMemPool, pool_req(other_ctx, pool, proto::kPoolDestroy)) == CUDA_ERROR_INVALID_VALUE);
  CHECK(other.call(0, Op::kMemAllocAsync, proto::ReqMemAllocAsync{other_ctx, 0, pool, 4096}) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPool, pool_req(ctx, pool ^ 0x100000000ull, proto::kPoolTrim)) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPool, pool_req(ctx, ctx, proto::kPoolTrim)) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPool, pool_req(ctx, pool, 1000)) == CUDA_ERROR_INVALID_VALUE);

  // an allocation outlives its destroyed pool, and is this guest's until freed
  REQUIRE(g.call(0, Op::kMemAllocAsync, proto::ReqMemAllocAsync{ctx, 0, pool, 4096}, &out) == CUDA_SUCCESS);
  const auto ptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  REQUIRE(g.call(0, Op::kMemPool, pool_req(ctx, pool, proto::kPoolDestroy)) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemPool, pool_req(ctx, pool, proto::kPoolDestroy)) == CUDA_ERROR_INVALID_VALUE);  // stale
  CHECK(g.call(0, Op::kMemAllocAsync, proto::ReqMemAllocAsync{ctx, 0, pool, 4096}) == CUDA_ERROR_INVALID_VALUE);
  proto::ReqCopy c{};
  c.ctx = ctx;
  c.dst = ptr;
  c.bytes = 64;
  c.arena_off = g.l.arena_off;
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_SUCCESS);
  CHECK(other.call(0, Op::kMemFreeAsync, proto::ReqFreeAsync{other_ctx, 0, ptr}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemFreeAsync, proto::ReqFreeAsync{ctx, 0, ptr}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);  // freed: no longer its memory
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

namespace {
proto::ReqIpcOpen ipc_open(std::uint64_t ctx, std::uint32_t proc, const std::vector<std::byte>& handle) {
  proto::ReqIpcOpen r{};
  r.ctx = ctx;
  r.flags = CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
  r.proc = proc;
  std::memcpy(r.handle, handle.data(), std::min(handle.size(), sizeof r.handle));
  return r;
}
}  // namespace

TEST_CASE("IPC handles open only in their tenant, and only as the host issued them", "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock), sibling(d.sock);  // two workers of one tenant
  g.open(0);
  sibling.open(0);
  const std::uint64_t ctx = primary_ctx(g);
  const std::uint64_t sctx = primary_ctx(sibling);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 1 << 16, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  constexpr std::uint32_t kExporter = 100, kOtherProc = 200;  // two processes of one VM share a worker

  // Only its own memory, and nothing of the worker's (the arena is not an allocation).
  CHECK(g.call(0, Op::kIpcGetMemHandle, proto::ReqIpcGet{ctx, dptr + (1 << 16), kExporter, 0}) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(sibling.call(0, Op::kIpcGetMemHandle, proto::ReqIpcGet{sctx, dptr, kExporter, 0}) ==
        CUDA_ERROR_INVALID_VALUE);
  REQUIRE(g.call(0, Op::kIpcGetMemHandle, proto::ReqIpcGet{ctx, dptr, kExporter, 0}, &out) == CUDA_SUCCESS);
  const std::vector<std::byte> handle = out;
  REQUIRE(handle.size() == 64);

  // Forged: random bytes, each byte of the ticket flipped, another kind's magic.
  std::vector<std::byte> bad(64);
  for (std::size_t i = 0; i < 64; ++i) bad[i] = static_cast<std::byte>(i * 37 + 11);
  CHECK(sibling.call(0, Op::kIpcOpenMemHandle, ipc_open(sctx, 1, bad)) == CUDA_ERROR_INVALID_HANDLE);
  for (std::size_t i = 0; i < 64; ++i) {
    bad = handle;
    bad[i] ^= std::byte{0x80};
    CHECK(sibling.call(0, Op::kIpcOpenMemHandle, ipc_open(sctx, 1, bad)) == CUDA_ERROR_INVALID_HANDLE);
  }
  CHECK(sibling.call(0, Op::kIpcOpenEventHandle, ipc_open(sctx, 1, handle)) == CUDA_ERROR_INVALID_HANDLE);

  // Another daemon (another tenant) does not know it.
  {
    Daemon d2({}, "-2");
    RawGuest stranger(d2.sock);
    stranger.open(0);
    const std::uint64_t xctx = primary_ctx(stranger);
    CHECK(stranger.call(0, Op::kIpcOpenMemHandle, ipc_open(xctx, 1, handle)) == CUDA_ERROR_INVALID_HANDLE);
  }

  proto::ReqCopy c{};
  c.ctx = ctx;
  c.bytes = 64;
  c.arena_off = g.l.arena_off;
  // Another worker of the tenant: the driver maps it; its range is that guest's memory until closed.
  REQUIRE(sibling.call(0, Op::kIpcOpenMemHandle, ipc_open(sctx, 1, handle), &out) == CUDA_SUCCESS);
  const auto mapped = RawGuest::as<proto::RepRange>(out);
  CHECK(mapped.size == (1u << 16));
  proto::ReqCopy sc = c;
  sc.ctx = sctx;
  sc.arena_off = sibling.l.arena_off;
  sc.dst = mapped.base + 64;
  CHECK(sibling.call(0, Op::kMemcpyHtoDArena, sc) == CUDA_SUCCESS);
  CHECK(sibling.call(0, Op::kMemFree, proto::ReqPtr{sctx, mapped.base}) == CUDA_ERROR_INVALID_VALUE);  // not its allocation
  CHECK(sibling.call(0, Op::kIpcCloseMemHandle, proto::ReqIpcClose{sctx, mapped.base, 2, 0}) ==
        CUDA_ERROR_INVALID_VALUE);  // opened by process 1, not 2
  CHECK(sibling.call(0, Op::kIpcCloseMemHandle, proto::ReqIpcClose{sctx, mapped.base, 1, 0}) == CUDA_SUCCESS);
  CHECK(sibling.call(0, Op::kMemcpyHtoDArena, sc) == CUDA_ERROR_INVALID_VALUE);  // closed: not its memory any more

  // The exporting process itself: refused as the driver refuses it.
  CHECK(g.call(0, Op::kIpcOpenMemHandle, ipc_open(ctx, kExporter, handle)) == CUDA_ERROR_INVALID_CONTEXT);
  // Another process served by the same worker (a VM): the allocation itself.
  REQUIRE(g.call(0, Op::kIpcOpenMemHandle, ipc_open(ctx, kOtherProc, handle), &out) == CUDA_SUCCESS);
  CHECK(RawGuest::as<proto::RepRange>(out).base == dptr);
  // Its owner frees it: gone from the registry, alive for the opener until the last close.
  REQUIRE(g.call(0, Op::kMemFree, proto::ReqPtr{ctx, dptr}) == CUDA_SUCCESS);
  CHECK(sibling.call(0, Op::kIpcOpenMemHandle, ipc_open(sctx, 1, handle)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(g.call(0, Op::kIpcGetMemHandle, proto::ReqIpcGet{ctx, dptr, kExporter, 0}) ==
        CUDA_ERROR_INVALID_VALUE);  // freed by its owner: no memory of the guest's to export
  c.dst = dptr;
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemFree, proto::ReqPtr{ctx, dptr}) == CUDA_ERROR_INVALID_VALUE);  // freed already
  CHECK(g.call(0, Op::kIpcCloseMemHandle, proto::ReqIpcClose{ctx, dptr, kOtherProc, 0}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);  // the last close freed it

  // Events: only interprocess events export; a sibling process of the worker gets a second
  // handle of the same event, and each handle is destroyed on its own.
  REQUIRE(g.call(0, Op::kEventCreate, proto::ReqEventCreate{ctx, CU_EVENT_DISABLE_TIMING, 0}, &out) == CUDA_SUCCESS);
  const auto plain = RawGuest::as<proto::RepHandle>(out).handle;
  CHECK(g.call(0, Op::kIpcGetEventHandle, proto::ReqIpcGet{ctx, plain, kExporter, 0}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(sibling.call(0, Op::kIpcGetEventHandle, proto::ReqIpcGet{sctx, plain, kExporter, 0}) ==
        CUDA_ERROR_INVALID_HANDLE);  // not the sibling's event
  REQUIRE(g.call(0, Op::kEventCreate,
                 proto::ReqEventCreate{ctx, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS, 0}, &out) ==
          CUDA_SUCCESS);
  const auto ev = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kIpcGetEventHandle, proto::ReqIpcGet{ctx, ev, kExporter, 0}, &out) == CUDA_SUCCESS);
  const std::vector<std::byte> ehandle = out;
  CHECK(sibling.call(0, Op::kIpcOpenMemHandle, ipc_open(sctx, 1, ehandle)) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(sibling.call(0, Op::kIpcOpenEventHandle, ipc_open(sctx, 1, ehandle), &out) == CUDA_SUCCESS);
  const auto sev = RawGuest::as<proto::RepHandle>(out).handle;
  CHECK(sibling.call(0, Op::kEventRecord, proto::ReqEventRecord{sctx, sev, 0}) == CUDA_SUCCESS);
  CHECK(sibling.call(0, Op::kEventDestroy, proto::ReqHandle{sctx, sev}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kIpcOpenEventHandle, ipc_open(ctx, kExporter, ehandle)) == CUDA_ERROR_INVALID_CONTEXT);
  REQUIRE(g.call(0, Op::kIpcOpenEventHandle, ipc_open(ctx, kOtherProc, ehandle), &out) == CUDA_SUCCESS);
  const auto alias = RawGuest::as<proto::RepHandle>(out).handle;
  CHECK(alias != ev);
  CHECK(g.call(0, Op::kEventDestroy, proto::ReqHandle{ctx, ev}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kEventRecord, proto::ReqEventRecord{ctx, alias, 0}) == CUDA_SUCCESS);  // still alive
  CHECK(g.call(0, Op::kEventQuery, proto::ReqHandle{ctx, alias}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kEventDestroy, proto::ReqHandle{ctx, alias}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kEventQuery, proto::ReqHandle{ctx, alias}) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(sibling.call(0, Op::kIpcOpenEventHandle, ipc_open(sctx, 1, ehandle)) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

namespace {
proto::ReqPoolImport pool_import(const proto::RepShareToken& t, std::uint32_t proc) {
  proto::ReqPoolImport r{};
  std::memcpy(r.token, t.token, sizeof r.token);
  r.handle_type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  r.proc = proc;
  return r;
}
proto::ReqPoolPtrImport ptr_import(std::uint64_t ctx, std::uint64_t pool, std::uint32_t proc,
                                   const std::vector<std::byte>& data) {
  proto::ReqPoolPtrImport r{};
  r.ctx = ctx;
  r.pool = pool;
  r.proc = proc;
  std::memcpy(r.data, data.data(), std::min(data.size(), sizeof r.data));
  return r;
}
}  // namespace

TEST_CASE("pool exports import only in their tenant, only as the host issued them, only into imported pools",
          "[process][hostile][pools]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock), sibling(d.sock);  // two workers of one tenant
  g.open(0);
  sibling.open(0);
  const std::uint64_t ctx = primary_ctx(g);
  const std::uint64_t sctx = primary_ctx(sibling);
  std::vector<std::byte> out;
  constexpr std::uint32_t kFd = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  constexpr std::uint32_t kExporter = 100, kOtherProc = 200;  // two processes of one VM share a worker
  auto make_pool = [&](std::uint32_t types) {
    proto::ReqMemPoolCreate pc{};
    pc.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
    pc.handle_types = types;
    pc.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
    REQUIRE(g.call(0, Op::kMemPoolCreate, pc, &out) == CUDA_SUCCESS);
    return RawGuest::as<proto::RepHandle>(out).handle;
  };
  auto alloc = [&](std::uint64_t pool, std::uint64_t bytes) {
    REQUIRE(g.call(0, Op::kMemAllocAsync, proto::ReqMemAllocAsync{ctx, 0, pool, bytes}, &out) == CUDA_SUCCESS);
    return RawGuest::as<proto::RepMemAlloc>(out).dptr;
  };
  auto pool_req = [](std::uint64_t c, std::uint64_t p, std::uint32_t kind) {
    proto::ReqMemPool r{};
    r.ctx = c;
    r.pool = p;
    r.kind = kind;
    return r;
  };
  const auto pool = make_pool(kFd), other = make_pool(kFd), plain = make_pool(0);
  const auto ptr = alloc(pool, 1 << 16), optr = alloc(other, 4096), pptr = alloc(plain, 4096);

  // Export: only its own pools and memory, only what the driver would export.
  CHECK(sibling.call(0, Op::kMemPoolExport, proto::ReqPoolExport{pool, 0, kFd, 1}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolExport, proto::ReqPoolExport{pool ^ 0x100000000ull, 0, kFd, kExporter}) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolExport, proto::ReqPoolExport{plain, 0, kFd, kExporter}) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(g.call(0, Op::kMemPoolExport, proto::ReqPoolExport{pool, 0, kFd, kExporter}, &out) == CUDA_SUCCESS);
  const auto token = RawGuest::as<proto::RepShareToken>(out);
  REQUIRE(g.call(0, Op::kMemPoolExport, proto::ReqPoolExport{pool, 0, kFd, kExporter}, &out) == CUDA_SUCCESS);
  CHECK(std::memcmp(RawGuest::as<proto::RepShareToken>(out).token, token.token, sizeof token.token) == 0);
  CHECK(sibling.call(0, Op::kMemPoolExportPtr, proto::ReqPoolPtr{sctx, ptr, 1, 0}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolExportPtr, proto::ReqPoolPtr{ctx, pptr, kExporter, 0}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolExportPtr, proto::ReqPoolPtr{ctx, ptr + (1 << 16), kExporter, 0}) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolExportPtr, proto::ReqPoolPtr{ctx, g.l.arena_off, kExporter, 0}) ==
        CUDA_ERROR_INVALID_VALUE);
  REQUIRE(g.call(0, Op::kMemPoolExportPtr, proto::ReqPoolPtr{ctx, ptr, kExporter, 0}, &out) == CUDA_SUCCESS);
  const std::vector<std::byte> ticket = out;
  REQUIRE(ticket.size() == 64);
  REQUIRE(g.call(0, Op::kMemPoolExportPtr, proto::ReqPoolPtr{ctx, ptr, kExporter, 0}, &out) == CUDA_SUCCESS);
  CHECK(out == ticket);  // exported again: the same data
  // The driver exports pointers only of a pool that was exported itself.
  CHECK(g.call(0, Op::kMemPoolExportPtr, proto::ReqPoolPtr{ctx, optr, kExporter, 0}) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(g.call(0, Op::kMemPoolExport, proto::ReqPoolExport{other, 0, kFd, kExporter}) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kMemPoolExportPtr, proto::ReqPoolPtr{ctx, optr, kExporter, 0}, &out) == CUDA_SUCCESS);
  const std::vector<std::byte> other_ticket = out;

  // Pool tokens: forged ones, none at all, another handle type get the
  // driver's answer for an fd that is no exported pool (the double's: INVALID_VALUE).
  for (std::size_t i = 0; i < sizeof token.token; ++i) {
    auto bad = pool_import(token, 1);
    bad.token[i] ^= 0x40;
    CHECK(sibling.call(0, Op::kMemPoolImport, bad) == CUDA_ERROR_INVALID_VALUE);
  }
  auto none = pool_import(token, 1);
  none.no_token = 1;
  CHECK(sibling.call(0, Op::kMemPoolImport, none) == CUDA_ERROR_INVALID_VALUE);
  auto fabric = pool_import(token, 1);
  fabric.handle_type = CU_MEM_HANDLE_TYPE_FABRIC;
  CHECK(sibling.call(0, Op::kMemPoolImport, fabric) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(sibling.call(0, Op::kMemPoolImport, pool_import(token, 1), &out) == CUDA_SUCCESS);
  const auto spool = RawGuest::as<proto::RepHandle>(out).handle;
  // An imported pool hands out nothing.
  CHECK(sibling.call(0, Op::kMemAllocAsync, proto::ReqMemAllocAsync{sctx, 0, spool, 4096}) ==
        CUDA_ERROR_INVALID_VALUE);

  // Pointer tickets: only into an imported pool, only exactly as issued, only of that pool.
  CHECK(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, spool ^ 0x100000000ull, 1, ticket)) ==
        CUDA_ERROR_INVALID_VALUE);
  proto::ReqMemPoolCreate pc{};
  pc.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
  pc.handle_types = kFd;
  pc.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
  REQUIRE(sibling.call(0, Op::kMemPoolCreate, pc, &out) == CUDA_SUCCESS);
  const auto sown = RawGuest::as<proto::RepHandle>(out).handle;
  CHECK(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, sown, 1, ticket)) == CUDA_ERROR_INVALID_VALUE);
  auto def = pool_req(sctx, 0, proto::kPoolGetDefault);
  REQUIRE(sibling.call(0, Op::kMemPool, def, &out) == CUDA_SUCCESS);
  const auto sdefault = static_cast<std::uint64_t>(RawGuest::as<proto::RepValue>(out).value);
  CHECK(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, sdefault, 1, ticket)) == CUDA_ERROR_INVALID_VALUE);
  for (std::size_t i = 0; i < ticket.size(); ++i) {
    auto bad = ticket;
    bad[i] ^= std::byte{0x80};
    CHECK(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, spool, 1, bad)) == CUDA_ERROR_INVALID_VALUE);
  }
  CHECK(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, spool, 1, other_ticket)) ==
        CUDA_ERROR_INVALID_VALUE);  // another pool's pointer: the driver's answer
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 4096, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto plain_mem = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  REQUIRE(g.call(0, Op::kIpcGetMemHandle, proto::ReqIpcGet{ctx, plain_mem, kExporter, 0}, &out) == CUDA_SUCCESS);
  const std::vector<std::byte> ipc_handle = out;
  CHECK(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, spool, 1, ipc_handle)) == CUDA_ERROR_INVALID_VALUE);
  CHECK(sibling.call(0, Op::kIpcOpenMemHandle, ipc_open(sctx, 1, ticket)) == CUDA_ERROR_INVALID_HANDLE);

  // Another daemon (another tenant) knows neither the pool nor the pointer.
  {
    Daemon d2({}, "-pool");
    RawGuest stranger(d2.sock);
    stranger.open(0);
    const std::uint64_t xctx = primary_ctx(stranger);
    CHECK(stranger.call(0, Op::kMemPoolImport, pool_import(token, 1)) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(stranger.call(0, Op::kMemPoolCreate, pc, &out) == CUDA_SUCCESS);
    const auto xpool = RawGuest::as<proto::RepHandle>(out).handle;
    REQUIRE(stranger.call(0, Op::kMemPoolExport, proto::ReqPoolExport{xpool, 0, kFd, 1}, &out) == CUDA_SUCCESS);
    REQUIRE(stranger.call(0, Op::kMemPoolImport, pool_import(RawGuest::as<proto::RepShareToken>(out), 1), &out) ==
            CUDA_SUCCESS);
    const auto ximported = RawGuest::as<proto::RepHandle>(out).handle;
    CHECK(stranger.call(0, Op::kMemPoolImportPtr, ptr_import(xctx, ximported, 1, ticket)) ==
          CUDA_ERROR_INVALID_VALUE);
  }

  // Another worker imports it: the driver maps it, and it is that guest's memory until it frees it.
  // One free ends it: none of the refused imports above counted.
  REQUIRE(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, spool, 1, ticket), &out) == CUDA_SUCCESS);
  const auto mapped = RawGuest::as<proto::RepRange>(out);
  CHECK(mapped.size == (1u << 16));
  proto::ReqCopy sc{};
  sc.ctx = sctx;
  sc.bytes = 64;
  sc.arena_off = sibling.l.arena_off;
  sc.dst = mapped.base + 64;
  CHECK(sibling.call(0, Op::kMemcpyHtoDArena, sc) == CUDA_SUCCESS);
  CHECK(sibling.call(0, Op::kMemFree, proto::ReqPtr{sctx, mapped.base}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(sibling.call(0, Op::kMemFreeAsync, proto::ReqFreeAsync{sctx, 0, mapped.base}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(sibling.call(0, Op::kMemPoolPtrFree, proto::ReqPoolPtrFree{sctx, 0, mapped.base, 2, 0}) ==
        CUDA_ERROR_INVALID_VALUE);  // imported by process 1, not 2
  CHECK(sibling.call(0, Op::kMemPoolPtrFree, proto::ReqPoolPtrFree{sctx, 0x0400000100000009ull, mapped.base, 1, 1}) ==
        CUDA_ERROR_INVALID_HANDLE);  // a stream it does not have
  CHECK(sibling.call(0, Op::kMemPoolPtrFree, proto::ReqPoolPtrFree{sctx, 0, mapped.base, 1, 1}) == CUDA_SUCCESS);
  CHECK(sibling.call(0, Op::kMemcpyHtoDArena, sc) == CUDA_ERROR_INVALID_VALUE);  // freed: not its memory any more
  CHECK(sibling.call(0, Op::kMemPoolPtrFree, proto::ReqPoolPtrFree{sctx, 0, mapped.base, 1, 0}) ==
        CUDA_ERROR_INVALID_VALUE);

  // One worker, two guest processes (a VM). The exporting process itself: the driver's answer
  // (the double imports its own pool); another process: an alias of the pool, and the
  // allocation itself.
  REQUIRE(g.call(0, Op::kMemPoolImport, pool_import(token, kExporter), &out) == CUDA_SUCCESS);
  const auto self = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kMemPoolImport, pool_import(token, kOtherProc), &out) == CUDA_SUCCESS);
  const auto alias = RawGuest::as<proto::RepHandle>(out).handle;
  CHECK(alias != pool);
  CHECK(g.call(0, Op::kMemAllocAsync, proto::ReqMemAllocAsync{ctx, 0, alias, 4096}) == CUDA_ERROR_INVALID_VALUE);
  auto set_current = pool_req(ctx, alias, proto::kPoolSetCurrent);
  CHECK(g.call(0, Op::kMemPool, set_current) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolExport, proto::ReqPoolExport{alias, 0, kFd, kOtherProc}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolImportPtr, ptr_import(ctx, alias, kExporter, ticket)) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPoolImportPtr, ptr_import(ctx, alias, kOtherProc, other_ticket)) ==
        CUDA_ERROR_INVALID_VALUE);  // a pointer of another pool
  REQUIRE(g.call(0, Op::kMemPoolImportPtr, ptr_import(ctx, self, kExporter, ticket), &out) == CUDA_SUCCESS);
  const auto own_import = RawGuest::as<proto::RepRange>(out);
  CHECK(g.call(0, Op::kMemPoolPtrFree, proto::ReqPoolPtrFree{ctx, 0, own_import.base, kExporter, 0}) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kMemPoolImportPtr, ptr_import(ctx, alias, kOtherProc, ticket), &out) == CUDA_SUCCESS);
  CHECK(RawGuest::as<proto::RepRange>(out).base == ptr);
  // Its owner frees it: gone from the registry, alive for the importer until its free.
  proto::ReqCopy c{};
  c.ctx = ctx;
  c.bytes = 64;
  c.arena_off = g.l.arena_off;
  c.dst = ptr;
  REQUIRE(g.call(0, Op::kMemFreeAsync, proto::ReqFreeAsync{ctx, 0, ptr}) == CUDA_SUCCESS);
  CHECK(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, spool, 1, ticket)) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemFreeAsync, proto::ReqFreeAsync{ctx, 0, ptr}) == CUDA_ERROR_INVALID_VALUE);  // freed already
  CHECK(g.call(0, Op::kMemPoolPtrFree, proto::ReqPoolPtrFree{ctx, 0, ptr, kOtherProc, 0}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);  // the last import's free freed it

  // A destroyed pool's exported pointers are withdrawn (its allocations stay the owner's).
  REQUIRE(g.call(0, Op::kMemPoolExport, proto::ReqPoolExport{other, 0, kFd, kExporter}, &out) == CUDA_SUCCESS);
  REQUIRE(sibling.call(0, Op::kMemPoolImport, pool_import(RawGuest::as<proto::RepShareToken>(out), 1), &out) ==
          CUDA_SUCCESS);
  const auto sother = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, sother, 1, other_ticket), &out) == CUDA_SUCCESS);
  CHECK(sibling.call(0, Op::kMemPoolPtrFree, proto::ReqPoolPtrFree{sctx, 0, RawGuest::as<proto::RepRange>(out).base,
                                                                   1, 0}) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kMemPool, pool_req(ctx, other, proto::kPoolDestroy)) == CUDA_SUCCESS);
  CHECK(sibling.call(0, Op::kMemPoolImportPtr, ptr_import(sctx, sother, 1, other_ticket)) == CUDA_ERROR_INVALID_VALUE);
  c.dst = optr;
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemFreeAsync, proto::ReqFreeAsync{ctx, 0, optr}) == CUDA_SUCCESS);
  // Destroying the pool leaves the alias a sibling process imported usable, until it goes too.
  REQUIRE(g.call(0, Op::kMemPool, pool_req(ctx, pool, proto::kPoolDestroy)) == CUDA_SUCCESS);
  auto get = pool_req(ctx, alias, proto::kPoolGetAttr);
  get.attr = CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
  CHECK(g.call(0, Op::kMemPool, get) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemPool, pool_req(ctx, alias, proto::kPoolDestroy)) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemPool, get) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kMemPool, pool_req(ctx, self, proto::kPoolDestroy)) == CUDA_SUCCESS);
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

namespace {
// GraphAddNode's request: deps, then the parameters and their tail.
std::vector<std::byte> add_node_tail(std::span<const std::uint64_t> deps, const proto::GraphNodeParams& p,
                                     std::span<const std::byte> extra = {}) {
  std::vector<std::byte> t(deps.size_bytes() + sizeof p + extra.size());
  if (!deps.empty()) std::memcpy(t.data(), deps.data(), deps.size_bytes());
  std::memcpy(t.data() + deps.size_bytes(), &p, sizeof p);
  if (!extra.empty()) std::memcpy(t.data() + deps.size_bytes() + sizeof p, extra.data(), extra.size());
  return t;
}
}  // namespace

TEST_CASE("graph requests naming what the guest does not own are refused", "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock), other(d.sock);
  g.open(0);
  other.open(0);
  const std::uint64_t ctx = primary_ctx(g);
  const std::uint64_t other_ctx = primary_ctx(other);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kGraphCreate, proto::ReqGraphCreate{ctx, 0, 0}, &out) == CUDA_SUCCESS);
  const auto graph = RawGuest::as<proto::RepHandle>(out).handle;
  proto::GraphNodeParams empty{};
  empty.type = CU_GRAPH_NODE_TYPE_EMPTY;
  REQUIRE(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, &out, add_node_tail({}, empty)) ==
          CUDA_SUCCESS);
  const auto node = RawGuest::as<proto::RepHandle>(out).handle;

  // another guest can name neither the graph nor the node
  CHECK(other.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{other_ctx, graph, 0, 0}, nullptr,
                   add_node_tail({}, empty)) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(other.call(0, Op::kGraphCreate, proto::ReqGraphCreate{other_ctx, 0, 0}, &out) == CUDA_SUCCESS);
  const auto other_graph = RawGuest::as<proto::RepHandle>(out).handle;
  const std::uint64_t deps[] = {node};
  CHECK(other.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{other_ctx, other_graph, 1, 0}, nullptr,
                   add_node_tail(deps, empty)) == CUDA_ERROR_INVALID_VALUE);
  CHECK(other.call(0, Op::kGraphQuery, proto::ReqGraphQuery{other_ctx, node, 0, 0, proto::kQueryType, 0}) ==
        CUDA_ERROR_INVALID_VALUE);
  // more dependencies declared than sent; a forged node handle
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 3, 0}, nullptr, add_node_tail(deps, empty)) ==
        CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t forged[] = {node ^ 0x100000000ull};
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 1, 0}, nullptr, add_node_tail(forged, empty)) ==
        CUDA_ERROR_INVALID_VALUE);

  // memory it does not own: a memset anywhere, a copy from outside the arena or past it
  proto::GraphNodeParams ms{};
  ms.type = CU_GRAPH_NODE_TYPE_MEMSET;
  ms.dst = 0x10000;
  ms.width = 16;
  ms.height = 1;
  ms.elem_size = 4;
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, ms)) ==
        CUDA_ERROR_INVALID_VALUE);
  // the worker's own memory, which the double takes here as a driver with HMM would
  const std::uint64_t bar = worker_bar(g);
  ms.dst = worker_rings(g, bar);
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, ms)) ==
        CUDA_ERROR_INVALID_VALUE);
  proto::GraphNodeParams dev{};
  dev.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  dev.src.type = CU_MEMORYTYPE_DEVICE;
  dev.src.addr = bar;
  dev.dst_copy.type = CU_MEMORYTYPE_HOST;
  dev.dst_copy.addr = g.l.arena_off;
  dev.width_bytes = 64;
  dev.copy_height = 1;
  dev.depth = 1;
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, dev)) ==
        CUDA_ERROR_INVALID_VALUE);
  proto::GraphNodeParams cp{};
  cp.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  cp.src.type = CU_MEMORYTYPE_HOST;
  cp.src.addr = 0;  // the superblock, not the arena
  cp.dst_copy.type = CU_MEMORYTYPE_HOST;
  cp.dst_copy.addr = g.l.arena_off;
  cp.width_bytes = 64;
  cp.copy_height = 1;
  cp.depth = 1;
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, cp)) ==
        CUDA_ERROR_INVALID_VALUE);
  cp.src.addr = g.l.arena_off + g.l.arena_size - 32;  // runs off the arena's end
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, cp)) ==
        CUDA_ERROR_INVALID_VALUE);
  cp.src.addr = g.l.arena_off;  // an extent that overflows
  cp.src.pitch = 1ull << 40;
  cp.src.height = 1ull << 40;
  cp.src.z = 1ull << 30;
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, cp)) ==
        CUDA_ERROR_INVALID_VALUE);
  // a host node's words misaligned or outside the arena; a free of memory no graph allocated
  proto::GraphNodeParams hn{};
  hn.type = CU_GRAPH_NODE_TYPE_HOST;
  hn.dst = g.l.arena_off + 2;
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, hn)) ==
        CUDA_ERROR_INVALID_VALUE);
  hn.dst = 8;
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, hn)) ==
        CUDA_ERROR_INVALID_VALUE);
  proto::GraphNodeParams fr{};
  fr.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  fr.dst = 0x10000;
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, fr)) ==
        CUDA_ERROR_INVALID_VALUE);
  // a kernel node of a function it never looked up
  proto::GraphNodeParams k{};
  k.type = CU_GRAPH_NODE_TYPE_KERNEL;
  k.handle = (std::uint64_t{static_cast<std::uint8_t>(proto::HandleKind::kFunction)} << 56) | 5;
  CHECK(g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, add_node_tail({}, k)) ==
        CUDA_ERROR_INVALID_HANDLE);

  // lists longer than a reply, edges whose arrays do not match the count
  CHECK(g.call(0, Op::kGraphQuery,
               proto::ReqGraphQuery{ctx, graph, 0, 1ull << 40, proto::kQueryNodes, proto::kQueryArrays}) ==
        CUDA_ERROR_NOT_SUPPORTED);
  std::vector<std::byte> edge(24);
  CHECK(g.call(0, Op::kGraphEdges, proto::ReqGraphEdges{ctx, graph, 2, 0}, nullptr, edge) == CUDA_ERROR_INVALID_VALUE);
  // a user object released more often than it was retained
  proto::ReqUserObject uo{};
  uo.ctx = ctx;
  uo.off = g.l.arena_off + g.l.arena_size - 8;
  uo.count = 1;
  uo.flags = CU_USER_OBJECT_NO_DESTRUCTOR_SYNC;
  uo.kind = proto::kUserObjCreate;
  REQUIRE(g.call(0, Op::kUserObject, uo, &out) == CUDA_SUCCESS);
  uo.object = RawGuest::as<proto::RepHandle>(out).handle;
  uo.kind = proto::kUserObjRelease;
  uo.count = 2;
  CHECK(g.call(0, Op::kUserObject, uo) == CUDA_ERROR_INVALID_VALUE);
  // Another guest's worker knows neither the context nor the object (handle
  // generations start at random per worker).
  CHECK(other.call(0, Op::kUserObject, uo) == CUDA_ERROR_INVALID_CONTEXT);
  uo.count = 1;
  CHECK(g.call(0, Op::kUserObject, uo) == CUDA_SUCCESS);

  CHECK(g.call(0, Op::kGraphDestroy, proto::ReqHandle{ctx, graph}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kGraphQuery, proto::ReqGraphQuery{ctx, node, 0, 0, proto::kQueryType, 0}) ==
        CUDA_ERROR_INVALID_VALUE);  // went with its graph
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

TEST_CASE("stream memory operations wait on and write only the guest's own memory", "[process][hostile]") {
  Strays strays;
  Daemon d;
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, 1, 0, 0, {}}, &out) == CUDA_SUCCESS);
  const auto arena_dev = RawGuest::as<proto::RepHello>(out).arena_device_base + g.l.arena_off;
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 4096, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  const auto ops = [&](std::vector<proto::MemOp> v, std::uint32_t single = 0, std::uint32_t count = 0) {
    proto::ReqStreamMemOps r{ctx, 0, count != 0 ? count : static_cast<std::uint32_t>(v.size()), 0, single, 0};
    return g.call(0, Op::kStreamMemOps, r, nullptr, std::as_bytes(std::span(v)));
  };
  const proto::MemOp write{CU_STREAM_MEM_OP_WRITE_VALUE_32, 0, dptr, 7};
  CHECK(ops({write}, 1) == CUDA_SUCCESS);
  CHECK(ops({proto::MemOp{CU_STREAM_MEM_OP_WRITE_VALUE_64, 0, arena_dev + 64, 9}}, 1) == CUDA_SUCCESS);
  // Someone else's memory, the end of the allocation, an unknown operation.
  CHECK(ops({proto::MemOp{CU_STREAM_MEM_OP_WRITE_VALUE_32, 0, dptr ^ 0x100000000ull, 7}}, 1) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(ops({write, proto::MemOp{CU_STREAM_MEM_OP_WRITE_VALUE_64, 0, dptr + 4092, 7}}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(ops({proto::MemOp{CU_STREAM_MEM_OP_WAIT_VALUE_64, 0, arena_dev + g.l.arena_size - 4, 1}}, 1) ==
        CUDA_ERROR_INVALID_VALUE);
  // The worker's own memory below the arena, which the double takes here as a
  // driver with HMM would (a wait for >= 0 the word satisfies at once).
  CHECK(ops({proto::MemOp{CU_STREAM_MEM_OP_WAIT_VALUE_32, 0, arena_dev - 4, 0}}, 1) == CUDA_ERROR_INVALID_VALUE);
  const auto rings = worker_rings(g, arena_dev - g.l.arena_off);
  CHECK(ops({proto::MemOp{CU_STREAM_MEM_OP_WRITE_VALUE_32, 0, rings, 7}}, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(ops({write, proto::MemOp{CU_STREAM_MEM_OP_WRITE_VALUE_64, 0, rings + 8, 7}}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(ops({proto::MemOp{99, 0, dptr, 1}}) == CUDA_ERROR_INVALID_VALUE);
  // Counts that disagree with the operations sent, or a "single" batch.
  CHECK(ops({write}, 0, 2) == CUDA_ERROR_INVALID_VALUE);
  CHECK(ops({write, write}, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(ops(std::vector<proto::MemOp>(proto::kMaxMemOps + 1, write)) == CUDA_ERROR_INVALID_VALUE);
  CHECK(ops({}, 0, 0) == CUDA_ERROR_INVALID_VALUE);
  // The worker still serves, and the allocation holds what the valid write put there.
  proto::ReqCopy c{};
  c.ctx = ctx;
  c.src = dptr;
  c.bytes = 4;
  c.arena_off = g.l.arena_off;
  CHECK(g.call(0, Op::kMemcpyDtoHArena, c) == CUDA_SUCCESS);
  std::uint32_t v = 0;
  std::memcpy(&v, g.bar.data() + g.l.arena_off, 4);
  CHECK(v == 7);
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

TEST_CASE("a stream's access-policy window covers only the guest's own memory", "[process][hostile]") {
  Strays strays;
  Daemon d;
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, 1, 0, 0, {}}, &out) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 4096, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  const auto window = [&](std::uint64_t base, std::size_t bytes) {
    proto::ReqStreamAttr r{};
    r.ctx = ctx;
    r.kind = proto::kKernelAttrSet;
    r.attr = CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW;
    CUstreamAttrValue v{};
    v.accessPolicyWindow.base_ptr = reinterpret_cast<void*>(base);
    v.accessPolicyWindow.num_bytes = bytes;
    v.accessPolicyWindow.hitRatio = 1.0f;
    std::memcpy(r.value, &v, sizeof r.value);
    return g.call(0, Op::kStreamAttr, r);
  };
  CHECK(window(dptr, 4096) == CUDA_SUCCESS);
  CHECK(window(dptr, 4097) == CUDA_ERROR_INVALID_VALUE);
  CHECK(window(dptr ^ 0x100000000ull, 64) == CUDA_ERROR_INVALID_VALUE);
  CHECK(window(worker_bar(g), 64) == CUDA_ERROR_INVALID_VALUE);  // the worker's own memory
  CHECK(window(0, 0) == CUDA_SUCCESS);  // clears it
  // Event-bearing launch attributes are no stream attributes; unknown kinds and streams are refused.
  proto::ReqStreamAttr r{};
  r.ctx = ctx;
  r.kind = proto::kKernelAttrGet;
  r.attr = CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT;
  CHECK(g.call(0, Op::kStreamAttr, r) == CUDA_ERROR_INVALID_VALUE);
  r.attr = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  r.kind = 7;
  CHECK(g.call(0, Op::kStreamAttr, r) == CUDA_ERROR_INVALID_VALUE);
  r.kind = proto::kKernelAttrGet;
  r.stream = 0xdead;
  CHECK(g.call(0, Op::kStreamAttr, r) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

// Warm workers (--warm-workers): a connection's process started before its
// guest, with the worker as its child. A process-mode guest is served by that
// worker; every such process holds its own guest's memory and nobody
// else's; a VM (channels of pids that are not the peer's) lets the worker go
// and gets a worker per process, as without warm workers.
TEST_CASE("warm workers serve a guest at once, hold only their guest's memory, and step aside for a VM",
          "[process][hostile]") {
  Strays strays;
  Daemon d({"--warm-workers", "1", "--vm-spare-workers", "0"}, "-warm");
  REQUIRE(d.alive());
  // The entry and its worker start on their own.
  auto wait_for = [](auto&& pred) {
    for (int i = 0; i < 500 && !pred(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return pred();
  };
  REQUIRE(wait_for([&] {
    const auto c = d.workers();
    return c.size() == 1 && Daemon::children_of(c[0]).size() == 1;
  }));
  const pid_t entry = d.workers()[0];
  const pid_t worker = Daemon::children_of(entry)[0];
  CHECK(guest_memfds(entry) == 1);
  CHECK(guest_memfds(worker) == 1);

  RawGuest g(d.sock);
  g.open(0);
  std::vector<std::byte> out;
  const proto::ReqHello hello{proto::kProtoVersion, static_cast<std::uint32_t>(::getpid()), 0, 0, {}};
  REQUIRE(g.call(0, Op::kHello, hello, &out) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
  // Served by the worker started ahead, still under its entry's process;
  // another entry starts for the next guest.
  CHECK(Daemon::children_of(entry) == std::vector<pid_t>{worker});
  REQUIRE(wait_for([&] {
    const auto c = d.workers();
    return c.size() == 2 && Daemon::children_of(c[0] == entry ? c[1] : c[0]).size() == 1;
  }));
  for (const pid_t p : d.workers()) {
    CHECK(guest_memfds(p) == 1);
    for (const pid_t w : Daemon::children_of(p)) CHECK(guest_memfds(w) == 1);
  }

  // A VM takes the next entry: the worker started ahead goes, and each guest
  // process gets one of its own.
  RawGuest vm(d.sock);
  const pid_t a = ::getpid() + 100000;
  vm.open(0, a);
  REQUIRE(vm.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, static_cast<std::uint32_t>(a), 0, 0, {}},
                  &out) == CUDA_SUCCESS);
  REQUIRE(vm.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  // The first guest is still served.
  CHECK(g.call(0, Op::kCtxSynchronize, proto::ReqCtx{ctx}) == CUDA_SUCCESS);
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

// Pageable copies' chunks in a channel's staging area (docs/shm-abi.md,
// "Staged copies"): the channel's counter counts each once, in the order they
// were posted, whatever became of them (a guest waits on it); a call among
// them is answered once they are done. A small DtoH's reply carries the
// guest's own memory and nothing else.
TEST_CASE("staged chunks are counted in order whatever becomes of them, and inline DtoH replies hold only "
          "the guest's memory",
          "[process][hostile]") {
  Strays strays;
  Daemon d;
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, 1, 0, 0, {}}, &out) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 16384, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  const std::uint64_t slot = ring::staging_off(g.l, 0);
  const auto counted = [&, base = ring::staging_done(g.bar.data(), g.l, 0)] {
    return ring::staging_done(g.bar.data(), g.l, 0) - base;
  };
  std::vector<std::byte> pattern(proto::kInlineCopyMax);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>(i * 7 + 1);
  std::memcpy(g.bar.data() + slot, pattern.data(), pattern.size());

  proto::ReqCopy c{};
  c.ctx = ctx;
  c.dst = dptr;
  c.bytes = pattern.size();
  c.arena_off = slot;
  g.post(0, Op::kMemcpyHtoDArena, c);  // 1: good
  auto bad = c;
  bad.dst = dptr ^ 0x100000000ull;     // 2: someone else's memory
  g.post(0, Op::kMemcpyHtoDArena, bad);
  bad = c;
  bad.bytes = 0;                       // 3: empty
  g.post(0, Op::kMemcpyHtoDArena, bad);
  bad = c;
  bad.flags = proto::kAsync;
  bad.stream = 0x0400000100000009ull;  // 4: a stream never handed out
  g.post(0, Op::kMemcpyHtoDArena, bad);
  bad = c;
  bad.src = dptr;
  bad.ctx = 0x0100000100000007ull;     // 5: not its context
  g.post(0, Op::kMemcpyDtoHArena, bad);
  bad = c;
  bad.src = dptr;
  bad.arena_off = ring::staging_off(g.l, 1);  // channel 1's area: a plain arena copy, not counted here
  g.post(0, Op::kMemcpyDtoHArena, bad);
  CHECK(g.call(0, Op::kFlush, proto::ReqCtx{ctx}) == CUDA_ERROR_INVALID_VALUE);  // the first error, once
  CHECK(counted() == 5);
  CHECK(g.call(0, Op::kFlush, proto::ReqCtx{ctx}) == CUDA_SUCCESS);
  // A chunk sent as a call: the data is in its slot, and counted, when it is answered.
  c.src = dptr;
  c.arena_off = slot + pattern.size();
  REQUIRE(g.call(0, Op::kMemcpyDtoHArena, c) == CUDA_SUCCESS);
  CHECK(counted() == 6);
  CHECK(std::memcmp(g.bar.data() + c.arena_off, pattern.data(), pattern.size()) == 0);

  proto::ReqCopy in{};
  in.ctx = ctx;
  in.src = dptr;
  in.bytes = proto::kInlineCopyMax;
  REQUIRE(g.call(0, Op::kMemcpyDtoHInline, in, &out) == CUDA_SUCCESS);
  REQUIRE(out.size() == sizeof(proto::RepCopyInline) + pattern.size());
  CHECK(RawGuest::as<proto::RepCopyInline>(out).bytes == pattern.size());
  CHECK(std::memcmp(out.data() + sizeof(proto::RepCopyInline), pattern.data(), pattern.size()) == 0);
  in.bytes = 0;
  CHECK(g.call(0, Op::kMemcpyDtoHInline, in, &out) == CUDA_SUCCESS);
  CHECK(out.size() == sizeof(proto::RepCopyInline));
  in.bytes = proto::kInlineCopyMax + 1;  // more than a reply carries
  CHECK(g.call(0, Op::kMemcpyDtoHInline, in, &out) == CUDA_ERROR_INVALID_VALUE);
  CHECK(out.empty());
  in.bytes = 16;
  in.src = dptr + 16384 - 8;  // runs off the end of the allocation
  CHECK(g.call(0, Op::kMemcpyDtoHInline, in, &out) == CUDA_ERROR_INVALID_VALUE);
  CHECK(out.empty());
  in.src = dptr ^ 0x100000000ull;  // someone else's memory
  CHECK(g.call(0, Op::kMemcpyDtoHInline, in, &out) == CUDA_ERROR_INVALID_VALUE);
  in.src = dptr;
  in.flags = proto::kAsync;
  in.stream = 0x0400000100000009ull;
  CHECK(g.call(0, Op::kMemcpyDtoHInline, in, &out) == CUDA_ERROR_INVALID_HANDLE);
  in.flags = 0;
  in.stream = 0;
  g.post(0, Op::kMemcpyDtoHInline, in);  // its data can only come back in a reply
  CHECK(g.call(0, Op::kFlush, proto::ReqCtx{ctx}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.send(0, static_cast<std::uint16_t>(Op::kMemcpyDtoHInline), &in, sizeof in - 8, true) ==
        CUDA_ERROR_INVALID_VALUE);  // truncated
  CHECK(counted() == 6);

  // Rings too small for the bound: the reply must fit a record.
  Daemon small({"--ring-size", "4096"}, "-small-ring");
  REQUIRE(small.alive());
  RawGuest s(small.sock);
  s.open(0);
  REQUIRE(s.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, 1, 0, 0, {}}, &out) == CUDA_SUCCESS);
  REQUIRE(s.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  in.ctx = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(s.call(0, Op::kMemAlloc, proto::ReqMemAlloc{in.ctx, 4096, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  in.src = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  in.bytes = 4096;
  CHECK(s.call(0, Op::kMemcpyDtoHInline, in, &out) == CUDA_ERROR_INVALID_VALUE);
  in.bytes = 1024;
  CHECK(s.call(0, Op::kMemcpyDtoHInline, in, &out) == CUDA_SUCCESS);
  CHECK(out.size() == sizeof(proto::RepCopyInline) + 1024);
  CHECK(d.alive());
  CHECK(small.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

// Channels of two guest processes of one VM (pids that are not the peer's:
// a VM) go to two workers. Neither reaches the other's channel or handles,
// and a process's goodbye on its last channel ends its worker.
// The guest's wait for its staged chunks (guest/memory.cc wait_staged) asks
// FlushWait once it has waited 2 ms: answered when the channel's copies are
// done, parked or not, and never with the error of earlier posted work,
// which belongs to the next synchronising call (staged_copy lost it under
// load when the wait was a Flush, and again while a parked FlushWait took it).
TEST_CASE("a FlushWait answers once the channel's copies are done and leaves posted errors for the next "
          "synchronising call",
          "[process][hostile]") {
  // Every event the double records completes 20 ms later: the copy stays in flight.
  ::setenv("IVCUDA_GPU_DOUBLE_EVENT_DELAY_US", "20000", 1);
  Daemon d;
  ::unsetenv("IVCUDA_GPU_DOUBLE_EVENT_DELAY_US");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, 1, 0, 0, {}}, &out) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 1 << 20, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  const auto counted = [&, base = ring::staging_done(g.bar.data(), g.l, 0)] {
    return ring::staging_done(g.bar.data(), g.l, 0) - base;
  };
  proto::ReqCopy c{};
  c.ctx = ctx;
  c.dst = dptr;
  c.bytes = 64 << 10;
  c.arena_off = ring::staging_off(g.l, 0);
  auto bad = c;
  bad.dst = dptr ^ 0x100000000ull;  // not its memory: the posted error
  g.post(0, Op::kMemcpyHtoDArena, bad);
  g.post(0, Op::kMemcpyHtoDArena, c);  // a good chunk, its DMA in flight for 20 ms
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(g.call(0, Op::kFlushWait, proto::ReqCtx{ctx}) == CUDA_SUCCESS);
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(counted() == 2);                            // both chunks counted when it answers
  CHECK(waited >= std::chrono::milliseconds(10));   // it waited for the copy (parked)
  CHECK(g.call(0, Op::kFlushWait, proto::ReqCtx{ctx}) == CUDA_SUCCESS);  // nothing in flight: at once
  CHECK(g.call(0, Op::kCtxSynchronize, proto::ReqCtx{ctx}) == CUDA_ERROR_INVALID_VALUE);  // the error, here
  CHECK(g.call(0, Op::kCtxSynchronize, proto::ReqCtx{ctx}) == CUDA_SUCCESS);                // once
  CHECK(d.alive());
}

TEST_CASE("a VM's processes get a worker each and reach only their own channels and handles",
          "[process][hostile]") {
  Strays strays;
  // (a's worker ends with a's goodbye; recycled, it would stay as the VM's spare.)
  Daemon d({"--vm-spare-workers", "0", "--recycle-workers", "off"}, "-vm");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  const pid_t a = ::getpid() + 100000, b = ::getpid() + 200000;  // the guest's own pids, not the host's
  g.open(0, a);
  g.open(1, b);
  std::vector<std::byte> out;
  const auto hello = [](pid_t pid) {
    return proto::ReqHello{proto::kProtoVersion, static_cast<std::uint32_t>(pid), 0, 0, {}};
  };
  REQUIRE(g.call(0, Op::kHello, hello(a), &out) == CUDA_SUCCESS);
  // A hello for process a on b's channel: somebody else's channel.
  CHECK(g.call(1, Op::kHello, hello(a)) == CUDA_ERROR_NOT_PERMITTED);
  REQUIRE(g.call(1, Op::kHello, hello(b)) == CUDA_SUCCESS);
  // Two workers under the connection's supervisor.
  const auto sup = d.workers();
  REQUIRE(sup.size() == 1);
  std::vector<pid_t> workers;
  {
    std::ifstream f("/proc/" + std::to_string(sup[0]) + "/task/" + std::to_string(sup[0]) + "/children");
    for (pid_t p; f >> p;) workers.push_back(p);
  }
  CHECK(workers.size() == 2);

  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx_a = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx_a, 4096, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto ptr_a = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  REQUIRE(g.call(0, Op::kStreamCreate, proto::ReqStreamCreate{ctx_a, 0, 0}, &out) == CUDA_SUCCESS);
  const auto stream_a = RawGuest::as<proto::RepHandle>(out).handle;

  REQUIRE(g.call(1, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx_b = RawGuest::as<proto::RepHandle>(out).handle;
  // a's context, stream and memory mean nothing on b's channel.
  CHECK(g.call(1, Op::kMemAlloc, proto::ReqMemAlloc{ctx_a, 4096, 0, 0, 0, 0}) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(g.call(1, Op::kStreamSynchronize, proto::ReqHandle{ctx_b, stream_a}) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(g.call(1, Op::kMemGetAddressRange, proto::ReqPtr{ctx_b, ptr_a}) != CUDA_SUCCESS);
  CHECK(g.call(1, Op::kMemFree, proto::ReqPtr{ctx_b, ptr_a}) != CUDA_SUCCESS);
  // ...and are still a's.
  CHECK(g.call(0, Op::kStreamSynchronize, proto::ReqHandle{ctx_a, stream_a}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kMemGetAddressRange, proto::ReqPtr{ctx_a, ptr_a}) == CUDA_SUCCESS);

  // a says goodbye on its only channel: its worker ends; b's serves on.
  REQUIRE(g.call(0, Op::kGoodbye, proto::ReqCtx{0}) == CUDA_SUCCESS);
  std::size_t left = 0;
  for (int i = 0; i < 200; ++i) {
    left = 0;
    for (const pid_t w : workers) left += ::kill(w, 0) == 0 ? 1 : 0;
    if (left == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(left == 1);
  CHECK(g.call(1, Op::kMemAlloc, proto::ReqMemAlloc{ctx_b, 4096, 0, 0, 0, 0}) == CUDA_SUCCESS);
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

TEST_CASE("a guest process holds at most --object-limits objects of each kind", "[process][hostile]") {
  Strays strays;
  Daemon d({"--object-limits", "streams=3,events=2,graphs=2"});
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, 1, 0, 0, {}}, &out) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
  std::vector<std::uint64_t> streams;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(g.call(0, Op::kStreamCreate, proto::ReqStreamCreate{ctx, 0, 0}, &out) == CUDA_SUCCESS);
    streams.push_back(RawGuest::as<proto::RepHandle>(out).handle);
  }
  CHECK(g.call(0, Op::kStreamCreate, proto::ReqStreamCreate{ctx, 0, 0}, &out) == CUDA_ERROR_OUT_OF_MEMORY);
  // One destroyed, one more fits.
  REQUIRE(g.call(0, Op::kStreamDestroy, proto::ReqHandle{ctx, streams.back()}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kStreamCreate, proto::ReqStreamCreate{ctx, 0, 0}, &out) == CUDA_SUCCESS);
  for (int i = 0; i < 2; ++i)
    CHECK(g.call(0, Op::kEventCreate, proto::ReqEventCreate{ctx, CU_EVENT_DISABLE_TIMING, 0}, &out) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kEventCreate, proto::ReqEventCreate{ctx, CU_EVENT_DISABLE_TIMING, 0}, &out) ==
        CUDA_ERROR_OUT_OF_MEMORY);
  for (int i = 0; i < 2; ++i)
    CHECK(g.call(0, Op::kGraphCreate, proto::ReqGraphCreate{ctx, 0, 0}, &out) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kGraphCreate, proto::ReqGraphCreate{ctx, 0, 0}, &out) == CUDA_ERROR_OUT_OF_MEMORY);
  // Nothing else is disturbed: the guest's context keeps working.
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 4096, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kCtxSynchronize, proto::ReqCtx{ctx}) == CUDA_SUCCESS);
  CHECK(d.alive());
  CHECK(strays.seen() == "");  // nothing outside the guest's books reached the driver
}

TEST_CASE("ivcudad refuses malformed --object-limits, naming the kinds", "[process]") {
  for (const char* bad : {"streams", "streams=0", "streams=-1", "colours=3", "streams=3,events=x"}) {
    const std::string cmd = std::string(IVCUDAD_PATH) + " --socket /tmp/ivcuda-limits-" + std::to_string(::getpid()) +
                            ".sock --object-limits '" + bad + "' 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    std::string text;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p) != nullptr) text += buf;
    const int status = ::pclose(p);
    INFO(bad << ": " << text);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) != 0);
    CHECK(text.find("--object-limits") != std::string::npos);
  }
}

// cuMemHostRegister of a shared mapping (host-daemon/worker/host_register.cc):
// the guest sends the file behind it over its connection, and the worker maps
// and page-locks only what a regular file of that size holds, at most the
// arena's size in all; copies may then name it past the BAR, nothing beyond it.
TEST_CASE("registered shared mappings reach the driver only as regular files the guest sent, within its arena's "
          "size", "[process][hostile]") {
  Strays strays;
  Daemon d;
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, 1, 0, 0, {}}, &out) == CUDA_SUCCESS);
  const std::uint64_t bar_size = g.bar.size();
  constexpr std::uint64_t kPage = 4096;
  std::uint64_t token = 100;
  const int sock = g.client.socket_fd();
  auto send = [&](int fd) { REQUIRE(ivshmem::send_msg(sock, static_cast<std::int64_t>(++token), fd)); };
  auto reg = [&](std::uint64_t file_off, std::uint64_t bytes, std::uint32_t flags = 0) {
    out.clear();
    return g.call(0, Op::kHostRegisterShared, proto::ReqHostShared{token, file_off, bytes, flags, 0}, &out);
  };
  auto memfd = [](std::uint64_t size) {
    sys::UniqueFd fd(::memfd_create("hostile-reg", MFD_CLOEXEC));
    REQUIRE((fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(size)) == 0));
    return fd;
  };

  // Nothing sent, or another token's message (read past and closed).
  CHECK(reg(0, kPage) == CUDA_ERROR_INVALID_VALUE);
  auto small = memfd(kPage);
  send(small.get());
  ++token;
  CHECK(reg(0, kPage) == CUDA_ERROR_INVALID_VALUE);
  // Not a regular file: a pipe, /dev/zero (which maps).
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  send(p[0]);
  CHECK(reg(0, kPage) == CUDA_ERROR_INVALID_VALUE);
  ::close(p[0]);
  ::close(p[1]);
  sys::UniqueFd zero(::open("/dev/zero", O_RDWR | O_CLOEXEC));
  REQUIRE(zero.valid());
  send(zero.get());
  CHECK(reg(0, kPage) == CUDA_ERROR_INVALID_VALUE);
  // Past the file's end, unaligned, unknown flags, or read-only without READ_ONLY.
  send(small.get());
  CHECK(reg(0, 2 * kPage) == CUDA_ERROR_INVALID_VALUE);
  send(small.get());
  CHECK(reg(kPage, kPage) == CUDA_ERROR_INVALID_VALUE);
  send(small.get());
  CHECK(reg(0, 100) == CUDA_ERROR_INVALID_VALUE);
  send(small.get());
  CHECK(reg(0, kPage, 1u << 5) == CUDA_ERROR_INVALID_VALUE);
  sys::UniqueFd ro(::open(("/proc/self/fd/" + std::to_string(small.get())).c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(ro.valid());
  send(ro.get());
  CHECK(reg(0, kPage) == CUDA_ERROR_INVALID_VALUE);
  send(ro.get());
  CHECK(reg(0, kPage, CU_MEMHOSTREGISTER_READ_ONLY) == CUDA_SUCCESS);

  // At most the arena's size in all: two of three quarters do not fit.
  const std::uint64_t quarter3 = g.l.arena_size / 4 * 3 / kPage * kPage;
  auto big = memfd(quarter3);
  send(big.get());
  REQUIRE(reg(0, quarter3) == CUDA_SUCCESS);
  const auto first = RawGuest::as<proto::RepHostAlloc>(out);
  CHECK(first.arena_off >= bar_size);
  send(big.get());
  CHECK(reg(0, quarter3) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(g.call(0, Op::kHostUnregisterShared, proto::ReqArenaOff{first.arena_off}) == CUDA_SUCCESS);

  // A good one: copies name it past the BAR, and nothing past its end.
  auto file = memfd(4 * kPage);
  send(file.get());
  REQUIRE(reg(kPage, 2 * kPage) == CUDA_SUCCESS);
  const auto good = RawGuest::as<proto::RepHostAlloc>(out);
  CHECK(good.arena_off >= bar_size);
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 4 * kPage, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  proto::ReqCopy c{};
  c.ctx = ctx;
  c.dst = dptr;
  c.bytes = 2 * kPage;
  c.arena_off = good.arena_off;
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_SUCCESS);
  c.arena_off = good.arena_off + 8;  // runs past its end
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);
  // Unregistered only where registered, once.
  CHECK(g.call(0, Op::kHostUnregisterShared, proto::ReqArenaOff{good.arena_off + kPage}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kHostUnregisterShared, proto::ReqArenaOff{g.l.arena_off}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(g.call(0, Op::kHostUnregisterShared, proto::ReqArenaOff{good.arena_off}) == CUDA_SUCCESS);
  CHECK(g.call(0, Op::kHostUnregisterShared, proto::ReqArenaOff{good.arena_off}) == CUDA_ERROR_INVALID_VALUE);
  c.arena_off = good.arena_off;
  CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);
  CHECK(strays.seen() == "");
}
