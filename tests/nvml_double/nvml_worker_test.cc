// The worker's NVML (host-daemon/worker/nvml.cc), driven through ivcudad in process
// mode by a guest that speaks the ring protocol by hand, against the GPU and
// NVML test doubles (three GPUs, two of them granted). What is proved: every
// NvmlFn is answered; requests the worker must refuse are refused before NVML
// sees them; short buffers get NVML_ERROR_INSUFFICIENT_SIZE with the size or
// count needed; each tenant sees its own processes (by its guest pid) and its
// own memory, with its quota as the total, and among the processes the host's
// NVML lists (every holder of a context: the doubles charge each context
// kContextMem, as a GPU does) no one else's, not even the warm worker's;
// links to GPUs it was not granted read as down; without a host NVML every
// query says LIBRARY_NOT_FOUND.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <fcntl.h>
#include <nvml.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "identity.h"
#include "ivcuda/nvml_wire.h"
#include "ivcuda/proto.h"
#include "ring/ivshmem.h"
#include "ring/layout.h"
#include "ring/spsc_ring.h"
#include "ring/sys.h"
#include "ring/wait.h"

using namespace ivcuda;
using nvml_wire::NvmlFn;
using proto::Op;

namespace {

constexpr std::uint64_t kMiB = 1u << 20;
// What each context holds in the GPU double here (IVCUDA_GPU_DOUBLE_CONTEXT_MIB
// in the daemon's environment): a figure no allocation of these tests makes.
constexpr std::uint64_t kContextMem = 24 * kMiB;

std::string tmp_path(const std::string& what) {
  return "/tmp/ivcuda-nvml-" + std::to_string(::getpid()) + "-" + what;
}

// ivcudad on the doubles: three GPUs in the double, `extra` options after.
struct Daemon {
  pid_t pid = -1;
  std::string sock;
  std::string ledger;
  Daemon(const std::string& tag, std::vector<std::string> extra) {
    sock = tmp_path(tag + ".sock");
    ledger = tmp_path(tag + ".ledger");
    ::unlink(sock.c_str());
    ::unlink(ledger.c_str());
    std::vector<std::string> args = {IVCUDAD_PATH, "--socket", sock, "--shm-size", "64M", "--channels", "4",
                                     "--staging-size", "1M", "--driver", GPU_DOUBLE_PATH, "--log-level", "error"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a test killed mid-way leaves no daemon behind
      ::setenv("IVCUDA_GPU_DOUBLE_DEVICES", "3", 1);
      ::setenv("IVCUDA_DOUBLE_LEDGER", ledger.c_str(), 1);
      ::setenv("IVCUDA_GPU_DOUBLE_CONTEXT_MIB", std::to_string(kContextMem / kMiB).c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(IVCUDAD_PATH, argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 500 && ::access(sock.c_str(), F_OK) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~Daemon() {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
    ::unlink(ledger.c_str());
  }
  // The GPU double's own record (the truth the NVML double reports from):
  // how many live processes hold a context on host GPU `dev`.
  int context_holders(int dev) const {
    const int fd = ::open(ledger.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int n = 0;
    void* p = ::mmap(nullptr, sizeof(gpu_double::Ledger), PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      const auto* l = static_cast<const gpu_double::Ledger*>(p);
      for (int i = 0; i < gpu_double::Ledger::kEntries; ++i) {
        struct flock fl {};
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = i;
        fl.l_len = 1;
        const bool live = ::fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
        if (live && l->e[i].contexts[dev].load() > 0) ++n;
      }
      ::munmap(p, sizeof(gpu_double::Ledger));
    }
    ::close(fd);
    return n;
  }
  // Waits (up to 10 s) until at least `n` processes hold a context on `dev`.
  bool await_context_holders(int dev, int n) const {
    for (int i = 0; i < 1000; ++i) {
      if (context_holders(dev) >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

struct Reply {
  CUresult st = CUDA_ERROR_UNKNOWN;  // the record's status
  int ret = -1;                      // RepNvml::ret
  proto::RepNvml rep{};
  std::vector<std::byte> out;        // the bytes after RepNvml
  std::string str() const { return out.empty() ? std::string() : std::string(reinterpret_cast<const char*>(out.data())); }
};

// One process-mode guest on channel 0, its hello said with `guest_pid`.
struct Guest {
  ivshmem::IvshmemClient client;
  sys::Mapping bar;
  ring::Layout l;
  std::unique_ptr<ring::EventfdDoorbell> bell;
  ring::Producer req;
  ring::Consumer cpl;
  std::uint32_t seq = 1;

  Guest(const std::string& sock, std::uint32_t guest_pid) : client(connect(sock)) {
    bar = std::move(sys::Mapping::map_shared(client.shm_fd(), client.shm_size()).value());
    l = ring::read_layout(bar.data(), bar.size()).value();
    auto* d = ring::channel_desc(bar.data(), l, 0);
    d->guest_owner = std::uint64_t{static_cast<std::uint32_t>(::getpid())} << 32;
    d->guest_claim = d->guest_claim + 1;
    bell = std::make_unique<ring::EventfdDoorbell>(client.peers().at(0)[0].get());
    req = ring::Producer(ring::request_ring(bar.data(), l, 0), bell.get());
    cpl = ring::Consumer(ring::completion_ring(bar.data(), l, 0));
    std::atomic_ref<std::uint64_t>(ring::superblock(bar.data())->active_mask[0]).fetch_or(1);
    std::vector<std::byte> out;
    REQUIRE(call(Op::kHello, proto::ReqHello{proto::kProtoVersion, guest_pid, 1, 0, {}}, &out) == CUDA_SUCCESS);
  }
  static ivshmem::IvshmemClient connect(const std::string& sock) {
    auto c = ivshmem::ivshmem_connect(sock, std::chrono::milliseconds(3000), 8);
    REQUIRE(c);
    return std::move(c).value();
  }
  CUresult send(Op op, const void* payload, std::size_t n, std::vector<std::byte>* out) {
    abi::RecordHeader h{};
    h.op = static_cast<std::uint16_t>(op);
    h.flags = abi::kRecNeedsReply;
    h.len = static_cast<std::uint32_t>(n);
    h.seq = seq++;
    ring::RingStatus st;
    std::byte* p = req.reserve(h, &st);
    REQUIRE(p != nullptr);
    std::memcpy(p, payload, n);
    req.commit();
    req.publish();
    bell->ring();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    ring::Record rec;
    while (std::chrono::steady_clock::now() < until) {
      if (cpl.poll(&rec) == ring::RingStatus::kOk) {
        const auto r = static_cast<CUresult>(rec.hdr.status);
        out->assign(rec.payload.begin(), rec.payload.end());
        CHECK(rec.hdr.seq == h.seq);
        cpl.consume();
        cpl.publish_head();
        return r;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    FAIL("no reply in time");
    return CUDA_ERROR_UNKNOWN;
  }
  template <class T>
  CUresult call(Op op, const T& r, std::vector<std::byte>* out) {
    return send(op, &r, sizeof r, out);
  }
  Reply nvml(NvmlFn fn, std::int32_t device, std::uint64_t arg0 = 0, std::uint64_t arg1 = 0, std::uint32_t cap = 256) {
    return nvml_raw(static_cast<std::uint32_t>(fn), device, arg0, arg1, cap);
  }
  Reply nvml_raw(std::uint32_t fn, std::int32_t device, std::uint64_t arg0, std::uint64_t arg1, std::uint32_t cap) {
    Reply r;
    std::vector<std::byte> out;
    r.st = call(Op::kNvml, proto::ReqNvml{fn, device, arg0, arg1, cap, 0}, &out);
    if (r.st != CUDA_SUCCESS) return r;
    REQUIRE(out.size() >= sizeof r.rep);
    std::memcpy(&r.rep, out.data(), sizeof r.rep);
    r.ret = r.rep.ret;
    REQUIRE(out.size() == sizeof r.rep + r.rep.out_len);  // nothing more than it says
    r.out.assign(out.begin() + sizeof r.rep, out.end());
    return r;
  }
  // This guest's primary context on its device `device` (retained).
  std::uint64_t retain(int device) {
    std::vector<std::byte> out;
    REQUIRE(call(Op::kPrimaryRetain, proto::ReqDevice{device, 0}, &out) == CUDA_SUCCESS);
    proto::RepHandle ctx{};
    std::memcpy(&ctx, out.data(), sizeof ctx);
    return ctx.handle;
  }
  // Device memory for this guest on its device `device` (the primary context's).
  void alloc(int device, std::uint64_t bytes) {
    const std::uint64_t ctx = retain(device);
    std::vector<std::byte> out;
    REQUIRE(call(Op::kMemAlloc, proto::ReqMemAlloc{ctx, bytes, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  }
  std::vector<nvml_wire::NvmlProcess> processes(int device) {
    const Reply r = nvml(NvmlFn::kDeviceComputeRunningProcesses, device, 64, 0, 64 * sizeof(nvml_wire::NvmlProcess));
    REQUIRE(r.ret == NVML_SUCCESS);
    REQUIRE(r.out.size() == r.rep.val[0] * sizeof(nvml_wire::NvmlProcess));
    std::vector<nvml_wire::NvmlProcess> v(r.rep.val[0]);
    if (!v.empty()) std::memcpy(v.data(), r.out.data(), r.out.size());
    return v;
  }
};

std::string uuid_of(int dev) {
  unsigned char b[16];
  gpu_double::device_uuid(dev, b);
  char s[64];
  std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return s;
}

}  // namespace

TEST_CASE("every NVML query is answered for the granted GPUs, in the guest's numbering", "[nvml_double]") {
  // Host GPUs 1 and 2 of the double's three: the guest's 0 and 1.
  Daemon d("all", {"--gpus", "1,2", "--nvml", NVML_DOUBLE_PATH});
  Guest g(d.sock, 4242);

  CHECK(g.nvml(NvmlFn::kInit, nvml_wire::kNoDevice).ret == NVML_SUCCESS);
  CHECK(g.nvml(NvmlFn::kSystemDriverVersion, nvml_wire::kNoDevice).str() == "580.00.00");
  CHECK(g.nvml(NvmlFn::kSystemNvmlVersion, nvml_wire::kNoDevice).str() == "13.580.00");
  CHECK(g.nvml(NvmlFn::kSystemCudaDriverVersion, nvml_wire::kNoDevice).rep.val[0] == 13000);
  CHECK(g.nvml(NvmlFn::kDeviceCount, nvml_wire::kNoDevice).rep.val[0] == 2);

  for (int dev = 0; dev < 2; ++dev) {
    INFO("guest device " << dev);
    const int host = dev + 1;
    CHECK(g.nvml(NvmlFn::kDeviceName, dev).str() == gpu_double::kDeviceName);
    // The same UUID the guest's CUDA sees (DeviceInfo) and the host's NVML knows.
    const Reply u = g.nvml(NvmlFn::kDeviceUuid, dev);
    CHECK(u.str() == uuid_of(host));
    std::vector<std::byte> out;
    REQUIRE(g.call(Op::kDeviceInfo, proto::ReqDevice{dev, 0}, &out) == CUDA_SUCCESS);
    proto::RepDeviceInfo info{};
    std::memcpy(&info, out.data(), std::min(sizeof info, out.size()));
    unsigned char b[16];
    gpu_double::device_uuid(host, b);
    CHECK(std::memcmp(info.uuid, b, 16) == 0);

    const Reply p = g.nvml(NvmlFn::kDevicePciInfo, dev);
    REQUIRE(p.ret == NVML_SUCCESS);
    REQUIRE(p.out.size() == sizeof(nvml_wire::NvmlPci));
    nvml_wire::NvmlPci pci{};
    std::memcpy(&pci, p.out.data(), sizeof pci);
    char bus[32];
    std::snprintf(bus, sizeof bus, "00000000:%02x:00.0", gpu_double::pci_bus(host));
    CHECK(std::string(pci.bus_id) == bus);
    std::snprintf(bus, sizeof bus, "0000:%02x:00.0", gpu_double::pci_bus(host));
    CHECK(std::string(pci.bus_id_legacy) == bus);  // cuDeviceGetPCIBusId's form
    CHECK(pci.bus == static_cast<unsigned>(gpu_double::pci_bus(host)));
    CHECK(pci.pci_device_id == 0x233510DEu);

    CHECK(g.nvml(NvmlFn::kDeviceMinorNumber, dev).rep.val[0] == static_cast<unsigned>(host));
    const Reply cc = g.nvml(NvmlFn::kDeviceCudaComputeCapability, dev);
    CHECK((cc.rep.val[0] == 9 && cc.rep.val[1] == 0));
    const Reply mem = g.nvml(NvmlFn::kDeviceMemoryInfo, dev);
    REQUIRE(mem.ret == NVML_SUCCESS);
    CHECK(mem.rep.val[0] == gpu_double::kTotalMem);  // no quota: the GPU's
    CHECK(mem.rep.val[1] + mem.rep.val[2] == mem.rep.val[0]);
    CHECK(mem.rep.val[3] == 0);
    CHECK(g.nvml(NvmlFn::kDeviceTemperature, dev, NVML_TEMPERATURE_GPU).rep.val[0] == 34);
    CHECK(g.nvml(NvmlFn::kDevicePowerUsage, dev).rep.val[0] == 71234);
    CHECK(g.nvml(NvmlFn::kDeviceClockInfo, dev, NVML_CLOCK_MEM).rep.val[0] == 3201);
    CHECK(g.nvml(NvmlFn::kDeviceClock, dev, NVML_CLOCK_SM, NVML_CLOCK_ID_CURRENT).rep.val[0] == 1980);
    const Reply util = g.nvml(NvmlFn::kDeviceUtilizationRates, dev);
    CHECK((util.rep.val[0] == 7 && util.rep.val[1] == 3));
    // The GPU's own errors pass through: a board without fans.
    CHECK(g.nvml(NvmlFn::kDeviceFanSpeed, dev).ret == NVML_ERROR_NOT_SUPPORTED);
  }

  // Every function, with arguments in range: answered by the double (fans: NOT_SUPPORTED).
  for (auto f = static_cast<std::uint32_t>(NvmlFn::kInit); f < static_cast<std::uint32_t>(NvmlFn::kCount); ++f) {
    const auto fn = static_cast<NvmlFn>(f);
    const bool system = fn == NvmlFn::kInit || fn == NvmlFn::kSystemDriverVersion ||
                        fn == NvmlFn::kSystemNvmlVersion || fn == NvmlFn::kSystemCudaDriverVersion ||
                        fn == NvmlFn::kDeviceCount;
    std::uint64_t a0 = 0, a1 = 0;
    if (fn == NvmlFn::kDeviceComputeRunningProcesses || fn == NvmlFn::kDeviceGraphicsRunningProcesses) a0 = 8;
    if (fn == NvmlFn::kDeviceTopologyCommonAncestor || fn == NvmlFn::kDeviceP2PStatus || fn == NvmlFn::kDeviceNvLinkState)
      a0 = 1;
    if (fn == NvmlFn::kDeviceTemperatureThreshold) a0 = NVML_TEMPERATURE_THRESHOLD_SHUTDOWN;
    if (fn == NvmlFn::kDeviceFieldValues) a0 = NVML_FI_DEV_ECC_CURRENT;
    if (fn == NvmlFn::kDeviceProcessUtilization || fn == NvmlFn::kDeviceMPSComputeRunningProcesses) a0 = 8;
    const Reply r = g.nvml(fn, system ? nvml_wire::kNoDevice : 0, a0, a1);
    INFO("fn " << f);
    CHECK(r.st == CUDA_SUCCESS);
    if (fn == NvmlFn::kDeviceFanSpeed || fn == NvmlFn::kDeviceFanSpeedV2)
      CHECK(r.ret == NVML_ERROR_NOT_SUPPORTED);
    else if (fn == NvmlFn::kDeviceProcessUtilization)  // samples where the guest's worker holds a context
      CHECK((r.ret == NVML_SUCCESS || r.ret == NVML_ERROR_NOT_FOUND));
    else
      CHECK(r.ret == NVML_SUCCESS);
  }
  // A guest has no graphics contexts.
  CHECK(g.nvml(NvmlFn::kDeviceGraphicsRunningProcesses, 0, 8, 0).rep.val[0] == 0);
}

TEST_CASE("NVML requests outside what the guest may ask are refused before NVML sees them", "[nvml_double][hostile]") {
  Daemon d("bad", {"--gpus", "0,1", "--nvml", NVML_DOUBLE_PATH});
  Guest g(d.sock, 100);
  const auto bad = [&](std::uint32_t fn, std::int32_t dev, std::uint64_t a0 = 0, std::uint64_t a1 = 0) {
    const Reply r = g.nvml_raw(fn, dev, a0, a1, 256);
    CHECK(r.st == CUDA_SUCCESS);
    CHECK(r.out.empty());
    return r.ret;
  };
  const auto F = [](NvmlFn f) { return static_cast<std::uint32_t>(f); };
  // Functions outside NvmlFn.
  for (std::uint32_t fn : {0u, F(NvmlFn::kCount), 0x7fffffffu, 0xffffffffu}) CHECK(bad(fn, 0) == NVML_ERROR_INVALID_ARGUMENT);
  // Devices: ungranted (the double has a third), negative, kNoDevice on a device query, a device on a system query.
  for (std::int32_t dev : {2, 3, 64, -2, std::numeric_limits<std::int32_t>::min()})
    CHECK(bad(F(NvmlFn::kDeviceName), dev) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceName), nvml_wire::kNoDevice) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceMemoryInfo), nvml_wire::kNoDevice) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kSystemDriverVersion), 0) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceCount), 0) == NVML_ERROR_INVALID_ARGUMENT);
  // Enum arguments outside NVML's enums.
  CHECK(bad(F(NvmlFn::kDeviceTemperature), 0, NVML_TEMPERATURE_COUNT) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceTemperature), 0, ~0ull) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceTemperatureThreshold), 0, NVML_TEMPERATURE_THRESHOLD_COUNT) == NVML_ERROR_INVALID_ARGUMENT);
  for (auto fn : {NvmlFn::kDeviceClockInfo, NvmlFn::kDeviceMaxClockInfo, NvmlFn::kDeviceApplicationsClock,
                  NvmlFn::kDeviceDefaultApplicationsClock})
    CHECK(bad(F(fn), 0, NVML_CLOCK_COUNT) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceClock), 0, NVML_CLOCK_SM, NVML_CLOCK_ID_COUNT) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceClock), 0, 1ull << 32, 0) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDevicePcieThroughput), 0, NVML_PCIE_UTIL_COUNT) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceP2PStatus), 0, 1, NVML_P2P_CAPS_INDEX_UNKNOWN) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceTotalEccErrors), 0, NVML_MEMORY_ERROR_TYPE_COUNT, 0) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceTotalEccErrors), 0, 0, NVML_ECC_COUNTER_TYPE_COUNT) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceNvLinkState), 0, NVML_NVLINK_MAX_LINKS) == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(bad(F(NvmlFn::kDeviceFanSpeedV2), 0, 1ull << 32) == NVML_ERROR_INVALID_ARGUMENT);
  // The other GPU of a topology or P2P query must be granted too.
  for (std::uint64_t other : {2ull, 3ull, ~0ull}) {
    CHECK(bad(F(NvmlFn::kDeviceTopologyCommonAncestor), 0, other) == NVML_ERROR_INVALID_ARGUMENT);
    CHECK(bad(F(NvmlFn::kDeviceP2PStatus), 0, other, NVML_P2P_CAPS_INDEX_READ) == NVML_ERROR_INVALID_ARGUMENT);
  }
  CHECK(g.nvml(NvmlFn::kDeviceTopologyCommonAncestor, 0, 1).rep.val[0] == NVML_TOPOLOGY_NODE);
  CHECK(g.nvml(NvmlFn::kDeviceTopologyCommonAncestor, 1, 1).rep.val[0] == NVML_TOPOLOGY_INTERNAL);
  // A truncated request is the protocol's error, not NVML's.
  std::vector<std::byte> out;
  const std::uint64_t half[2] = {F(NvmlFn::kDeviceName), 0};
  CHECK(g.send(Op::kNvml, half, sizeof half, &out) == CUDA_ERROR_INVALID_VALUE);
  // And the worker still answers.
  CHECK(g.nvml(NvmlFn::kDeviceName, 1).ret == NVML_SUCCESS);
}

// The wire number of a pass-through function: its row in tools/nvml_passthrough.txt.
std::uint32_t passthrough_fn(const std::string& name) {
  std::ifstream list(NVML_PASSTHROUGH_LIST);
  REQUIRE(list.good());
  std::string line;
  std::uint32_t row = 0;
  while (std::getline(list, line)) {
    if (line.empty() || (line[0] == '#' && line.rfind("#-", 0) != 0)) continue;
    std::istringstream words(line[0] == '#' ? line.substr(2) : line);
    std::string fn;
    words >> fn;
    if (fn == name) return nvml_wire::kPassthroughBase + row;
    ++row;
  }
  FAIL("no row for " << name);
  return 0;
}

TEST_CASE("field values travel two at a time, and utilisation samples are the guest's own processes", "[nvml_double][hostile]") {
  Daemon d("fv", {"--gpus", "0,1", "--nvml", NVML_DOUBLE_PATH});
  Guest g(d.sock, 4444);
  Reply r = g.nvml(NvmlFn::kDeviceFieldValues, 0, NVML_FI_DEV_ECC_CURRENT | (3ull << 32), NVML_FI_DEV_MEMORY_TEMP,
                   2 * sizeof(nvmlFieldValue_t));
  REQUIRE(r.ret == NVML_SUCCESS);
  REQUIRE(r.rep.val[0] == 2);
  REQUIRE(r.out.size() == 2 * sizeof(nvmlFieldValue_t));
  nvmlFieldValue_t v[2];
  std::memcpy(v, r.out.data(), sizeof v);
  CHECK((v[0].fieldId == NVML_FI_DEV_ECC_CURRENT && v[0].scopeId == 3 && v[0].value.ullVal == 10ull * NVML_FI_DEV_ECC_CURRENT));
  CHECK((v[1].fieldId == NVML_FI_DEV_MEMORY_TEMP && v[1].nvmlReturn == NVML_SUCCESS));
  // No field, or less room than the fields take.
  CHECK(g.nvml(NvmlFn::kDeviceFieldValues, 0, 0, 0, 256).ret == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(g.nvml(NvmlFn::kDeviceFieldValues, 0, 1, 2, sizeof(nvmlFieldValue_t)).ret == NVML_ERROR_INVALID_ARGUMENT);
  // With a context this guest has samples, by its own pid; another tenant's never show.
  Guest other(d.sock, 5555);
  other.alloc(0, 1 << 20);
  g.alloc(0, 1 << 20);
  r = g.nvml(NvmlFn::kDeviceProcessUtilization, 0, 8, 0, 8 * sizeof(nvmlProcessUtilizationSample_t));
  REQUIRE(r.ret == NVML_SUCCESS);
  REQUIRE(r.rep.val[0] == 1);
  nvmlProcessUtilizationSample_t s{};
  std::memcpy(&s, r.out.data(), sizeof s);
  CHECK(s.pid == 4444);
  // The host NVML's padding bytes after the pid (host memory) are not the guest's.
  unsigned padding = ~0u;
  std::memcpy(&padding, r.out.data() + sizeof s.pid, sizeof padding);
  CHECK(padding == 0);
  CHECK(g.nvml(NvmlFn::kDeviceProcessUtilization, 0, 0, 0, 0).ret == NVML_ERROR_INSUFFICIENT_SIZE);
  // MPS clients: none here, and none of another tenant's.
  r = g.nvml(NvmlFn::kDeviceMPSComputeRunningProcesses, 0, 8, 0, 8 * sizeof(nvml_wire::NvmlProcess));
  CHECK(r.ret == NVML_SUCCESS);
  CHECK(r.rep.val[0] == 0);
}

TEST_CASE("the pass-through queries reach the host's NVML for the granted GPU, and no further", "[nvml_double][hostile]") {
  // Host GPUs 1 and 2: the double's values depend on the host index.
  Daemon d("pt", {"--gpus", "1,2", "--nvml", NVML_DOUBLE_PATH});
  Guest g(d.sock, 4343);
  const std::uint32_t rows = passthrough_fn("nvmlDeviceGetRemappedRows");
  // Four values out, the host's GPU 2 behind the guest's 1.
  Reply r = g.nvml_raw(rows, 1, 0, 0, 16);
  REQUIRE(r.ret == NVML_SUCCESS);
  REQUIRE(r.out.size() == 16);
  unsigned v[4];
  std::memcpy(v, r.out.data(), sizeof v);
  CHECK((v[0] == 4 && v[1] == 1 && v[2] == 0 && v[3] == 0));
  // A guest that takes less than the layout is no request the library makes.
  CHECK(g.nvml_raw(rows, 1, 0, 0, 12).ret == NVML_ERROR_INVALID_ARGUMENT);
  // Rows past the list, a device query without a device, a system query with one, an ungranted GPU.
  for (std::uint32_t fn : {nvml_wire::kPassthroughBase + 100000u, nvml_wire::kPassthroughBase - 1})
    CHECK(g.nvml_raw(fn, 0, 0, 0, 64).ret == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(g.nvml_raw(rows, nvml_wire::kNoDevice, 0, 0, 16).ret == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(g.nvml_raw(rows, 2, 0, 0, 16).ret == NVML_ERROR_INVALID_ARGUMENT);
  const std::uint32_t bw = passthrough_fn("nvmlSystemGetNvlinkBwMode");
  CHECK(g.nvml_raw(bw, 0, 0, 0, 4).ret == NVML_ERROR_INVALID_ARGUMENT);
  CHECK(g.nvml_raw(bw, nvml_wire::kNoDevice, 0, 0, 4).ret == NVML_SUCCESS);
  // A function the host's NVML lacks (the double exports few): as NVML's loaders answer.
  CHECK(g.nvml_raw(passthrough_fn("nvmlDeviceGetNumaNodeId"), 0, 0, 0, 4).ret == NVML_ERROR_FUNCTION_NOT_FOUND);
  // A versioned struct claiming more bytes than nvml.h's: refused before NVML writes.
  const std::uint32_t margin = passthrough_fn("nvmlDeviceGetMarginTemperature");
  CHECK(g.nvml_raw(margin, 0, nvmlMarginTemperature_v1, 0, sizeof(nvmlMarginTemperature_t)).ret == NVML_SUCCESS);
  CHECK(g.nvml_raw(margin, 0, (1u << 24) | 4096u, 0, sizeof(nvmlMarginTemperature_t)).ret ==
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
  // A list capacity far past what a reply holds: clamped, never more than the limit comes back.
  const std::uint32_t samples = passthrough_fn("nvmlDeviceGetSamples");
  // slots: type, last seen (2), capacity
  r = g.nvml_raw(samples, 0, NVML_GPU_UTILIZATION_SAMPLES, 0x7fffffffull << 32, 1u << 20);
  CHECK(r.ret == NVML_SUCCESS);
  CHECK(r.out.size() <= nvml_wire::kPassthroughMaxBody);
  CHECK(r.rep.val[0] == 10);
  // Without an array: the count alone, and no bytes.
  r = g.nvml_raw(samples, 0, NVML_GPU_UTILIZATION_SAMPLES, std::uint64_t{nvml_wire::kPassthroughNullItems} << 32, 4);
  CHECK(r.ret == NVML_SUCCESS);
  CHECK(r.rep.val[0] == 10);
  CHECK(r.out.size() == 4);  // the value type alone
  // A text longer than the limit is clamped to it.
  r = g.nvml_raw(passthrough_fn("nvmlDeviceGetInforomVersion"), 0, NVML_INFOROM_OEM | (0xffffffffull << 32), 0,
                 nvml_wire::kPassthroughMaxBody);
  CHECK(r.ret == NVML_SUCCESS);
  CHECK(r.out.size() == nvml_wire::kPassthroughMaxText);
  // An enum argument NVML does not know reaches it as a number and it says so.
  CHECK(g.nvml_raw(passthrough_fn("nvmlDeviceGetMinMaxClockOfPState"), 0, 0xffffffffull, 0, 8).ret ==
        NVML_ERROR_INVALID_ARGUMENT);
  // And the worker still answers.
  CHECK(g.nvml(NvmlFn::kDeviceName, 1).ret == NVML_SUCCESS);
}

TEST_CASE("NVML answers that do not fit say how much room they need", "[nvml_double]") {
  Daemon d("small", {"--gpus", "0,1", "--nvml", NVML_DOUBLE_PATH});
  Guest g(d.sock, 100);
  const std::string name = gpu_double::kDeviceName;
  for (std::uint32_t cap : {0u, 1u, static_cast<std::uint32_t>(name.size())}) {
    const Reply r = g.nvml(NvmlFn::kDeviceName, 0, 0, 0, cap);
    CHECK(r.ret == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(r.rep.val[0] == name.size() + 1);
    CHECK(r.out.empty());
  }
  CHECK(g.nvml(NvmlFn::kDeviceName, 0, 0, 0, static_cast<std::uint32_t>(name.size() + 1)).str() == name);
  const Reply u = g.nvml(NvmlFn::kDeviceUuid, 0, 0, 0, 40);  // "GPU-" + 36 needs 41
  CHECK(u.ret == NVML_ERROR_INSUFFICIENT_SIZE);
  CHECK(u.rep.val[0] == 41);
  const Reply p = g.nvml(NvmlFn::kDevicePciInfo, 0, 0, 0, sizeof(nvml_wire::NvmlPci) - 1);
  CHECK(p.ret == NVML_ERROR_INSUFFICIENT_SIZE);
  CHECK(p.rep.val[0] == sizeof(nvml_wire::NvmlPci));
  CHECK(p.out.empty());

  g.alloc(0, 4 * kMiB);
  REQUIRE(g.processes(0).size() == 1);
  // Room for no entry, by count or by bytes: the count needed.
  for (auto [count, cap] : {std::pair{0u, 1024u}, std::pair{8u, 23u}, std::pair{8u, 0u}}) {
    const Reply r = g.nvml(NvmlFn::kDeviceComputeRunningProcesses, 0, count, 0, cap);
    CHECK(r.ret == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(r.rep.val[0] == 1);
    CHECK(r.out.empty());
  }
  const Reply one = g.nvml(NvmlFn::kDeviceComputeRunningProcesses, 0, 1, 0, sizeof(nvml_wire::NvmlProcess));
  CHECK(one.ret == NVML_SUCCESS);
  CHECK(one.out.size() == sizeof(nvml_wire::NvmlProcess));
}

TEST_CASE("each tenant sees only its own processes, by its own pids, and its own memory", "[nvml_double][hostile]") {
  Daemon d("tenants", {"--gpus", "0,1", "--nvml", NVML_DOUBLE_PATH});
  Guest a(d.sock, 1111);
  Guest b(d.sock, 2222);
  const auto used = [](Guest& g) { return g.nvml(NvmlFn::kDeviceMemoryInfo, 0).rep.val[2]; };
  const std::uint64_t a0 = used(a), b0 = used(b);
  a.alloc(0, 8 * kMiB);
  b.alloc(0, 24 * kMiB);
  CHECK(used(a) - a0 == 8 * kMiB);
  CHECK(used(b) - b0 == 24 * kMiB);

  const auto pa = a.processes(0), pb = b.processes(0);
  REQUIRE(pa.size() == 1);
  REQUIRE(pb.size() == 1);
  CHECK(pa[0].pid == 1111);  // the guest's pid, not its worker's
  CHECK(pb[0].pid == 2222);
  CHECK(pa[0].used_gpu_memory == used(a));
  CHECK(pb[0].used_gpu_memory == used(b));
  CHECK(pa[0].gpu_instance_id == 0xFFFFFFFFu);
  // Free is what is left of the total after this tenant's memory only.
  const Reply m = a.nvml(NvmlFn::kDeviceMemoryInfo, 0);
  CHECK(m.rep.val[1] == m.rep.val[0] - m.rep.val[2]);
  // Nothing on the GPU neither touched.
  CHECK(a.processes(1).empty());
}

// The host's NVML lists every process with a context: this guest's worker
// (the arena's context on its first GPU, taken at start), the warm worker
// ivcudad keeps ready for the next guest, another guest's worker. The guest
// sees its own entry alone, by its pid, with its context's memory, on a GPU
// where it holds nothing but that context too (the driver's NVML lists a
// process that allocated nothing).
TEST_CASE("a guest sees its own context-holding process alone, not the warm worker's or another guest's",
          "[nvml_double][hostile]") {
  Daemon d("contexts", {"--gpus", "0,1", "--warm-workers", "1", "--nvml", NVML_DOUBLE_PATH});
  Guest a(d.sock, 4242);
  Guest b(d.sock, 5353);
  b.alloc(0, 8 * kMiB);
  // a's worker, b's and the warm worker started for the next guest.
  REQUIRE(d.await_context_holders(0, 3));

  const auto mine = a.processes(0);
  REQUIRE(mine.size() == 1);
  CHECK(mine[0].pid == 4242);
  CHECK(mine[0].used_gpu_memory == kContextMem);  // the arena's context, nothing allocated
  const Reply m = a.nvml(NvmlFn::kDeviceMemoryInfo, 0);
  CHECK(m.rep.val[2] == kContextMem);
  CHECK(m.rep.val[1] == m.rep.val[0] - kContextMem);
  const auto theirs = b.processes(0);
  REQUIRE(theirs.size() == 1);
  CHECK(theirs[0].pid == 5353);
  CHECK(theirs[0].used_gpu_memory == kContextMem + 8 * kMiB);

  // A context alone lists the process on its GPU.
  CHECK(a.processes(1).empty());
  a.retain(1);
  REQUIRE(d.await_context_holders(1, 1));
  const auto second = a.processes(1);
  REQUIRE(second.size() == 1);
  CHECK(second[0].pid == 4242);
  CHECK(second[0].used_gpu_memory == kContextMem);
  CHECK(b.processes(1).empty());
}

TEST_CASE("the guest's memory quota is the total NVML reports", "[nvml_double]") {
  Daemon d("quota", {"--gpus", "0", "--mem-limit", "256M", "--context-reserve", "0", "--nvml", NVML_DOUBLE_PATH});
  Guest g(d.sock, 7);
  g.alloc(0, 16 * kMiB);
  const Reply m = g.nvml(NvmlFn::kDeviceMemoryInfo, 0);
  REQUIRE(m.ret == NVML_SUCCESS);
  CHECK(m.rep.val[0] == 256 * kMiB);
  CHECK(m.rep.val[2] >= 16 * kMiB);
  CHECK(m.rep.val[1] == 256 * kMiB - m.rep.val[2]);
}

TEST_CASE("NVLinks lead only to granted GPUs", "[nvml_double]") {
  // The double links every GPU to every other; the guest has host GPUs 0 and 2 of three.
  Daemon d("links", {"--gpus", "0,2", "--nvml", NVML_DOUBLE_PATH});
  Guest g(d.sock, 9);
  const auto link = [&](int dev, unsigned l) {
    const Reply r = g.nvml(NvmlFn::kDeviceNvLinkState, dev, l);
    REQUIRE(r.ret == NVML_SUCCESS);
    return r.rep.val[0];
  };
  CHECK(link(0, 2) == NVML_FEATURE_ENABLED);   // host 0 -> host 2: granted
  CHECK(link(0, 1) == NVML_FEATURE_DISABLED);  // host 0 -> host 1: not granted
  CHECK(link(1, 0) == NVML_FEATURE_ENABLED);   // host 2 -> host 0
  CHECK(link(1, 1) == NVML_FEATURE_DISABLED);  // host 2 -> host 1
  CHECK(link(0, 0) == NVML_FEATURE_DISABLED);  // itself
}

TEST_CASE("without a host NVML every query says LIBRARY_NOT_FOUND", "[nvml_double]") {
  Daemon d("nolib", {"--nvml", "/nonexistent/libnvidia-ml.so.1"});
  Guest g(d.sock, 5);
  CHECK(g.nvml(NvmlFn::kInit, nvml_wire::kNoDevice).ret == NVML_ERROR_LIBRARY_NOT_FOUND);
  CHECK(g.nvml(NvmlFn::kDeviceName, 0).ret == NVML_ERROR_LIBRARY_NOT_FOUND);
  CHECK(g.nvml(NvmlFn::kDeviceCount, nvml_wire::kNoDevice).ret == NVML_ERROR_LIBRARY_NOT_FOUND);
  // Refusals come first all the same.
  CHECK(g.nvml_raw(0, 0, 0, 0, 0).ret == NVML_ERROR_INVALID_ARGUMENT);
  // CUDA goes on.
  std::vector<std::byte> out;
  CHECK(g.call(Op::kDeviceInfo, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
}
