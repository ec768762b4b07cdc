#include "guest/unsupported.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "guest/api/api_table.h"

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
  const char* where = std::getenv("IVCUDA_LOG_UNSUPPORTED");
  if (where == nullptr || *where == '\0') return;
  try {
    std::map<std::string, unsigned long> all;
    {
      std::lock_guard lk(book().mu);
      all = book().counts;
    }
    for (std::size_t i = 0; i < api::detail::kSymbolCount; ++i)
      if (const unsigned n = api::detail::stub_calls(i); n != 0)
        all[std::string(api::detail::kSymbols[i].symbol) + " (not forwarded)"] += n;
    const bool to_file = std::strcmp(where, "1") != 0;
    FILE* out = to_file ? std::fopen(where, "a") : stderr;
    if (out == nullptr) return;
    std::fprintf(out, "ivcuda: process %d: %zu kind(s) of call answered NOT_SUPPORTED\n",
                 static_cast<int>(::getpid()), all.size());
    for (const auto& [what, n] : all) std::fprintf(out, "ivcuda: NOT_SUPPORTED %s: %lu call(s)\n", what.c_str(), n);
    if (to_file) std::fclose(out);
  } catch (...) {
  }
}

}  // namespace

void note_unsupported(std::string_view what) noexcept {
  try {
    Book& b = book();
    std::lock_guard lk(b.mu);
    ++b.counts[std::string(what)];
  } catch (...) {
  }
}

}  // namespace ivcuda::guest
