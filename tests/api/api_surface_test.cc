// The exported surface of libcuda.so.1, tested on a library built from nothing but the
// generated API (ivcuda_api_testlib): what it exports, what cuGetProcAddress answers for every
// lookup cudart 13 makes at start-up, and how an unimplemented function fails.
#include <catch2/catch.hpp>

#include "tests/skip.h"

#include <cuda.h>
#include <dlfcn.h>

#include <cstdlib>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "guest/api/api_table.h"

namespace {

using ivcuda::api::detail::kSymbols;
// symbolStatus is read as an int: "left untouched" (-1) is no value of the enum, and loading
// it as one would be undefined behaviour. Same size and register class, so the same ABI.
using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t, int*);
static_assert(sizeof(CUdriverProcAddressQueryResult) == sizeof(int));

struct DlCloser {
  void operator()(void* h) const noexcept { dlclose(h); }
};

// The test library, loaded once: dlclose between tests would reset the stubs' log-once flags.
void* testlib() {
  static std::unique_ptr<void, DlCloser> handle{dlopen(IVCUDA_API_TESTLIB, RTLD_NOW | RTLD_LOCAL)};
  if (!handle) FAIL("dlopen " IVCUDA_API_TESTLIB ": " << dlerror());
  return handle.get();
}

template <class Fn>
Fn symbol(const char* name) {
  void* p = dlsym(testlib(), name);
  if (p == nullptr) FAIL("dlsym " << name << ": " << dlerror());
  return reinterpret_cast<Fn>(p);
}

// Name of the exported function at `address`, as the dynamic linker sees it.
std::string symbol_name_at(void* address) {
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_sname == nullptr) return {};
  if (info.dli_saddr != address) return "(inside " + std::string(info.dli_sname) + ")";
  return info.dli_sname;
}

// nm -D --defined-only, names only; empty optional-like flag when nm could not run.
bool defined_dynamic_symbols(const std::string& path, std::set<std::string>& out) {
  const std::string cmd = "nm -D --defined-only '" + path + "' 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return false;
  char line[512];
  while (std::fgets(line, sizeof line, pipe.get()) != nullptr) {
    std::istringstream in(line);
    std::string addr, type, name;
    if (in >> addr >> type >> name) out.insert(name);
  }
  return pclose(pipe.release()) == 0 && !out.empty();
}

bool file_readable(const char* path) { return access(path, R_OK) == 0; }

struct Lookup {
  CUresult result;
  int status;
  std::string symbol;  // what the returned pointer is, "" for NULL
};

Lookup lookup(const char* name, int version, cuuint64_t flags) {
  static const auto get = symbol<GetProcAddressV2>("cuGetProcAddress_v2");
  void* fn = reinterpret_cast<void*>(&lookup);  // must be overwritten on every path
  auto status = -1;
  const CUresult r = get(name, &fn, version, flags, &status);
  return {r, status, symbol_name_at(fn)};
}

const ivcuda::api::detail::SymbolRow* row_of(std::string_view name) {
  for (const auto& row : kSymbols) {
    if (row.symbol == name) return &row;
  }
  return nullptr;
}

// Graphics interop (cudaGL.h, cudaEGL.h, cudaVDPAU.h) is deliberately not exported: the GPU's
// display side stays on the host. cudart only probes these names and copes with NOT_FOUND.
bool interop_name(std::string_view n) {
  for (std::string_view p : {"cuGL", "cuEGL", "cuVDPAU", "cuGraphicsGL", "cuGraphicsEGL",
                             "cuGraphicsVDPAU", "cuGraphicsResourceGetMappedEgl"}) {
    if (n.substr(0, p.size()) == p) return true;
  }
  return false;
}

// Captures what the calls inside write to stderr (fd 2).
class StderrCapture {
 public:
  StderrCapture() : file_(std::tmpfile()), saved_(dup(2)) {
    REQUIRE(file_ != nullptr);
    REQUIRE(saved_ >= 0);
    std::fflush(stderr);
    REQUIRE(dup2(fileno(file_), 2) == 2);
  }
  ~StderrCapture() { restore(); if (file_) std::fclose(file_); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  std::string text() {
    restore();
    std::string s;
    std::rewind(file_);
    char buf[256];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file_)) > 0) s.append(buf, n);
    return s;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  FILE* file_;
  int saved_;
};

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("api: the library exports exactly the generated table", "[api][nm]") {
  std::set<std::string> exported;
  if (!defined_dynamic_symbols(IVCUDA_API_TESTLIB, exported)) {
    IVCUDA_SKIP("cannot run nm -D on " IVCUDA_API_TESTLIB " (binutils missing?)");
  }
  std::set<std::string> table;
  for (const auto& row : kSymbols) table.insert(std::string(row.symbol));
  std::vector<std::string> extra, missing;
  std::set_difference(exported.begin(), exported.end(), table.begin(), table.end(),
                      std::back_inserter(extra));
  std::set_difference(table.begin(), table.end(), exported.begin(), exported.end(),
                      std::back_inserter(missing));
  INFO("exported but not in the table: " << ::Catch::Detail::stringify(extra));
  INFO("in the table but not exported: " << ::Catch::Detail::stringify(missing));
  CHECK(extra.empty());
  CHECK(missing.empty());
  CHECK(exported.size() == std::size(kSymbols));
}

TEST_CASE("api: the library exports everything NVIDIA's libcuda stub exports", "[api][nm]") {
  if (!file_readable(IVCUDA_NVIDIA_STUB)) {
    IVCUDA_SKIP("no NVIDIA stub at " IVCUDA_NVIDIA_STUB);
  }
  std::set<std::string> ours, nvidia;
  if (!defined_dynamic_symbols(IVCUDA_API_TESTLIB, ours) ||
      !defined_dynamic_symbols(IVCUDA_NVIDIA_STUB, nvidia)) {
    IVCUDA_SKIP("cannot run nm -D (binutils missing?)");
  }
  std::vector<std::string> missing, only_ours;
  std::set_difference(nvidia.begin(), nvidia.end(), ours.begin(), ours.end(),
                      std::back_inserter(missing));
  std::set_difference(ours.begin(), ours.end(), nvidia.begin(), nvidia.end(),
                      std::back_inserter(only_ours));
  INFO("NVIDIA stub exports " << nvidia.size() << ", ours " << ours.size());
  INFO("only ours: " << ::Catch::Detail::stringify(only_ours));
  INFO("NVIDIA exports that are missing: " << ::Catch::Detail::stringify(missing));
  CHECK(missing.empty());
}

TEST_CASE("api: every exported name resolves to itself through dlsym", "[api]") {
  for (const auto& row : kSymbols) {
    const std::string name(row.symbol);
    void* p = dlsym(testlib(), name.c_str());
    INFO(name);
    REQUIRE(p != nullptr);
    CHECK(symbol_name_at(p) == name);
  }
}

TEST_CASE("api: cuGetProcAddress answers every cudart 13 start-up lookup with the right ABI",
          "[api][procaddress]") {
  std::ifstream in(IVCUDA_API_REQUESTS);
  REQUIRE(in.good());
  std::set<std::string> nvidia;
  const bool have_stub =
      file_readable(IVCUDA_NVIDIA_STUB) && defined_dynamic_symbols(IVCUDA_NVIDIA_STUB, nvidia);
  // The toolkit's stub and nm are part of what the README's test command installs.
  if (!have_stub) {
    if (!ivcuda_skips_allowed()) FAIL("NVIDIA's libcuda stub or nm is missing: " IVCUDA_NVIDIA_STUB);
    WARN("per-thread cross-check against NVIDIA's stub SKIPPED (IVCUDA_ALLOW_SKIPS): stub or nm missing");
  }

  std::string line;
  int lines = 0, found = 0;
  while (std::getline(in, line)) {
    // data/cudart13-requests.tsv: symbol, cudaVersion, flags, kind; '-' is the empty name.
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.find('\t');
    REQUIRE(sp != std::string::npos);
    const std::string name = line.substr(0, sp) == "-" ? std::string() : line.substr(0, sp);
    std::istringstream rest(line.substr(sp + 1));
    int version = -1;
    unsigned long long flags = ~0ull;
    REQUIRE(rest >> version >> flags);
    ++lines;
    INFO("request: '" << name << "' @" << version << " flags " << flags);

    const Lookup got = lookup(name.c_str(), version, flags);
    if (name.empty() || interop_name(name)) {
      CHECK(got.result == CUDA_SUCCESS);
      CHECK(got.status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
      CHECK(got.symbol.empty());
      continue;
    }
    REQUIRE(got.result == CUDA_SUCCESS);
    CHECK(got.status == CU_GET_PROC_ADDRESS_SUCCESS);
    ++found;
    const auto* row = row_of(got.symbol);
    INFO("answer: " << got.symbol);
    REQUIRE(row != nullptr);
    CHECK(row->base == name);
    // cudart asks for exactly the ABI generation it was compiled against, so the answer's
    // version is the requested one, not merely an older one.
    CHECK(row->version == version);
    // A per-thread form exactly when one was asked for and NVIDIA's driver has one: the
    // expected name is built from the legacy answer, its existence checked in NVIDIA's stub.
    const std::string legacy = lookup(name.c_str(), version, 0).symbol;
    if (flags == 0) {
      CHECK_FALSE(row->per_thread);
    } else if (have_stub) {
      const bool nvidia_pt = nvidia.count(legacy + "_ptds") + nvidia.count(legacy + "_ptsz") > 0;
      if (nvidia_pt) {
        CHECK((got.symbol == legacy + "_ptds" || got.symbol == legacy + "_ptsz"));
      } else {
        CHECK(got.symbol == legacy);
      }
    }
  }
  CHECK(lines == 440);
  CHECK(found > 400);
}

TEST_CASE("api: cuGetProcAddress picks the ABI generation by version, as the driver does",
          "[api][procaddress]") {
  struct Case {
    const char* name;
    int version;
    cuuint64_t flags;
    const char* want;
  };
  // Answers fixed by NVIDIA's documentation and the cudart contract, written out by hand.
  const Case cases[] = {
      {"cuMemAlloc", 2000, 0, "cuMemAlloc"},
      {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
      {"cuMemAlloc", 13000, 0, "cuMemAlloc_v2"},
      {"cuCtxSynchronize", 2000, 0, "cuCtxSynchronize"},
      {"cuCtxSynchronize", 12090, 0, "cuCtxSynchronize"},
      {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"},
      {"cuCtxGetDevice", 2000, 0, "cuCtxGetDevice"},
      {"cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2"},
      {"cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"},
      {"cuEventElapsedTime", 12070, 0, "cuEventElapsedTime"},
      {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
      {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
      {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},
      {"cuCtxCreate", 11040, 0, "cuCtxCreate_v3"},
      {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"},
      {"cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"},
      // cuda.h maps cuGraphInstantiate to cuGraphInstantiateWithFlags, the driver does not.
      {"cuGraphInstantiate", 12000, 0, "cuGraphInstantiate_v2"},
      {"cuGraphInstantiate", 13000, 0, "cuGraphInstantiate_v2"},
      {"cuMemcpyHtoD", 7000, 2, "cuMemcpyHtoD_v2_ptds"},
      {"cuMemcpyHtoD", 7000, 3, "cuMemcpyHtoD_v2_ptds"},  // PER_THREAD wins over LEGACY
      {"cuMemcpyHtoD", 7000, 1, "cuMemcpyHtoD_v2"},
      {"cuMemcpyHtoD", 7000, 0, "cuMemcpyHtoD_v2"},
      {"cuMemcpy", 7000, 2, "cuMemcpy_ptds"},
      {"cuLaunchKernel", 7000, 2, "cuLaunchKernel_ptsz"},
      {"cuStreamGetCaptureInfo", 10010, 2, "cuStreamGetCaptureInfo_ptsz"},
      {"cuStreamGetCaptureInfo", 12030, 2, "cuStreamGetCaptureInfo_v3_ptsz"},
      {"cuStreamBeginCapture", 10000, 2, "cuStreamBeginCapture_ptsz"},
      {"cuStreamBeginCapture", 10010, 2, "cuStreamBeginCapture_v2_ptsz"},
      {"cuMemcpyBatchAsync", 12080, 2, "cuMemcpyBatchAsync_ptsz"},
      {"cuMemcpyBatchAsync", 13000, 0, "cuMemcpyBatchAsync_v2"},
      {"cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"},
      {"cuDeviceGet", 13000, 2, "cuDeviceGet"},  // no per-thread form: the default one
      {"cuMemPrefetchAsync", 12010, 2, "cuMemPrefetchAsync_ptsz"},
      {"cuMemAlloc", -1, 0, "cuMemAlloc_v2"},  // negative counts as newest, as in the driver
      {"cuProfilerStart", 4000, 0, "cuProfilerStart"},
  };
  for (const auto& c : cases) {
    INFO(c.name << " @" << c.version << " flags " << c.flags);
    const Lookup got = lookup(c.name, c.version, c.flags);
    CHECK(got.result == CUDA_SUCCESS);
    CHECK(got.status == CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(got.symbol == c.want);
  }
}

#define IVCUDA_STR2(x) #x
#define IVCUDA_STR(x) IVCUDA_STR2(x)

TEST_CASE("api: at the headers' own version the answer is what cuda.h's macros name",
          "[api][procaddress]") {
  // cuda.h maps each public name to its current ABI by macro; that is a second, independent
  // statement of the newest generation of each of these names. (Not for cuGraphInstantiate,
  // which cuda.h renames to another function but the driver keeps answering with _v2.)
  const std::pair<const char*, const char*> cases[] = {
#define IVCUDA_LATEST(n) {#n, IVCUDA_STR(n)}
      IVCUDA_LATEST(cuDeviceTotalMem),   IVCUDA_LATEST(cuCtxCreate),
      IVCUDA_LATEST(cuModuleGetGlobal),  IVCUDA_LATEST(cuMemGetInfo),
      IVCUDA_LATEST(cuMemAlloc),         IVCUDA_LATEST(cuMemFree),
      IVCUDA_LATEST(cuMemHostRegister),  IVCUDA_LATEST(cuMemcpyHtoD),
      IVCUDA_LATEST(cuMemcpyDtoHAsync),  IVCUDA_LATEST(cuMemsetD2D32),
      IVCUDA_LATEST(cuCtxDestroy),       IVCUDA_LATEST(cuCtxPushCurrent),
      IVCUDA_LATEST(cuStreamDestroy),    IVCUDA_LATEST(cuEventDestroy),
      IVCUDA_LATEST(cuTexRefSetAddress2D), IVCUDA_LATEST(cuLinkCreate),
      IVCUDA_LATEST(cuStreamBeginCapture), IVCUDA_LATEST(cuDevicePrimaryCtxRelease),
      IVCUDA_LATEST(cuIpcOpenMemHandle), IVCUDA_LATEST(cuGraphInstantiateWithFlags),
      IVCUDA_LATEST(cuGraphExecUpdate),  IVCUDA_LATEST(cuGetProcAddress),
      IVCUDA_LATEST(cuGraphAddKernelNode), IVCUDA_LATEST(cuGraphGetEdges),
      IVCUDA_LATEST(cuEventElapsedTime), IVCUDA_LATEST(cuStreamWaitValue32),
      IVCUDA_LATEST(cuStreamGetCaptureInfo), IVCUDA_LATEST(cuMemPrefetchAsync),
      IVCUDA_LATEST(cuMemAdvise),        IVCUDA_LATEST(cuMemcpyBatchAsync),
#undef IVCUDA_LATEST
  };
  for (const auto& [name, want] : cases) {
    INFO(name);
    const Lookup got = lookup(name, CUDA_VERSION, 0);
    CHECK(got.result == CUDA_SUCCESS);
    CHECK(got.symbol == want);
  }
}

TEST_CASE("api: cuGetProcAddress reports what it cannot answer", "[api][procaddress]") {
  // As NVIDIA's driver: "not found" is CUDA_SUCCESS with a NULL pointer and the reason in
  // symbolStatus; only malformed requests are errors, and those leave the outputs alone.
  SECTION("empty, unknown and interop names are not found") {
    for (const char* name : {"", "cuNoSuchFunction", "cuMemAlloc_v2", "cuGLInit", "cumemalloc"}) {
      INFO("'" << name << "'");
      const Lookup got = lookup(name, 13000, 0);
      CHECK(got.result == CUDA_SUCCESS);
      CHECK(got.status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
      CHECK(got.symbol.empty());
    }
  }
  SECTION("a version older than the first ABI is not sufficient") {
    const std::tuple<const char*, int, cuuint64_t> cases[] = {
        {"cuMemAlloc", 1000, 0},       {"cuGetProcAddress", 11020, 0},
        {"cuLibraryLoadData", 11080, 0}, {"cuInit", 0, 0},
        // Per-thread requests are answered from the per-thread forms only, which are newer.
        {"cuMemcpyHtoD", 3020, 2},     {"cuMemcpy", 4000, 2}, {"cuLaunchKernel", 6050, 2}};
    for (auto [name, version, flags] : cases) {
      INFO(name << " @" << version << " flags " << flags);
      const Lookup got = lookup(name, version, flags);
      CHECK(got.result == CUDA_SUCCESS);
      CHECK(got.status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
      CHECK(got.symbol.empty());
    }
  }
  SECTION("malformed requests are invalid values and touch nothing") {
    const auto get = symbol<GetProcAddressV2>("cuGetProcAddress_v2");
    const std::tuple<const char*, int, cuuint64_t> cases[] = {
        {"cuMemAlloc", CUDA_VERSION + 10, 0}, {"cuMemAlloc", 3020, 4},
        {"cuMemAlloc", 3020, 1ull << 63},    {nullptr, 3020, 0}};
    for (auto [name, version, flags] : cases) {
      INFO((name ? name : "(null)") << " @" << version << " flags " << flags);
      int marker = 0;
      void* fn = &marker;
      auto status = -1;
      CHECK(get(name, &fn, version, flags, &status) == CUDA_ERROR_INVALID_VALUE);
      CHECK(fn == &marker);
      CHECK(status == -1);
    }
    int status = 0;
    CHECK(get("cuMemAlloc", nullptr, 3020, 0, &status) == CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("symbolStatus is optional, and the CUDA 11.3 entry point works too") {
    const auto get = symbol<GetProcAddressV2>("cuGetProcAddress_v2");
    void* fn = nullptr;
    CHECK(get("cuInit", &fn, 2000, 0, nullptr) == CUDA_SUCCESS);
    CHECK(symbol_name_at(fn) == "cuInit");
    using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
    const auto v1 = symbol<GetProcAddressV1>("cuGetProcAddress");
    fn = nullptr;
    CHECK(v1("cuMemAlloc", &fn, 3020, 0) == CUDA_SUCCESS);
    CHECK(symbol_name_at(fn) == "cuMemAlloc_v2");
    CHECK(v1("cuNoSuchFunction", &fn, 3020, 0) == CUDA_SUCCESS);
    CHECK(fn == nullptr);
  }
}

TEST_CASE("api: a hand-written definition replaces the generated stub everywhere", "[api]") {
  using DriverGetVersion = CUresult (*)(int*);
  const auto direct = symbol<DriverGetVersion>("cuDriverGetVersion");
  int version = 0;
  CHECK(direct(&version) == CUDA_SUCCESS);
  CHECK(version == CUDA_VERSION);
  const Lookup got = lookup("cuDriverGetVersion", 2020, 0);
  REQUIRE(got.result == CUDA_SUCCESS);
  CHECK(got.symbol == "cuDriverGetVersion");
  void* fn = nullptr;
  REQUIRE(symbol<GetProcAddressV2>("cuGetProcAddress_v2")("cuDriverGetVersion", &fn, 2020, 0,
                                                          nullptr) == CUDA_SUCCESS);
  CHECK(fn == reinterpret_cast<void*>(direct));
}

TEST_CASE("api: an unimplemented function returns NOT_SUPPORTED and says so once", "[api][stub]") {
  using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);
  using CtxGetDevice = CUresult (*)(CUdevice*, CUcontext);
  const auto alloc = symbol<MemAlloc>("cuMemAlloc_v2");
  const auto get_device = symbol<CtxGetDevice>("cuCtxGetDevice_v2");
  CUdeviceptr ptr = 0;
  CUdevice dev = 0;
  StderrCapture capture;
  CHECK(alloc(&ptr, 4096) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(alloc(&ptr, 4096) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(get_device(&dev, nullptr) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(alloc(&ptr, 1) == CUDA_ERROR_NOT_SUPPORTED);
  const std::string log = capture.text();
  INFO("stderr: " << log);
  CHECK(count(log, "ivcuda: cuMemAlloc_v2 is not supported yet\n") == 1);
  CHECK(count(log, "ivcuda: cuCtxGetDevice_v2 is not supported yet\n") == 1);
  CHECK(count(log, "\n") == 2);
  CHECK(ptr == 0);  // a stub touches nothing
}

TEST_CASE("api: racing threads still get one log line per unsupported function", "[api][stub]") {
  using StreamQuery = CUresult (*)(CUstream);
  const auto query = symbol<StreamQuery>("cuStreamQuery_ptsz");
  StderrCapture capture;
  std::atomic<int> not_supported{0};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 200; ++i) not_supported += query(nullptr) == CUDA_ERROR_NOT_SUPPORTED;
      });
    }
  }
  const std::string log = capture.text();
  CHECK(not_supported == 8 * 200);
  CHECK(log == "ivcuda: cuStreamQuery_ptsz is not supported yet\n");
}

