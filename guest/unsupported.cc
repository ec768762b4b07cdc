#include "guest/unsupported.h"

#include <cuda.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "guest/api/api_table.h"
#include "guest/guard.h"
#include "guest/report_sink.h"

namespace ivcuda::guest {
namespace {

struct Book {
  std::mutex mu;
  std::map<std::string, unsigned long> counts;  // guarded by mu
};

// Never destroyed: calls keep coming from atexit handlers (cudart's).
Book& book() {
  static auto* b = new Book;
  return *b;
}

// A library destructor runs after the program's atexit handlers, so the
// list covers the calls those make too.
[[gnu::destructor]] void report() noexcept {
  const char* where = report_target("IVCUDA_LOG_UNSUPPORTED");
  if (where == nullptr) return;
  try {
    std::map<std::string, unsigned long> all;
    {
      std::lock_guard lk(book().mu);
      all = book().counts;
    }
    for (std::size_t i = 0; i < api::detail::kSymbolCount; ++i)
      if (const unsigned n = api::detail::stub_calls(i); n != 0)
        all[std::string(api::detail::kSymbols[i].symbol) + " (not forwarded)"] += n;
    const ReportSink sink(where);
    FILE* out = sink.get();
    if (out == nullptr) return;
    std::fprintf(out, "ivcuda: process %d: %zu kind(s) of call answered NOT_SUPPORTED\n",
                 static_cast<int>(::getpid()), all.size());
    for (const auto& [what, n] : all) std::fprintf(out, "ivcuda: NOT_SUPPORTED %s: %lu call(s)\n", what.c_str(), n);
  } catch (...) {
  }
}

// IVCUDA_LOG_ERRORS: every call that failed, by function and error.
struct Errors {
  std::mutex mu;
  std::map<std::pair<std::string, int>, unsigned long> counts;  // guarded by mu
};
Errors& errors() {
  static auto* e = new Errors;
  return *e;
}
const char* errors_target() noexcept {
  static const char* where = report_target("IVCUDA_LOG_ERRORS");
  return where;
}

[[gnu::destructor]] void report_errors() noexcept {
  const char* where = errors_target();
  if (where == nullptr) return;
  try {
    std::map<std::pair<std::string, int>, unsigned long> all;
    {
      std::lock_guard lk(errors().mu);
      all = errors().counts;
    }
    const ReportSink sink(where);
    FILE* out = sink.get();
    if (out == nullptr) return;
    std::fprintf(out, "ivcuda: process %d: %zu kind(s) of failed call\n", static_cast<int>(::getpid()), all.size());
    for (const auto& [key, n] : all) {
      const char* name = nullptr;
      if (cuGetErrorName(static_cast<CUresult>(key.second), &name) != CUDA_SUCCESS) name = "?";
      std::fprintf(out, "ivcuda: FAILED %s -> %s: %lu call(s)\n", key.first.c_str(), name, n);
    }
  } catch (...) {
  }
}

}  // namespace

bool log_errors_enabled() noexcept { return errors_target() != nullptr; }

void note_error(const char* function, CUresult st) noexcept {
  try {
    // "CUresult cuFoo(args)": keep the name, without return type and arguments.
    std::string f(function);
    if (const auto paren = f.find('('); paren != std::string::npos) f.resize(paren);
    if (const auto space = f.rfind(' '); space != std::string::npos) f.erase(0, space + 1);
    std::lock_guard lk(errors().mu);
    ++errors().counts[{f, static_cast<int>(st)}];
  } catch (...) {
  }
}

void note_unsupported(std::string_view what) noexcept {
  try {
    Book& b = book();
    std::lock_guard lk(b.mu);
    ++b.counts[std::string(what)];
  } catch (...) {
  }
}

}  // namespace ivcuda::guest
