// nvmlErrorString: answered here for every code nvml.h names. No `default`
// in the switch, so that -Wswitch names a code a new header adds.
//
// And what NVML answered that was not success, for the user to see at exit,
// as libcuda.so.1 does for CUDA (guest/unsupported.h), under the same names:
//   IVCUDA_LOG_UNSUPPORTED=1|PATH  every NVML function that answered
//                                  NVML_ERROR_NOT_SUPPORTED, with counts, and
//                                  which of them nothing here forwards
//   IVCUDA_LOG_ERRORS=1|PATH       every NVML function that failed, by error
// Booked: the worker's answers and the generated defaults; not the calls this
// library refuses itself for a bad handle or pointer (the caller's mistake).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "guest/nvml/internal.h"
#include "guest/report_sink.h"

namespace {
using ivcuda::guest::report_target;
using ivcuda::guest::ReportSink;

const char* describe(nvmlReturn_t r) noexcept {
  switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "The provided version is invalid/unsupported";
    case NVML_ERROR_DEPRECATED: return "The requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "The system is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "The GPU was not found";
    case NVML_ERROR_INVALID_STATE: return "The state is invalid";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "The reset type is not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
  }
  return "Unknown Error";
}

struct Book {
  std::mutex mu;
  std::map<std::pair<std::string, int>, unsigned long> answers;  // guarded by mu
  std::set<std::string> defaults;                                 // guarded by mu
};

// Never destroyed: NVML calls may come from atexit handlers.
Book& book() {
  static auto* b = new Book;
  return *b;
}

// "nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t, char*, unsigned int)" -> "nvmlDeviceGetName".
std::string bare(const char* who) {
  std::string f(who != nullptr ? who : "?");
  if (const auto paren = f.find('('); paren != std::string::npos) f.resize(paren);
  if (const auto space = f.rfind(' '); space != std::string::npos) f.erase(0, space + 1);
  if (const auto colons = f.rfind("::"); colons != std::string::npos) f.erase(0, colons + 2);
  return f;
}

[[gnu::destructor]] void report() noexcept {
  const char* unsupported = report_target("IVCUDA_LOG_UNSUPPORTED");
  const char* errors = report_target("IVCUDA_LOG_ERRORS");
  if (unsupported == nullptr && errors == nullptr) return;
  try {
    std::map<std::pair<std::string, int>, unsigned long> all;
    std::set<std::string> defaults;
    {
      std::lock_guard lk(book().mu);
      all = book().answers;
      defaults = book().defaults;
    }
    const int pid = static_cast<int>(::getpid());
    if (unsupported != nullptr) {
      const ReportSink sink(unsupported);
      if (FILE* out = sink.get()) {
        std::size_t kinds = 0;
        for (const auto& [key, n] : all) kinds += key.second == NVML_ERROR_NOT_SUPPORTED;
        std::fprintf(out, "ivcuda-nvml: process %d: %zu NVML function(s) answered NOT_SUPPORTED\n", pid, kinds);
        for (const auto& [key, n] : all)
          if (key.second == NVML_ERROR_NOT_SUPPORTED)
            std::fprintf(out, "ivcuda-nvml: NOT_SUPPORTED %s%s: %lu call(s)\n", key.first.c_str(),
                         defaults.contains(key.first) ? " (not forwarded)" : "", n);
      }
    }
    if (errors != nullptr) {
      const ReportSink sink(errors);
      if (FILE* out = sink.get()) {
        std::fprintf(out, "ivcuda-nvml: process %d: %zu kind(s) of failed NVML call\n", pid, all.size());
        for (const auto& [key, n] : all)
          std::fprintf(out, "ivcuda-nvml: FAILED %s -> %s (%d): %lu call(s)\n", key.first.c_str(),
                       describe(static_cast<nvmlReturn_t>(key.second)), key.second, n);
      }
    }
  } catch (...) {
  }
}

}  // namespace

namespace ivcuda::nvml {

nvmlReturn_t note_answer(const char* who, nvmlReturn_t r) noexcept {
  if (r == NVML_SUCCESS) return r;
  try {
    std::string name = bare(who);
    std::lock_guard lk(book().mu);
    ++book().answers[{std::move(name), static_cast<int>(r)}];
  } catch (...) {
  }
  return r;
}

void note_default(const char* name) noexcept {
  try {
    std::string n = bare(name);
    std::lock_guard lk(book().mu);
    book().defaults.insert(std::move(n));
  } catch (...) {
  }
}

}  // namespace ivcuda::nvml

// Works before nvmlInit, as NVIDIA's does.
extern "C" const char* nvmlErrorString(nvmlReturn_t result) { return describe(result); }
