// The driver's error log (cuLogs*) and GPU core dump settings (cuCoredump*),
// answered in the guest.
//
// Logs: once a program uses the log API, each failed call of this library
// (what IVCUDA_LOG_ERRORS counts) becomes a message - kept in a buffer of
// 25,600 bytes, as the driver keeps its own, and handed to every registered
// callback. Failures before the first use of the API are not kept.
//
// Core dumps: a GPU core dump would be written by the worker, on the host,
// where the guest has no business writing files (the worker also refuses the
// context flags that enable them, host-daemon/worker/contexts.cc). The settings read
// as a driver's defaults and may be changed, but enabling a dump on exception
// or by user trigger is refused with CUDA_ERROR_NOT_PERMITTED.
#include <cuda.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "guest/errors.h"
#include "guest/guard.h"
#include "guest/internal.h"

using ivcuda::guest::current_ctx;
using ivcuda::guest::guard;

namespace {

constexpr std::size_t kLogBytes = 25600;

struct Log {
  std::mutex mu;
  std::deque<std::string> lines;  // the newest last; guarded by mu
  std::size_t bytes = 0;
  unsigned first = 0;  // the sequence number of lines.front()
  struct Callback {
    CUlogsCallback fn;
    void* user;
  };
  std::map<std::uintptr_t, Callback> callbacks;
  std::uintptr_t next_handle = 1;
};
Log& log() {
  static auto* l = new Log;  // never destroyed: calls fail from exit handlers too
  return *l;
}
std::atomic<bool> g_used{false};

unsigned next_seq(const Log& l) { return l.first + static_cast<unsigned>(l.lines.size()); }

}  // namespace

namespace ivcuda::guest {

bool logs_enabled() noexcept { return g_used.load(std::memory_order_relaxed); }

void logs_note_error(const char* function, CUresult st) noexcept {
  try {
    std::string f(function);
    if (const auto paren = f.find('('); paren != std::string::npos) f.resize(paren);
    if (const auto space = f.rfind(' '); space != std::string::npos) f.erase(0, space + 1);
    const char* name = nullptr;
    const char* text = nullptr;
    (void)cuGetErrorName(st, &name);
    (void)cuGetErrorString(st, &text);
    std::string msg = f + " failed: " + (name ? name : "CUDA error") + " (" + (text ? text : "") + ")";
    std::vector<Log::Callback> call;
    {
      Log& l = log();
      std::lock_guard lk(l.mu);
      l.lines.push_back(msg);
      l.bytes += msg.size() + 1;
      while (l.bytes > kLogBytes && !l.lines.empty()) {
        l.bytes -= l.lines.front().size() + 1;
        l.lines.pop_front();
        ++l.first;
      }
      for (const auto& [h, cb] : l.callbacks) call.push_back(cb);
    }
    for (const auto& cb : call) cb.fn(cb.user, CU_LOG_LEVEL_ERROR, msg.data(), msg.size());
  } catch (...) {
  }
}

}  // namespace ivcuda::guest

CUresult cuLogsRegisterCallback(CUlogsCallback fn, void* user, CUlogsCallbackHandle* out) {
  return guard([&] {
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    g_used.store(true, std::memory_order_relaxed);
    Log& l = log();
    std::lock_guard lk(l.mu);
    const std::uintptr_t h = l.next_handle++;
    l.callbacks[h] = Log::Callback{fn, user};
    if (out != nullptr) *out = reinterpret_cast<CUlogsCallbackHandle>(h);
    return CUDA_SUCCESS;
  });
}

CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle h) {
  return guard([&] {
    Log& l = log();
    std::lock_guard lk(l.mu);
    return l.callbacks.erase(reinterpret_cast<std::uintptr_t>(h)) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult cuLogsCurrent(CUlogIterator* out, unsigned int /*flags: the driver ignores them*/) {
  return guard([&] {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    g_used.store(true, std::memory_order_relaxed);
    Log& l = log();
    std::lock_guard lk(l.mu);
    *out = next_seq(l);
    return CUDA_SUCCESS;
  });
}

namespace {
// The kept lines from *it on (all of them without an iterator), advancing it.
std::vector<std::string> take(CUlogIterator* it) {
  g_used.store(true, std::memory_order_relaxed);
  Log& l = log();
  std::lock_guard lk(l.mu);
  std::vector<std::string> out;
  const unsigned from = it != nullptr && *it > l.first ? *it : l.first;
  for (unsigned s = from; s < next_seq(l); ++s) out.push_back(l.lines[s - l.first]);
  if (it != nullptr) *it = next_seq(l);
  return out;
}
}  // namespace

CUresult cuLogsDumpToFile(CUlogIterator* it, const char* path, unsigned int flags) {
  return guard([&] {
    if (path == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const auto lines = take(it);
    FILE* f = std::fopen(path, "w");
    if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& s : lines) std::fprintf(f, "%s\n", s.c_str());
    return std::fclose(f) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult cuLogsDumpToMemory(CUlogIterator* it, char* buffer, size_t* size, unsigned int flags) {
  return guard([&] {
    if (buffer == nullptr || size == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t room = *size;
    const auto lines = take(it);
    *size = 0;
    if (lines.empty()) {
      if (room > 0) buffer[0] = '\0';
      return CUDA_SUCCESS;
    }
    // The newest messages that fit, in order, with a note first when older ones did not.
    std::size_t k = lines.size(), used = 0;
    while (k > 0 && used + lines[k - 1].size() + 1 < room) used += lines[--k].size() + 1;
    if (k == lines.size()) {
      if (room > 0) buffer[0] = '\0';
      return CUDA_ERROR_INVALID_VALUE;  // not even the newest fits
    }
    std::string out;
    const std::string note = "[older messages did not fit]\n";
    if (k > 0 && used + note.size() < room) out = note;
    for (std::size_t i = k; i < lines.size(); ++i) out += lines[i] + "\n";
    std::memcpy(buffer, out.data(), out.size());
    buffer[out.size()] = '\0';
    *size = out.size();
    return CUDA_SUCCESS;
  });
}

// ==================================================================== core dumps

namespace {

struct Dumps {
  bool trigger_host = true, lightweight = false;
  int flags = 0;
  std::string file, pipe;
};
struct DumpSettings {
  std::mutex mu;
  Dumps global;
  std::map<std::uint64_t, Dumps> by_ctx;  // contexts that set their own
};
DumpSettings& dumps() {
  static auto* d = [] {
    auto* s = new DumpSettings;
    char host[256] = "localhost";
    (void)::gethostname(host, sizeof host - 1);
    const std::string tail = std::string(host) + "." + std::to_string(::getpid());
    s->global.file = "core.cuda." + tail;
    s->global.pipe = "corepipe.cuda." + tail;
    return s;
  }();
  return *d;
}

CUresult get_dump(const Dumps& d, CUcoredumpSettings a, void* value, size_t* size) {
  if (size == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto put = [&](const void* p, size_t n) {
    if (value == nullptr) {
      *size = n;
      return CUDA_SUCCESS;
    }
    if (*size < n) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(value, p, n);
    *size = n;
    return CUDA_SUCCESS;
  };
  bool b = false;
  switch (a) {
    case CU_COREDUMP_ENABLE_ON_EXCEPTION:
    case CU_COREDUMP_ENABLE_USER_TRIGGER: b = false; return put(&b, sizeof b);
    case CU_COREDUMP_TRIGGER_HOST: b = d.trigger_host; return put(&b, sizeof b);
    case CU_COREDUMP_LIGHTWEIGHT: b = d.lightweight; return put(&b, sizeof b);
    case CU_COREDUMP_GENERATION_FLAGS: return put(&d.flags, sizeof d.flags);
    case CU_COREDUMP_FILE: return put(d.file.c_str(), d.file.size() + 1);
    case CU_COREDUMP_PIPE: return put(d.pipe.c_str(), d.pipe.size() + 1);
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult set_dump(Dumps& d, CUcoredumpSettings a, const void* value, const size_t* size) {
  if (value == nullptr || size == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto as_bool = [&](bool* out) {
    if (*size < sizeof(bool)) return false;
    std::memcpy(out, value, sizeof(bool));
    return true;
  };
  bool b = false;
  switch (a) {
    case CU_COREDUMP_ENABLE_ON_EXCEPTION:
    case CU_COREDUMP_ENABLE_USER_TRIGGER:
      if (!as_bool(&b)) return CUDA_ERROR_INVALID_VALUE;
      return b ? CUDA_ERROR_NOT_PERMITTED : CUDA_SUCCESS;  // core dumps stay off (top of the file)
    case CU_COREDUMP_TRIGGER_HOST:
      if (!as_bool(&d.trigger_host)) return CUDA_ERROR_INVALID_VALUE;
      return CUDA_SUCCESS;
    case CU_COREDUMP_LIGHTWEIGHT:
      if (!as_bool(&d.lightweight)) return CUDA_ERROR_INVALID_VALUE;
      return CUDA_SUCCESS;
    case CU_COREDUMP_GENERATION_FLAGS:
      if (*size < sizeof(int)) return CUDA_ERROR_INVALID_VALUE;
      std::memcpy(&d.flags, value, sizeof(int));
      return CUDA_SUCCESS;
    case CU_COREDUMP_FILE:
    case CU_COREDUMP_PIPE: {
      const std::size_t n = strnlen(static_cast<const char*>(value), std::min<std::size_t>(*size, 1024));
      if (n >= 1024 || n >= *size) return CUDA_ERROR_INVALID_VALUE;  // up to 1023 characters, terminated
      (a == CU_COREDUMP_FILE ? d.file : d.pipe).assign(static_cast<const char*>(value), n);
      return CUDA_SUCCESS;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

CUresult cuCoredumpGetAttribute(CUcoredumpSettings a, void* value, size_t* size) {
  return guard([&] {
    const std::uint64_t ctx = current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    DumpSettings& s = dumps();
    std::lock_guard lk(s.mu);
    const auto it = s.by_ctx.find(ctx);
    return get_dump(it != s.by_ctx.end() ? it->second : s.global, a, value, size);
  });
}

CUresult cuCoredumpGetAttributeGlobal(CUcoredumpSettings a, void* value, size_t* size) {
  return guard([&] {
    DumpSettings& s = dumps();
    std::lock_guard lk(s.mu);
    return get_dump(s.global, a, value, size);
  });
}

CUresult cuCoredumpSetAttribute(CUcoredumpSettings a, void* value, size_t* size) {
  return guard([&] {
    const std::uint64_t ctx = current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    DumpSettings& s = dumps();
    std::lock_guard lk(s.mu);
    auto it = s.by_ctx.find(ctx);
    if (it == s.by_ctx.end()) it = s.by_ctx.emplace(ctx, s.global).first;
    return set_dump(it->second, a, value, size);
  });
}

CUresult cuCoredumpSetAttributeGlobal(CUcoredumpSettings a, void* value, size_t* size) {
  return guard([&] {
    DumpSettings& s = dumps();
    std::lock_guard lk(s.mu);
    return set_dump(s.global, a, value, size);
  });
}
