// cuGetExportTable (guest/export_tables.cc) against the contracts in
// shared/reference, with fake hooks (export_hooks_fake.cc) in place of the
// daemon-backed library.
#include <catch2/catch.hpp>
#include <cuda.h>
#include <dirent.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "guest/compile_cache.h"
#include "guest/export_tables.h"
#include "guest/md2.h"
#include "tests/api/export_hooks_fake.h"

namespace {

namespace fake = ivcuda::guest::fake;
namespace md2 = ivcuda::guest::md2;
using Bytes = std::vector<std::uint8_t>;

CUuuid uuid_of(const char* hex) {
  CUuuid u{};
  REQUIRE(std::strlen(hex) == 32);
  for (int i = 0; i < 16; ++i) {
    unsigned v = 0;
    REQUIRE(std::sscanf(hex + 2 * i, "%2x", &v) == 1);
    u.bytes[i] = static_cast<char>(v);
  }
  return u;
}

const void* const* fetch(const char* hex) {
  const CUuuid id = uuid_of(hex);
  const void* table = nullptr;
  REQUIRE(cuGetExportTable(&table, &id) == CUDA_SUCCESS);
  REQUIRE(table != nullptr);
  return static_cast<const void* const*>(table);
}

std::uintptr_t size_word(const void* const* t) { return reinterpret_cast<std::uintptr_t>(t[0]); }

template <class Fn>
Fn* slot_fn(const void* const* t, std::size_t i) {
  REQUIRE(t[i] != nullptr);
  return reinterpret_cast<Fn*>(const_cast<void*>(t[i]));
}

constexpr const char* kCudartInterface = "6bd5fb6c5bf4e74a8987d93912fd9df9";
constexpr const char* kToolsHooks = "a094798c2e742e7493f20800200c0a66";
constexpr const char* kToolsTls = "42d85a8123f6cb478298f6e78a3aecdc";
constexpr const char* kCls = "c693336e1121df11a8c368f355d89593";
constexpr const char* kContextChecks = "263e88607cd2614392f6bbd5006dfa7e";
constexpr const char* kIntegrity = "d4082055bde6704b8d34ba123c66e1f2";
constexpr const char* kCtxStreamIds = "21318c60971432488ca641ff7324c8f2";
constexpr const char* kModuleEnum = "6e163fbeb958444d835ce182aff1991e";
constexpr const char* kLtMatmul = "1734dc26800d47458726c0f1e7dd8bca";
constexpr const char* kNvrtcCache = "da9151d33ae6cc41a5c04f26d533e328";
constexpr const char* kLogger = "f8cff95121468b4eb9e2fb469e7c0dd9";

// Redirects fd 2 into a temporary file for its lifetime; text() reads it back.
class StderrCapture {
 public:
  StderrCapture() : file_(std::tmpfile()) {
    REQUIRE(file_ != nullptr);
    std::fflush(stderr);
    saved_ = dup(2);
    REQUIRE(saved_ >= 0);
    REQUIRE(dup2(fileno(file_), 2) == 2);
  }
  ~StderrCapture() {
    restore();
    std::fclose(file_);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  std::string text() {
    restore();
    std::string out;
    std::rewind(file_);
    char buf[512];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) out.append(buf, n);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  std::FILE* file_;
  int saved_ = -1;
};

std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + 1)) ++n;
  return n;
}

CUcontext ctx_handle(std::uintptr_t v) { return reinterpret_cast<CUcontext>(v); }
void* key_of(std::uintptr_t v) { return reinterpret_cast<void*>(v); }

// ---- an independent MD2 / HMAC-MD2 for cross-checks ---------------------------
// One-shot over a fully padded copy of the message, written from RFC 1319's
// step list rather than sharing structure with guest/md2.cc.

constexpr std::uint8_t kS[256] = {
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19,
    98, 167, 5, 243, 192, 199, 115, 140, 152, 147, 43, 217, 188, 76, 130, 202,
    30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18,
    190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122,
    169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33,
    128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3,
    255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198,
    79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4, 241,
    69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2,
    27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15,
    85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38,
    44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82,
    106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57,
    242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10,
    49, 68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
};

Bytes ref_md2(Bytes m) {
  const std::size_t pad = 16 - m.size() % 16;
  m.insert(m.end(), pad, static_cast<std::uint8_t>(pad));
  std::uint8_t c[16] = {};
  std::uint8_t l = 0;
  for (std::size_t i = 0; i < m.size() / 16; ++i)
    for (std::size_t j = 0; j < 16; ++j) l = c[j] ^= kS[m[i * 16 + j] ^ l];
  m.insert(m.end(), c, c + 16);
  std::uint8_t x[48] = {};
  for (std::size_t i = 0; i < m.size() / 16; ++i) {
    for (std::size_t j = 0; j < 16; ++j) {
      x[16 + j] = m[i * 16 + j];
      x[32 + j] = x[16 + j] ^ x[j];
    }
    unsigned t = 0;
    for (unsigned j = 0; j < 18; ++j) {
      for (std::size_t k = 0; k < 48; ++k) t = x[k] ^= kS[t];
      t = (t + j) % 256;
    }
  }
  return Bytes(x, x + 16);
}

Bytes ref_hmac(Bytes key, const Bytes& msg) {
  if (key.size() > 16) key = ref_md2(key);
  key.resize(16, 0);
  Bytes inner, outer;
  for (auto b : key) inner.push_back(b ^ 0x36);
  inner.insert(inner.end(), msg.begin(), msg.end());
  const Bytes ih = ref_md2(inner);
  for (auto b : key) outer.push_back(b ^ 0x5c);
  outer.insert(outer.end(), ih.begin(), ih.end());
  return ref_md2(outer);
}

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

std::string hex(std::span<const std::uint8_t> d) {
  std::string s;
  char b[3];
  for (auto v : d) {
    std::snprintf(b, sizeof b, "%02x", v);
    s += b;
  }
  return s;
}

}  // namespace

TEST_CASE("every table the contracts name exists with its size word", "[export]") {
  struct Expect {
    const char* id;
    std::uintptr_t size;  // 0: no size word (checked separately)
    std::vector<std::size_t> filled;
  };
  const Expect expect[] = {
      {kCudartInterface, 0x50, {2}},
      {kToolsHooks, 0x38, {2, 6}},
      {kToolsTls, 0x18, {2}},
      {kContextChecks, 0x20, {2, 3}},
      {kIntegrity, 0x18, {1}},
      {kCtxStreamIds, 0x2e8, {4, 39, 51}},
      {kModuleEnum, 0x318, {7}},
      {kLtMatmul, 0x88, {4, 13}},
      {kNvrtcCache, 0x38, {1, 2, 3, 4, 5, 6}},
  };
  for (const auto& e : expect) {
    INFO(e.id);
    const void* const* t = fetch(e.id);
    CHECK(size_word(t) == e.size);
    for (auto i : e.filled) CHECK(t[i] != nullptr);
    // Tables are handed out by address and hashed by address: the same every time.
    CHECK(fetch(e.id) == t);
  }
  CHECK(size_word(fetch(kToolsHooks)) > 48);
  CHECK(size_word(fetch(kModuleEnum)) > 0x37);

  const void* const* cls = fetch(kCls);
  CHECK(cls[0] != nullptr);
  CHECK(cls[1] != nullptr);
  CHECK(cls[2] != nullptr);
  CHECK(cls[3] == nullptr);
}

TEST_CASE("refused and unknown tables", "[export]") {
  const void* table = reinterpret_cast<const void*>(0x1234);
  CUuuid id = uuid_of(kCudartInterface);
  CHECK(cuGetExportTable(nullptr, &id) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGetExportTable(&table, nullptr) == CUDA_ERROR_INVALID_VALUE);

  SECTION("the logger is refused without a log line") {
    StderrCapture cap;
    id = uuid_of(kLogger);
    table = reinterpret_cast<const void*>(0x1234);
    CHECK(cuGetExportTable(&table, &id) == CUDA_ERROR_INVALID_VALUE);
    CHECK(table == nullptr);
    CHECK(cap.text().empty());
  }

  SECTION("NVIDIA's NVML table is refused, with one line naming ivcuda's libnvidia-ml.so.1") {
    StderrCapture cap;
    for (int i = 0; i < 3; ++i) {
      id = uuid_of("69a28e9f24498b47b030c5da330ea4e9");
      table = reinterpret_cast<const void*>(0x1234);
      CHECK(cuGetExportTable(&table, &id) == CUDA_ERROR_INVALID_VALUE);
      CHECK(table == nullptr);
    }
    CHECK(count_of(cap.text(), "use ivcuda's libnvidia-ml.so.1") == 1);
  }

  SECTION("an unknown UUID is refused and logged once with the caller's library") {
    // A known UUID with its last byte changed: matching must use all 16 bytes.
    const char* unknown = "6bd5fb6c5bf4e74a8987d93912fd9d00";
    const char* other = "00112233445566778899aabbccddeeff";
    StderrCapture cap;
    for (int i = 0; i < 3; ++i) {
      for (const char* hex : {unknown, other}) {
        id = uuid_of(hex);
        table = reinterpret_cast<const void*>(0x1234);
        CHECK(cuGetExportTable(&table, &id) == CUDA_ERROR_INVALID_VALUE);
        CHECK(table == nullptr);
      }
    }
    const std::string log = cap.text();
    INFO(log);
    CHECK(count_of(log, unknown) == 1);
    CHECK(count_of(log, other) == 1);
    CHECK(count_of(log, "ivcuda: ") == 2);
    // dladdr names the object that called: this test executable.
    CHECK(count_of(log, "export_tables_test") == 2);
  }
}

TEST_CASE("CUDART_INTERFACE[2] gives the primary context without activating it", "[export]") {
  fake::config().devices = {{}, {}};
  fake::set_current(nullptr);
  auto fn = slot_fn<CUresult(CUcontext*, CUdevice)>(fetch(kCudartInterface), 2);
  CUcontext ctx = nullptr;
  REQUIRE(fn(&ctx, 1) == CUDA_SUCCESS);
  CHECK(ctx == fake::primary_of(1));
  CUcontext cur = ctx_handle(1);
  auto tls = slot_fn<CUresult(CUcontext*)>(fetch(kToolsTls), 2);
  REQUIRE(tls(&cur) == CUDA_SUCCESS);
  CHECK(cur == nullptr);
  CHECK(fn(&ctx, 2) == CUDA_ERROR_INVALID_DEVICE);
  CHECK(fn(nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("TOOLS_RUNTIME_CALLBACK_HOOKS hand out zeroed buffers of the lengths cudart needs", "[export]") {
  const void* const* t = fetch(kToolsHooks);
  struct Want {
    std::size_t slot, more_than;
  };
  void* seen[2] = {};
  int n = 0;
  for (const Want w : {Want{2, 522}, Want{6, 13}}) {
    auto fn = slot_fn<CUresult(void**, std::size_t*)>(t, w.slot);
    void* buf = nullptr;
    std::size_t len = 0;
    REQUIRE(fn(&buf, &len) == CUDA_SUCCESS);
    REQUIRE(buf != nullptr);
    CHECK(len > w.more_than);
    const auto* p = static_cast<const unsigned char*>(buf);
    CHECK(std::all_of(p, p + len, [](unsigned char c) { return c == 0; }));
    void* again = nullptr;
    REQUIRE(fn(&again, &len) == CUDA_SUCCESS);
    CHECK(again == buf);
    seen[n++] = buf;
  }
  CHECK(seen[0] != seen[1]);
}

TEST_CASE("TOOLS_TLS[2] always writes the current context", "[export]") {
  auto fn = slot_fn<CUresult(CUcontext*)>(fetch(kToolsTls), 2);
  CUcontext out = ctx_handle(0xdead);
  fake::set_current(ctx_handle(0x5000));
  REQUIRE(fn(&out) == CUDA_SUCCESS);
  CHECK(out == ctx_handle(0x5000));
  fake::set_current(nullptr);
  out = ctx_handle(0xdead);
  REQUIRE(fn(&out) == CUDA_SUCCESS);
  CHECK(out == nullptr);
  CHECK(fn(nullptr) == CUDA_ERROR_INVALID_VALUE);
}

namespace {

using ClsDtor = void (*)(CUcontext, void*, void*);
using ClsPut = CUresult(CUcontext, void*, void*, ClsDtor);
using ClsDelete = CUresult(CUcontext, void*);
using ClsGet = CUresult(void**, CUcontext, void*);

struct DtorCall {
  CUcontext ctx;
  void* key;
  void* value;
};
std::vector<DtorCall> g_dtor_calls;
void record_dtor(CUcontext ctx, void* key, void* value) { g_dtor_calls.push_back({ctx, key, value}); }

struct Cls {
  ClsPut* put;
  ClsDelete* del;
  ClsGet* get;
  Cls() {
    const void* const* t = fetch(kCls);
    put = slot_fn<ClsPut>(t, 0);
    del = slot_fn<ClsDelete>(t, 1);
    get = slot_fn<ClsGet>(t, 2);
  }
};

// The dtor of the re-entrancy test uses the table again from inside the
// destructor run: proves no lock is held while destructors run.
void reentrant_dtor(CUcontext, void* key, void* value) {
  Cls cls;
  REQUIRE(cls.put(ctx_handle(0x9900), key, value, nullptr) == CUDA_SUCCESS);
}

}  // namespace

TEST_CASE("CONTEXT_LOCAL_STORAGE keeps a map per context", "[export][cls]") {
  Cls cls;
  const CUcontext a = ctx_handle(0x1100), b = ctx_handle(0x2200);
  void* const k1 = key_of(0x10);
  void* const k2 = key_of(0x20);
  void* v = nullptr;
  fake::set_current(nullptr);
  g_dtor_calls.clear();

  SECTION("put, get and delete by explicit context and by NULL = current") {
    CHECK(cls.get(&v, a, k1) == CUDA_ERROR_INVALID_VALUE);  // miss
    REQUIRE(cls.put(a, k1, key_of(0xa1), nullptr) == CUDA_SUCCESS);
    REQUIRE(cls.get(&v, a, k1) == CUDA_SUCCESS);
    CHECK(v == key_of(0xa1));
    CHECK(cls.get(&v, a, k2) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cls.get(&v, b, k1) == CUDA_ERROR_INVALID_VALUE);

    fake::set_current(b);
    REQUIRE(cls.put(nullptr, k1, key_of(0xb1), nullptr) == CUDA_SUCCESS);
    REQUIRE(cls.get(&v, b, k1) == CUDA_SUCCESS);
    CHECK(v == key_of(0xb1));
    REQUIRE(cls.get(&v, nullptr, k1) == CUDA_SUCCESS);
    CHECK(v == key_of(0xb1));
    REQUIRE(cls.get(&v, a, k1) == CUDA_SUCCESS);
    CHECK(v == key_of(0xa1));

    // A second put replaces the value.
    REQUIRE(cls.put(nullptr, k1, key_of(0xb2), nullptr) == CUDA_SUCCESS);
    REQUIRE(cls.get(&v, nullptr, k1) == CUDA_SUCCESS);
    CHECK(v == key_of(0xb2));

    REQUIRE(cls.del(nullptr, k1) == CUDA_SUCCESS);
    CHECK(cls.get(&v, b, k1) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cls.del(nullptr, k1) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cls.get(&v, a, k1) == CUDA_SUCCESS);
    REQUIRE(cls.del(a, k1) == CUDA_SUCCESS);
    CHECK(cls.get(&v, a, k1) == CUDA_ERROR_INVALID_VALUE);
    fake::set_current(nullptr);
  }

  SECTION("NULL without a current context is an error, not a shared map") {
    CHECK(cls.put(nullptr, k1, key_of(1), nullptr) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cls.get(&v, nullptr, k1) != CUDA_SUCCESS);
    CHECK(cls.del(nullptr, k1) != CUDA_SUCCESS);
    CHECK(cls.get(nullptr, a, k1) == CUDA_ERROR_INVALID_VALUE);
  }

  SECTION("destructors run once when their context goes, and only theirs") {
    REQUIRE(cls.put(a, k1, key_of(0xa1), record_dtor) == CUDA_SUCCESS);
    REQUIRE(cls.put(a, k2, key_of(0xa2), record_dtor) == CUDA_SUCCESS);
    REQUIRE(cls.put(b, k1, key_of(0xb1), record_dtor) == CUDA_SUCCESS);
    REQUIRE(cls.put(a, key_of(0x30), key_of(0xa3), nullptr) == CUDA_SUCCESS);  // no dtor: fine
    // delete forgets without destroying
    REQUIRE(cls.put(b, k2, key_of(0xb2), record_dtor) == CUDA_SUCCESS);
    REQUIRE(cls.del(b, k2) == CUDA_SUCCESS);
    CHECK(g_dtor_calls.empty());

    ivcuda::guest::export_tables_context_gone(a);
    REQUIRE(g_dtor_calls.size() == 2);
    std::sort(g_dtor_calls.begin(), g_dtor_calls.end(),
              [](const DtorCall& x, const DtorCall& y) { return x.key < y.key; });
    CHECK(g_dtor_calls[0].ctx == a);
    CHECK(g_dtor_calls[0].key == k1);
    CHECK(g_dtor_calls[0].value == key_of(0xa1));
    CHECK(g_dtor_calls[1].ctx == a);
    CHECK(g_dtor_calls[1].key == k2);
    CHECK(g_dtor_calls[1].value == key_of(0xa2));
    CHECK(cls.get(&v, a, k1) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cls.get(&v, a, key_of(0x30)) == CUDA_ERROR_INVALID_VALUE);

    // Gone is gone: a second call runs nothing; b is untouched.
    ivcuda::guest::export_tables_context_gone(a);
    ivcuda::guest::export_tables_context_gone(nullptr);
    CHECK(g_dtor_calls.size() == 2);
    REQUIRE(cls.get(&v, b, k1) == CUDA_SUCCESS);
    CHECK(v == key_of(0xb1));

    ivcuda::guest::export_tables_context_gone(b);
    REQUIRE(g_dtor_calls.size() == 3);
    CHECK(g_dtor_calls[2].ctx == b);
    CHECK(g_dtor_calls[2].value == key_of(0xb1));
  }

  SECTION("a destructor may call the table") {
    REQUIRE(cls.put(a, k1, key_of(0x77), reentrant_dtor) == CUDA_SUCCESS);
    ivcuda::guest::export_tables_context_gone(a);
    REQUIRE(cls.get(&v, ctx_handle(0x9900), k1) == CUDA_SUCCESS);
    CHECK(v == key_of(0x77));
    ivcuda::guest::export_tables_context_gone(ctx_handle(0x9900));
  }
}

namespace {
std::atomic<int> g_threaded_dtors{0};
void count_dtor(CUcontext, void*, void*) { g_threaded_dtors.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

TEST_CASE("CONTEXT_LOCAL_STORAGE is thread-safe", "[export][cls]") {
  Cls cls;
  constexpr int kThreads = 8;
  constexpr int kRounds = 2000;
  constexpr std::uintptr_t kShared = 0x4400;  // every thread's current context
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      fake::set_current(ctx_handle(kShared));
      const auto own = static_cast<std::uintptr_t>(0x10000 + t * 0x100);
      for (int i = 0; i < kRounds; ++i) {
        void* const key = key_of(own + static_cast<std::uintptr_t>(i % 4));
        void* const value = key_of(own * 1000 + static_cast<std::uintptr_t>(i));
        void* got = nullptr;
        // One map per context: this thread's private context, and the shared current one.
        const CUcontext mine = ctx_handle(own);
        if (cls.put(mine, key, value, count_dtor) != CUDA_SUCCESS) failures++;
        if (cls.put(nullptr, key, value, nullptr) != CUDA_SUCCESS) failures++;
        if (cls.get(&got, mine, key) != CUDA_SUCCESS || got != value) failures++;
        if (cls.get(&got, nullptr, key) != CUDA_SUCCESS || got != value) failures++;
        if (i % 3 == 0 && cls.del(nullptr, key) != CUDA_SUCCESS) failures++;
        if (i % 500 == 499) ivcuda::guest::export_tables_context_gone(mine);
      }
      ivcuda::guest::export_tables_context_gone(ctx_handle(own));
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  // Each private context held 4 keys with a destructor at each of its 4 goes.
  CHECK(g_threaded_dtors.load() == kThreads * 4 * 4);
  ivcuda::guest::export_tables_context_gone(ctx_handle(kShared));
}

TEST_CASE("CONTEXT_CHECKS answer 'not wrapped'", "[export]") {
  const void* const* t = fetch(kContextChecks);
  CHECK(slot_fn<CUresult()>(t, 3)() == CUDA_SUCCESS);
  std::uint32_t wrapped = 0xffffffffu;
  void* inner = key_of(0x42);
  CHECK(slot_fn<CUresult(CUcontext, std::uint32_t*, void**)>(t, 2)(ctx_handle(0x1100), &wrapped, &inner) ==
        CUDA_SUCCESS);
  CHECK(wrapped == 0);
}

TEST_CASE("21318c60: context ids, stream resolution and distinct stream ids", "[export]") {
  const void* const* t = fetch(kCtxStreamIds);
  auto ctx_id = slot_fn<CUresult(CUcontext, std::uint64_t*)>(t, 4);
  auto resolve = slot_fn<CUresult(CUcontext, CUstream, void**, int)>(t, 51);
  auto stream_id = slot_fn<CUresult(CUcontext, void*, std::uint64_t*)>(t, 39);
  const CUcontext a = ctx_handle(0x1100);

  std::uint64_t id = 0;
  REQUIRE(ctx_id(a, &id) == CUDA_SUCCESS);
  CHECK(id == fake::context_id_of(a));
  CHECK(ctx_id(a, nullptr) == CUDA_ERROR_INVALID_VALUE);

  const CUstream s1 = reinterpret_cast<CUstream>(0x7100);
  const CUstream s2 = reinterpret_cast<CUstream>(0x7200);
  std::vector<std::uint64_t> ids;
  for (CUstream s : {s1, s2, static_cast<CUstream>(nullptr)}) {
    void* internal = key_of(1);
    REQUIRE(resolve(a, s, &internal, 0) == CUDA_SUCCESS);
    CHECK(internal == static_cast<void*>(s));
    REQUIRE(stream_id(a, internal, &id) == CUDA_SUCCESS);
    CHECK(id == fake::stream_id_of(s));
    ids.push_back(id);
  }
  // Per-thread default stream: NULL names the thread's own stream.
  void* internal = nullptr;
  REQUIRE(resolve(a, nullptr, &internal, 1) == CUDA_SUCCESS);
  CHECK(internal == static_cast<void*>(CU_STREAM_PER_THREAD));
  REQUIRE(stream_id(a, internal, &id) == CUDA_SUCCESS);
  ids.push_back(id);
  REQUIRE(resolve(a, s1, &internal, 1) == CUDA_SUCCESS);
  CHECK(internal == static_cast<void*>(s1));

  std::sort(ids.begin(), ids.end());
  CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
  CHECK(resolve(a, s1, nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(stream_id(a, s1, nullptr) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("cuFFT's and cuBLASLt's tables", "[export]") {
  using Callback = void (*)(void*, CUfunction);
  auto enumerate = slot_fn<CUresult(CUcontext, CUmodule, Callback, void*)>(fetch(kModuleEnum), 7);
  CHECK(enumerate(nullptr, nullptr, nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);
  std::vector<CUfunction> seen;
  const Callback note = [](void* user, CUfunction f) { static_cast<std::vector<CUfunction>*>(user)->push_back(f); };
  CHECK(enumerate(nullptr, nullptr, note, &seen) == CUDA_ERROR_INVALID_HANDLE);
  // Every kernel goes to the callback, and success is 1, which is what cuFFT checks for.
  auto* mod = static_cast<CUmodule>(key_of(0x40));
  CHECK(enumerate(nullptr, mod, note, &seen) == static_cast<CUresult>(1));
  CHECK(seen == std::vector<CUfunction>{reinterpret_cast<CUfunction>(reinterpret_cast<std::uintptr_t>(mod) + 1),
                                        reinterpret_cast<CUfunction>(reinterpret_cast<std::uintptr_t>(mod) + 2)});

  const void* const* lt = fetch(kLtMatmul);
  void* h1 = key_of(0x55);
  void* h2 = key_of(0x66);
  CHECK(slot_fn<CUresult(void**, void**)>(lt, 4)(&h1, &h2) == CUDA_SUCCESS);
  CHECK(h1 == nullptr);
  CHECK(slot_fn<CUresult(void*, void*, int, int, void*, int)>(lt, 13)(h1, h2, 2, 1, nullptr, 0) == CUDA_SUCCESS);
}

// The slots as NVRTC calls them (guest/compile_cache.h): open, close, lookup, store, -, release.
struct NvrtcSlots {
  using U = std::uint64_t;
  int (*open)(void**, std::uint32_t, const void*, std::size_t, const char*, const char*);
  int (*close)(void*, U, U, U, U, U);
  int (*lookup)(void*, U, void**, std::uint32_t*, U, U);
  int (*store)(void*, U, const void*, std::size_t, U, U);
  int (*release)(void*, U, U, U, U, U);
  NvrtcSlots() {
    const void* const* t = fetch(kNvrtcCache);
    open = slot_fn<int(void**, std::uint32_t, const void*, std::size_t, const char*, const char*)>(t, 1);
    close = slot_fn<int(void*, U, U, U, U, U)>(t, 2);
    lookup = slot_fn<int(void*, U, void**, std::uint32_t*, U, U)>(t, 3);
    store = slot_fn<int(void*, U, const void*, std::size_t, U, U)>(t, 4);
    release = slot_fn<int(void*, U, U, U, U, U)>(t, 6);
  }
};

// A cache directory of this test's own (CUDA_CACHE_PATH), so that no earlier run's files answer.
std::string fresh_cache_dir() {
  char dir[] = "/tmp/ivcuda-nvrtc-cache.XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  ::setenv("CUDA_CACHE_PATH", dir, 1);
  ::unsetenv("CUDA_CACHE_DISABLE");
  ::unsetenv("CUDA_CACHE_MAXSIZE");
  return std::string(dir) + "/ivcuda-nvrtc";
}

// The cache's files (*.ivc) in dir and their bytes.
std::pair<int, std::uint64_t> cache_files(const std::string& dir) {
  std::pair<int, std::uint64_t> n{0, 0};
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return n;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 4 || name.substr(name.size() - 4) != ".ivc") continue;
    std::ifstream f(dir + "/" + name, std::ios::binary | std::ios::ate);
    ++n.first;
    n.second += static_cast<std::uint64_t>(f.tellg());
  }
  ::closedir(d);
  return n;
}

TEST_CASE("NVRTC's compile cache gives back what was stored for the same key, and only for it", "[export]") {
  (void)fresh_cache_dir();
  const NvrtcSlots n;
  const std::string input = std::string("BC\xc0\xde", 4) + "some bitcode";
  auto entry = [&](std::uint32_t stage, const std::string& in, const char* opts, const char* build) {
    void* e = nullptr;
    REQUIRE(n.open(&e, stage, in.data(), in.size(), opts, build) == 0);
    REQUIRE(e != nullptr);
    return e;
  };
  constexpr int kNotFound = 500;
  void* e = entry(2, input, " -arch=compute_90", "HOST64.build");
  void* data = nullptr;
  std::uint32_t len = 0;
  CHECK(n.lookup(e, 0, &data, &len, 0, 0) == kNotFound);
  const std::string ptx = "// Generated PTX\n.version 9.0\n";
  CHECK(n.store(e, 0, ptx.data(), ptx.size(), 0, 0) == 0);
  CHECK(n.close(e, 0, 0, 0, 0, 0) == 0);
  // The same key in a new entry: a hit, with the bytes; released by slot 6.
  e = entry(2, input, " -arch=compute_90", "HOST64.build");
  REQUIRE(n.lookup(e, 0, &data, &len, 0, 0) == 0);
  REQUIRE(data != nullptr);
  CHECK(std::string(static_cast<const char*>(data), len) == ptx);
  CHECK(n.release(data, 0, 0, 0, 0, 0) == 0);
  CHECK(n.close(e, 0, 0, 0, 0, 0) == 0);
  // Any part of the key different: a miss.
  for (void* other : {entry(1, input, " -arch=compute_90", "HOST64.build"),
                      entry(2, input + "x", " -arch=compute_90", "HOST64.build"),
                      entry(2, input, " -arch=compute_80", "HOST64.build"),
                      entry(2, input, " -arch=compute_90", "HOST64.other"), entry(2, input, nullptr, "HOST64.build")}) {
    CHECK(n.lookup(other, 0, &data, &len, 0, 0) == kNotFound);
    CHECK(n.close(other, 0, 0, 0, 0, 0) == 0);
  }
  CHECK(n.open(nullptr, 2, input.data(), input.size(), nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(n.lookup(nullptr, 0, &data, &len, 0, 0) == CUDA_ERROR_INVALID_VALUE);
}

// What one process stored, the guest's next process finds in the cache directory, as the
// driver's JIT cache is found across processes; a damaged file is a miss; CUDA_CACHE_DISABLE=1
// writes none; CUDA_CACHE_MAXSIZE bounds the directory.
TEST_CASE("NVRTC's compile cache keeps what one process stored for the next, within its bounds", "[export]") {
  const NvrtcSlots n;
  constexpr int kNotFound = 500;
  const std::string dir = fresh_cache_dir();
  // In a child process (its memory goes with it): stores `value` for each input.
  auto store_in_child = [&](const std::vector<std::string>& inputs, const std::string& value) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (const auto& in : inputs) {
        void* e = nullptr;
        if (n.open(&e, 2, in.data(), in.size(), " -arch=compute_90", "build") != 0) ::_exit(1);
        if (n.store(e, 0, value.data(), value.size(), 0, 0) != 0) ::_exit(2);
        n.close(e, 0, 0, 0, 0, 0);
      }
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  };
  auto found = [&](const std::string& in, std::string* value) {
    void* e = nullptr;
    REQUIRE(n.open(&e, 2, in.data(), in.size(), " -arch=compute_90", "build") == 0);
    void* data = nullptr;
    std::uint32_t len = 0;
    const int st = n.lookup(e, 0, &data, &len, 0, 0);
    if (st == 0) {
      *value = std::string(static_cast<const char*>(data), len);
      n.release(data, 0, 0, 0, 0, 0);
    }
    n.close(e, 0, 0, 0, 0, 0);
    return st;
  };
  const std::string cubin(3000, 'c');
  const auto before = ivcuda::guest::compile_cache::counts();
  store_in_child({"program one", "program two"}, cubin);
  CHECK(cache_files(dir).first == 2);
  std::string got;
  CHECK(found("program one", &got) == 0);
  CHECK(got == cubin);
  CHECK(ivcuda::guest::compile_cache::counts().disk_hits == before.disk_hits + 1);
  CHECK(found("program one", &got) == 0);  // from memory now
  CHECK(ivcuda::guest::compile_cache::counts().disk_hits == before.disk_hits + 1);
  CHECK(found("program three", &got) == kNotFound);
  // A damaged file: cut short, then its key changed.
  DIR* d = ::opendir(dir.c_str());
  REQUIRE(d != nullptr);
  std::vector<std::string> files;
  while (dirent* e = ::readdir(d))
    if (std::string(e->d_name).find(".ivc") != std::string::npos) files.push_back(dir + "/" + e->d_name);
  ::closedir(d);
  REQUIRE(files.size() == 2);
  for (const auto& f : files) REQUIRE(::truncate(f.c_str(), 100) == 0);
  CHECK(found("program two", &got) == kNotFound);
  store_in_child({"program two"}, cubin);
  for (const auto& f : files) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(24 + 8);  // past the header and the key's first length word
    io.write("X", 1);
  }
  CHECK(found("program two", &got) == kNotFound);
  // CUDA_CACHE_DISABLE=1: nothing written.
  const std::string other = fresh_cache_dir();
  ::setenv("CUDA_CACHE_DISABLE", "1", 1);
  store_in_child({"program four"}, cubin);
  CHECK(cache_files(other).first == 0);
  ::unsetenv("CUDA_CACHE_DISABLE");
  // CUDA_CACHE_MAXSIZE: ten entries of about 3 KiB in a 10 KiB directory.
  const std::string small = fresh_cache_dir();
  ::setenv("CUDA_CACHE_MAXSIZE", "10240", 1);
  std::vector<std::string> many;
  for (int i = 0; i < 10; ++i) many.push_back("program " + std::to_string(100 + i));
  store_in_child(many, cubin);
  const auto [count, bytes] = cache_files(small);
  CHECK(count >= 1);
  CHECK(bytes <= 10240);
  ::unsetenv("CUDA_CACHE_MAXSIZE");
  ::unsetenv("CUDA_CACHE_PATH");
}

TEST_CASE("MD2 matches RFC 1319's test suite", "[md2]") {
  const std::pair<std::string, std::string> vectors[] = {
      {"", "8350e5a3e24c153df2275c9f80692773"},
      {"a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"},
      {"abc", "da853b0d3f88d99b30283a69e6ded6bb"},
      {"message digest", "ab4f496bfb2a530b219ff33031fe06b0"},
      {"abcdefghijklmnopqrstuvwxyz", "4e8ddff3650292ab5a4108c3aa47940b"},
      {"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", "da33def2a42df13975352846c30338cd"},
      {"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
       "d5976f79d83d3a0dc9806c3c66f3efd8"},
  };
  for (const auto& [msg, want] : vectors) {
    INFO('"' << msg << '"');
    const Bytes m = bytes_of(msg);
    CHECK(hex(md2::digest(m)) == want);
    CHECK(hex(ref_md2(m)) == want);  // the test's own MD2 is right too
    // Incremental updates split anywhere give the same digest.
    for (std::size_t split = 0; split <= m.size(); split += 7) {
      md2::Md2 h;
      h.update(std::span(m).first(split));
      h.update(std::span(m).subspan(split));
      CHECK(hex(h.finish()) == want);
    }
  }
}

TEST_CASE("HMAC-MD2", "[md2]") {
  // Expected values computed with pycryptodome 3.23 (Crypto.Hash.HMAC with
  // Crypto.Hash.MD2), an implementation independent of this project.
  const Bytes integrity_key = {0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52,
                               0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F};
  Bytes counting(76);
  for (std::size_t i = 0; i < counting.size(); ++i) counting[i] = static_cast<std::uint8_t>(i);
  const struct {
    Bytes key, msg;
    const char* want;
  } vectors[] = {
      {integrity_key, bytes_of("The quick brown fox jumps over the lazy dog"), "6ff0a92b1488b5790782668dc4f71b6a"},
      {bytes_of("key"), {}, "7bf1ff992bec5708c70f0db5d5054486"},
      {bytes_of("a key longer than sixteen bytes, hashed first"), bytes_of("message digest"),
       "1633fb905a4abbe728eed1b3644004c3"},
      {integrity_key, counting, "70179cf997c1374ec2d4e2c0c4fd2e23"},
  };
  for (const auto& v : vectors) {
    CHECK(hex(md2::hmac(v.key, v.msg)) == v.want);
    CHECK(hex(ref_hmac(v.key, v.msg)) == v.want);
  }
}

namespace {

using IntegrityFn = CUresult(std::uint32_t, std::uint64_t, std::uint64_t*);

template <class T>
void put_at(Bytes& b, std::size_t off, T v) {
  REQUIRE(off + sizeof v <= b.size());
  std::memcpy(b.data() + off, &v, sizeof v);
}

// The answer built from the contract's description, field by field at fixed
// offsets, for the calling thread.
Bytes expected_integrity(std::uint32_t version, std::uint64_t unix_time) {
  const void* const* cudart = fetch(kCudartInterface);
  const void* const* integrity = fetch(kIntegrity);
  const auto& devs = fake::config().devices;
  Bytes msg(48 + 28 * devs.size());
  put_at(msg, 0, static_cast<std::uint32_t>(fake::config().driver_version));
  put_at(msg, 4, version);
  put_at(msg, 8, static_cast<std::uint32_t>(getpid()));
  put_at(msg, 12, static_cast<std::uint32_t>(pthread_self()));
  put_at(msg, 16, reinterpret_cast<std::uint64_t>(cudart));
  put_at(msg, 24, reinterpret_cast<std::uint64_t>(integrity));
  put_at(msg, 32, reinterpret_cast<std::uint64_t>(integrity[1]));
  put_at(msg, 40, unix_time);
  for (std::size_t i = 0; i < devs.size(); ++i) {
    const std::size_t off = 48 + 28 * i;
    std::memcpy(msg.data() + off, devs[i].uuid.bytes, 16);
    put_at(msg, off + 16, static_cast<std::int32_t>(devs[i].pci_domain));
    put_at(msg, off + 20, static_cast<std::int32_t>(devs[i].pci_bus));
    put_at(msg, off + 24, static_cast<std::int32_t>(devs[i].pci_device));
  }
  const Bytes key = {0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F};
  return ref_hmac(key, msg);
}

Bytes answer(std::uint32_t version, std::uint64_t unix_time) {
  auto fn = slot_fn<IntegrityFn>(fetch(kIntegrity), 1);
  std::uint64_t out[2] = {0, 0};
  REQUIRE(fn(version, unix_time, out) == CUDA_SUCCESS);
  Bytes b(16);
  std::memcpy(b.data(), out, 16);
  return b;
}

}  // namespace

TEST_CASE("the integrity check answers the keyed hash the contract specifies", "[export][integrity]") {
  fake::config().driver_version = 13000;
  CUuuid u0{}, u1{};
  for (int i = 0; i < 16; ++i) {
    u0.bytes[i] = static_cast<char>(0xa0 + i);
    u1.bytes[i] = static_cast<char>(0x30 + 3 * i);
  }
  fake::config().devices = {{u0, 0, 0x41, 0}, {u1, 1, 0xc2, 3}};
  constexpr std::uint32_t kVersion = 13002;
  constexpr std::uint64_t kTime = 1764400000;

  const Bytes want = expected_integrity(kVersion, kTime);
  CHECK(hex(answer(kVersion, kTime)) == hex(want));

  SECTION("every field changes the answer") {
    CHECK(answer(kVersion + 1, kTime) != want);
    CHECK(answer(kVersion, kTime + 1) != want);
    fake::config().driver_version = 13010;
    CHECK(answer(kVersion, kTime) != want);
    CHECK(hex(answer(kVersion, kTime)) == hex(expected_integrity(kVersion, kTime)));
    fake::config().driver_version = 13000;
    fake::config().devices[1].pci_device = 4;
    CHECK(answer(kVersion, kTime) != want);
    fake::config().devices[1].pci_device = 3;
    fake::config().devices[0].uuid.bytes[15] ^= 1;
    CHECK(answer(kVersion, kTime) != want);
    fake::config().devices[0].uuid.bytes[15] ^= 1;
    CHECK(answer(kVersion, kTime) == want);
  }

  SECTION("the calling thread is part of the answer") {
    Bytes other_answer, other_want;
    std::thread([&] {
      other_answer = answer(kVersion, kTime);
      other_want = expected_integrity(kVersion, kTime);
    }).join();
    CHECK(hex(other_answer) == hex(other_want));
    CHECK(other_answer != want);
  }

  SECTION("no devices: the 48-byte record alone") {
    fake::config().devices.clear();
    CHECK(hex(answer(kVersion, kTime)) == hex(expected_integrity(kVersion, kTime)));
  }

  SECTION("a NULL answer buffer is refused") {
    CHECK(slot_fn<IntegrityFn>(fetch(kIntegrity), 1)(kVersion, kTime, nullptr) == CUDA_ERROR_INVALID_VALUE);
  }
}
