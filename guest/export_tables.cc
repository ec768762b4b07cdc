// cuGetExportTable and the tables behind it.
//
// A table is an array of pointers handed out by address; callers index it
// directly, so its layout is the ABI: slot 0 holds the table's size in bytes
// (except CONTEXT_LOCAL_STORAGE, which has none), and a slot nobody calls is
// nullptr. Sizes are the real driver's where the contracts give them, else
// the slot counts public reverse-engineering (ZLUDA's tables) records, grown
// where cudart 13 calls a higher slot (CONTEXT_CHECKS[3]). Everything is answered in
// the guest: the integrity check hashes this process's pid, thread and table
// addresses, and the rest is bookkeeping about local handles.
//
// The tables are built on first use (turning a function pointer into a
// void* is no constant expression) and, like the context-local storage, never destroyed:
// cudart's exit handler still calls into them after static destructors ran.
#include "guest/export_tables.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "guest/compile_cache.h"
#include "guest/export_hooks.h"
#include "guest/md2.h"

namespace ivcuda::guest {
namespace {

using Uuid = std::array<std::uint8_t, 16>;

consteval std::uint8_t hex_digit(char c) {
  if (c >= '0' && c <= '9') return static_cast<std::uint8_t>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<std::uint8_t>(c - 'a' + 10);
  throw "not a lowercase hex digit";  // a compile error in a consteval context
}

// The UUID's 16 bytes in memory order, as the contracts write them.
consteval Uuid uuid(const char (&hex)[33]) {
  Uuid u{};
  for (std::size_t i = 0; i < u.size(); ++i)
    u[i] = static_cast<std::uint8_t>(hex_digit(hex[2 * i]) << 4 | hex_digit(hex[2 * i + 1]));
  return u;
}

constexpr Uuid kCudartInterfaceId = uuid("6bd5fb6c5bf4e74a8987d93912fd9df9");
constexpr Uuid kToolsCallbackHooksId = uuid("a094798c2e742e7493f20800200c0a66");
constexpr Uuid kToolsTlsId = uuid("42d85a8123f6cb478298f6e78a3aecdc");
constexpr Uuid kContextLocalStorageId = uuid("c693336e1121df11a8c368f355d89593");
constexpr Uuid kContextChecksId = uuid("263e88607cd2614392f6bbd5006dfa7e");
constexpr Uuid kIntegrityCheckId = uuid("d4082055bde6704b8d34ba123c66e1f2");
constexpr Uuid kContextStreamIdsId = uuid("21318c60971432488ca641ff7324c8f2");
constexpr Uuid kModuleEnumerationId = uuid("6e163fbeb958444d835ce182aff1991e");
constexpr Uuid kLtMatmulHooksId = uuid("1734dc26800d47458726c0f1e7dd8bca");
// NVRTC's and nvJitLink's compile cache (guest/compile_cache.h).
constexpr Uuid kNvrtcCacheId = uuid("da9151d33ae6cc41a5c04f26d533e328");
// Refused on purpose, without a log line: the callers cope (see the contracts).
constexpr Uuid kLoggerId = uuid("f8cff95121468b4eb9e2fb469e7c0dd9");
// Asked for by NVIDIA's libnvidia-ml.so.1 when it is loaded next to this
// library; undocumented (no contract describes its slots). It is NVML's
// private way into NVIDIA's own driver, and behind this library there is no
// such driver: refused, with one line that names the way out (ivcuda's own
// libnvidia-ml.so.1, guest/nvml, which never asks for it).
constexpr Uuid kNvmlPrivateId = uuid("69a28e9f24498b47b030c5da330ea4e9");

// The integrity check's HMAC key (cuda13-driver-contract.md).
constexpr std::array<std::uint8_t, 16> kIntegrityKey = {0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52,
                                                        0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F};

template <class F>
CUresult guard(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

// ---- CUDART_INTERFACE ------------------------------------------------------

CUresult cudart_primary_context(CUcontext* out, CUdevice dev) noexcept {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return hooks::primary_context(dev, out);
}

// ---- TOOLS_RUNTIME_CALLBACK_HOOKS ------------------------------------------
// With no tool attached cudart only needs somewhere to keep its hook state:
// zeroed buffers longer than it checks for ([2] > 522 bytes, [6] > 13).

// [1], [3] and [4] are what cudart (stream capture, graphs, host functions)
// and cuBLAS/cuBLASLt (context init) call to tell attached tools about
// events; they take a kind word and one or two pointers. With no tool to tell,
// succeeding without writing anything is the whole job (a NULL slot crashes
// the caller).
CUresult tools_notify(std::uint64_t, void*, void*) noexcept { return CUDA_SUCCESS; }

alignas(64) unsigned char g_tools_buffer2[1024];
alignas(64) unsigned char g_tools_buffer6[64];

// Declared as returning CUresult although callers may ignore it: a success
// in the return register is harmless either way.
CUresult tools_buffer2(void** buf, std::size_t* len) noexcept {
  if (buf == nullptr || len == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *buf = g_tools_buffer2;
  *len = sizeof g_tools_buffer2;
  return CUDA_SUCCESS;
}

CUresult tools_buffer6(void** buf, std::size_t* len) noexcept {
  if (buf == nullptr || len == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *buf = g_tools_buffer6;
  *len = sizeof g_tools_buffer6;
  return CUDA_SUCCESS;
}

// ---- TOOLS_TLS ---------------------------------------------------------------

// cuBLAS caches per context under whatever this writes, so it must always
// write something: the current context, or nullptr.
CUresult tools_tls_current_context(CUcontext* out) noexcept {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUcontext ctx = nullptr;
  const CUresult st = hooks::current_context(&ctx);
  *out = st == CUDA_SUCCESS ? ctx : nullptr;
  return st;
}

// ---- CONTEXT_LOCAL_STORAGE ---------------------------------------------------
// One map per context keyed by the caller's key pointer (every cudart copy in
// the process has its own key). Destructors run from export_tables_context_gone
// only; delete just forgets the entry, as cudart calls it after tearing its
// state down itself.

using ClsDtor = void (*)(CUcontext, void* key, void* value);

struct ClsEntry {
  void* value;
  ClsDtor dtor;
};

using ClsMap = std::unordered_map<void*, ClsEntry>;

struct ClsStore {
  std::mutex mu;  // guards by_ctx; never held while calling out
  std::unordered_map<CUcontext, ClsMap> by_ctx;
};

ClsStore& cls_store() {
  static auto* store = new ClsStore;  // leaked on purpose: see the top of the file
  return *store;
}

// nullptr means the calling thread's current context.
CUresult cls_context(CUcontext ctx, CUcontext* out) noexcept {
  if (ctx == nullptr) {
    const CUresult st = hooks::current_context(&ctx);
    if (st != CUDA_SUCCESS) return st;
    if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  }
  *out = ctx;
  return CUDA_SUCCESS;
}

// A second put for the same key replaces value and destructor without running
// the old destructor: the caller that replaces its own entry owns the old value.
CUresult cls_put(CUcontext ctx, void* key, void* value, ClsDtor dtor) noexcept {
  return guard([&] {
    CUcontext c = nullptr;
    if (const CUresult st = cls_context(ctx, &c); st != CUDA_SUCCESS) return st;
    ClsStore& s = cls_store();
    std::lock_guard lk(s.mu);
    s.by_ctx[c][key] = ClsEntry{value, dtor};
    return CUDA_SUCCESS;
  });
}

CUresult cls_delete(CUcontext ctx, void* key) noexcept {
  return guard([&] {
    CUcontext c = nullptr;
    if (const CUresult st = cls_context(ctx, &c); st != CUDA_SUCCESS) return st;
    ClsStore& s = cls_store();
    std::lock_guard lk(s.mu);
    auto it = s.by_ctx.find(c);
    if (it == s.by_ctx.end() || it->second.erase(key) == 0) return CUDA_ERROR_INVALID_VALUE;
    if (it->second.empty()) s.by_ctx.erase(it);
    return CUDA_SUCCESS;
  });
}

// A miss is an error (cudart then sets the context up and puts).
CUresult cls_get(void** value, CUcontext ctx, void* key) noexcept {
  return guard([&] {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = nullptr;
    if (const CUresult st = cls_context(ctx, &c); st != CUDA_SUCCESS) return st;
    ClsStore& s = cls_store();
    std::lock_guard lk(s.mu);
    auto it = s.by_ctx.find(c);
    if (it == s.by_ctx.end()) return CUDA_ERROR_INVALID_VALUE;
    auto entry = it->second.find(key);
    if (entry == it->second.end()) return CUDA_ERROR_INVALID_VALUE;
    *value = entry->second.value;
    return CUDA_SUCCESS;
  });
}

// ---- CONTEXT_CHECKS ----------------------------------------------------------
// [2] asks whether a context wraps another one; no context here does.

CUresult context_checks_wrapped(CUcontext, std::uint32_t* wrapped, void**) noexcept {
  if (wrapped != nullptr) *wrapped = 0;
  return CUDA_SUCCESS;
}

CUresult context_checks_3() noexcept { return CUDA_SUCCESS; }

// ---- INTEGRITY_CHECK ---------------------------------------------------------

CUresult integrity_answer(std::uint32_t version, std::uint64_t unix_time, std::uint64_t* out) noexcept;

// ---- 21318c60...: context and stream ids for cuBLAS, cuBLASLt and cuFFT ----

CUresult context_id(CUcontext ctx, std::uint64_t* id) noexcept {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return hooks::context_id(ctx, id);
}

// The "internal object" of a stream is the handle itself. With per_thread set
// the caller runs under the per-thread default stream, so its NULL stream is
// that one, which has an id of its own.
CUresult stream_internal(CUcontext, CUstream stream, void** internal, int per_thread) noexcept {
  if (internal == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *internal = stream == nullptr && per_thread != 0 ? CU_STREAM_PER_THREAD : stream;
  return CUDA_SUCCESS;
}

CUresult stream_id(CUcontext ctx, void* internal, std::uint64_t* id) noexcept {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return hooks::stream_id(ctx, static_cast<CUstream>(internal), id);
}

// ---- 6e163fbe...: cuFFT's kernel enumeration ----------------------------------
// [7] calls cb for each kernel of the module (the host's driver enumerates
// them; the callback runs here with the guest's function handles) and then
// returns 1, not 0: that is what cuFFT checks for. cuFFT also checks the
// table's size word (> 0x37).

using KernelCallback = void (*)(void* user, CUfunction fn);

CUresult module_enumerate_kernels(CUcontext, CUmodule mod, KernelCallback cb, void* user) noexcept {
  if (cb == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUresult st = hooks::module_functions(mod, cb, user);
  return st == CUDA_SUCCESS ? static_cast<CUresult>(1) : st;
}

// ---- 1734dc26...: cuBLASLt fp16/bf16 matmul ----------------------------------
// A NULL first handle from [4] makes cuBLASLt skip the step that uses [13].

CUresult lt_matmul_handles(void** first, void**) noexcept {
  if (first != nullptr) *first = nullptr;
  return CUDA_SUCCESS;
}

CUresult lt_matmul_step(void*, void*, int, int, void*, int) noexcept { return CUDA_SUCCESS; }

// ---- the tables ----------------------------------------------------------------

template <std::size_t Slots>
using Table = std::array<const void*, Slots>;

template <std::size_t Bytes>
constexpr std::size_t slots_of() {
  static_assert(Bytes % sizeof(void*) == 0);
  return Bytes / sizeof(void*);
}

template <class Fn>
const void* slot(Fn* fn) {
  static_assert(std::is_function_v<Fn>);
  return reinterpret_cast<const void*>(fn);
}

template <std::size_t Slots>
void set_size(Table<Slots>& t) {
  t[0] = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(Slots * sizeof(void*)));
}

struct Tables {
  Table<10> cudart_interface{};      // [1], [6]-[8] served module loading before CUDA 13
  Table<7> tools_callback_hooks{};   // size 0x38: cudart wants > 48
  Table<3> tools_tls{};              // 0x18 as on the real driver
  Table<4> context_local_storage{};  // no size word; [3] stays NULL
  Table<4> context_checks{};         // recorded as 3 slots, but cudart 13 calls [3]
  Table<3> integrity_check{};
  Table<slots_of<0x2e8>()> context_stream_ids{};
  Table<slots_of<0x318>()> module_enumeration{};
  Table<slots_of<0x88>()> lt_matmul_hooks{};
  Table<slots_of<0x38>()> compile_cache{};

  Tables() {
    set_size(cudart_interface);
    cudart_interface[2] = slot(cudart_primary_context);

    set_size(tools_callback_hooks);
    tools_callback_hooks[1] = slot(tools_notify);
    tools_callback_hooks[2] = slot(tools_buffer2);
    tools_callback_hooks[3] = slot(tools_notify);
    tools_callback_hooks[4] = slot(tools_notify);
    tools_callback_hooks[6] = slot(tools_buffer6);

    set_size(tools_tls);
    tools_tls[2] = slot(tools_tls_current_context);

    context_local_storage[0] = slot(cls_put);
    context_local_storage[1] = slot(cls_delete);
    context_local_storage[2] = slot(cls_get);

    set_size(context_checks);
    context_checks[2] = slot(context_checks_wrapped);
    context_checks[3] = slot(context_checks_3);

    set_size(integrity_check);
    integrity_check[1] = slot(integrity_answer);

    set_size(context_stream_ids);
    context_stream_ids[4] = slot(context_id);
    context_stream_ids[39] = slot(stream_id);
    context_stream_ids[51] = slot(stream_internal);

    set_size(module_enumeration);
    module_enumeration[7] = slot(module_enumerate_kernels);

    set_size(lt_matmul_hooks);
    lt_matmul_hooks[4] = slot(lt_matmul_handles);
    lt_matmul_hooks[13] = slot(lt_matmul_step);

    set_size(compile_cache);
    compile_cache[1] = slot(compile_cache::open);
    compile_cache[2] = slot(compile_cache::close);
    compile_cache[3] = slot(compile_cache::lookup);
    compile_cache[4] = slot(compile_cache::store);
    compile_cache[5] = slot(compile_cache::unknown5);
    compile_cache[6] = slot(compile_cache::release);
  }

  const void* find(const Uuid& id) const noexcept {
    const struct {
      const Uuid& id;
      const void* table;
    } known[] = {
        {kCudartInterfaceId, cudart_interface.data()},
        {kToolsCallbackHooksId, tools_callback_hooks.data()},
        {kToolsTlsId, tools_tls.data()},
        {kContextLocalStorageId, context_local_storage.data()},
        {kContextChecksId, context_checks.data()},
        {kIntegrityCheckId, integrity_check.data()},
        {kContextStreamIdsId, context_stream_ids.data()},
        {kModuleEnumerationId, module_enumeration.data()},
        {kLtMatmulHooksId, lt_matmul_hooks.data()},
        {kNvrtcCacheId, compile_cache.data()},
    };
    for (const auto& k : known)
      if (k.id == id) return k.table;
    return nullptr;
  }
};

static_assert(std::is_trivially_destructible_v<Tables>);

const Tables& tables() {
  static const Tables t;  // trivially destructible: no exit-time destructor
  return t;
}

template <class T>
void append(std::vector<std::uint8_t>& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

std::uint64_t address_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// The keyed hash cudart verifies (cuda13-driver-contract.md, "The integrity
// check"): HMAC-MD2 over a packed 48-byte record followed by one 28-byte record
// per device, all in native byte order.
CUresult integrity_answer(std::uint32_t version, std::uint64_t unix_time, std::uint64_t* out) noexcept {
  return guard([&] {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    int driver_version = 0;
    if (const CUresult st = hooks::driver_version(&driver_version); st != CUDA_SUCCESS) return st;
    int devices = 0;
    if (const CUresult st = hooks::device_count(&devices); st != CUDA_SUCCESS) return st;
    if (devices < 0) return CUDA_ERROR_UNKNOWN;

    const Tables& t = tables();
    constexpr std::size_t kHeader = 48;
    constexpr std::size_t kPerDevice = 16 + 3 * sizeof(std::int32_t);
    std::vector<std::uint8_t> msg;
    msg.reserve(kHeader + kPerDevice * static_cast<std::size_t>(devices));
    append(msg, static_cast<std::uint32_t>(driver_version));
    append(msg, version);
    append(msg, static_cast<std::uint32_t>(getpid()));
    append(msg, static_cast<std::uint32_t>(pthread_self()));
    append(msg, address_of(t.cudart_interface.data()));
    append(msg, address_of(t.integrity_check.data()));
    append(msg, address_of(t.integrity_check[1]));
    append(msg, unix_time);
    if (msg.size() != kHeader) return CUDA_ERROR_UNKNOWN;

    for (int dev = 0; dev < devices; ++dev) {
      CUuuid id{};
      if (const CUresult st = hooks::device_uuid(dev, &id); st != CUDA_SUCCESS) return st;
      msg.insert(msg.end(), reinterpret_cast<const std::uint8_t*>(id.bytes),
                 reinterpret_cast<const std::uint8_t*>(id.bytes) + sizeof id.bytes);
      for (const auto attr : {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
                              CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID}) {
        int v = 0;
        if (const CUresult st = hooks::device_attribute(dev, attr, &v); st != CUDA_SUCCESS) return st;
        append(msg, static_cast<std::int32_t>(v));
      }
    }

    const md2::Digest d = md2::hmac(kIntegrityKey, msg);
    std::memcpy(out, d.data(), d.size());
    return CUDA_SUCCESS;
  });
}

bool refused_quietly(const Uuid& id) noexcept { return id == kLoggerId; }

// One line per unknown UUID, naming the library that asked, so that the next
// table a library needs is easy to find.
void log_unknown(const Uuid& id, const void* caller) noexcept {
  try {
    static auto* mu = new std::mutex;         // leaked: see the top of the file
    static auto* seen = new std::set<Uuid>;
    {
      std::lock_guard lk(*mu);
      if (!seen->insert(id).second) return;
    }
    char hex[2 * 16 + 1];
    for (std::size_t i = 0; i < id.size(); ++i) std::snprintf(hex + 2 * i, 3, "%02x", id[i]);
    Dl_info info{};
    if (dladdr(caller, &info) != 0 && info.dli_fname != nullptr) {
      const auto offset = address_of(caller) - address_of(info.dli_fbase);
      std::fprintf(stderr, "ivcuda: cuGetExportTable: unknown table %s asked for from %s+0x%llx (%p); refused\n",
                   hex, info.dli_fname, static_cast<unsigned long long>(offset), caller);
    } else {
      std::fprintf(stderr, "ivcuda: cuGetExportTable: unknown table %s asked for from %p; refused\n", hex, caller);
    }
  } catch (...) {
    // Logging is best effort; the refusal stands either way.
  }
}

}  // namespace

void export_tables_context_gone(CUcontext ctx) noexcept {
  if (ctx == nullptr) return;
  ClsMap gone;
  try {
    ClsStore& s = cls_store();
    std::lock_guard lk(s.mu);
    auto node = s.by_ctx.extract(ctx);
    if (node.empty()) return;
    gone = std::move(node.mapped());
  } catch (...) {
    return;  // std::mutex::lock failing: nothing sensible left to do
  }
  for (const auto& [key, entry] : gone)
    if (entry.dtor != nullptr) entry.dtor(ctx, key, entry.value);
}

}  // namespace ivcuda::guest

extern "C" CUresult cuGetExportTable(const void** ppExportTable, const CUuuid* pExportTableId) {
  using namespace ivcuda::guest;
  const void* caller = __builtin_return_address(0);
  try {
    if (ppExportTable == nullptr || pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = nullptr;
    Uuid id;
    std::memcpy(id.data(), pExportTableId->bytes, id.size());
    if (const void* table = tables().find(id)) {
      *ppExportTable = table;
      return CUDA_SUCCESS;
    }
    if (id == kNvmlPrivateId) {
      static std::once_flag once;
      std::call_once(once, [] {
        std::fprintf(stderr, "ivcuda: NVIDIA's libnvidia-ml.so.1 asked for its private export table "
                             "69a28e9f24498b47b030c5da330ea4e9; refused: use ivcuda's libnvidia-ml.so.1, "
                             "installed next to ivcuda's libcuda.so.1\n");
      });
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (!refused_quietly(id)) log_unknown(id, caller);
    return CUDA_ERROR_INVALID_VALUE;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}
