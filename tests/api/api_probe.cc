// api_probe LIBCUDA REQUESTS: asks LIBCUDA's cuGetProcAddress_v2 a fixed battery of questions
// and prints one line per answer, naming the returned function by the exported symbol at that
// address. Run against NVIDIA's driver it records the truth (data/real_driver_answers.txt);
// run against ivcuda's library its output must match that record line for line.
//
// Questions: every line of REQUESTS (cudart 13's start-up lookups), then for every public name
// in this library's cuGetProcAddress table each ABI version, one below it and the headers'
// version, with flags 0, 1, 2 and 3, then edge cases (empty and unknown names, versions newer
// than the driver).
#include <cuda.h>
#include <dlfcn.h>

#include <climits>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "guest/api/api_table.h"

namespace {

// symbolStatus is read as an int: "left untouched" (-1) is no value of the enum, and loading
// it as one would be undefined behaviour. Same size and register class, so the same ABI.
using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t, int*);
static_assert(sizeof(CUdriverProcAddressQueryResult) == sizeof(int));

struct Question {
  std::string name;
  int version;
  unsigned long long flags;
  bool operator<(const Question& o) const {
    return std::tie(name, version, flags) < std::tie(o.name, o.version, o.flags);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s LIBCUDA REQUESTS\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "api_probe: dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  auto get = reinterpret_cast<GetProcAddressV2>(dlsym(lib, "cuGetProcAddress_v2"));
  if (get == nullptr) {
    std::fprintf(stderr, "api_probe: %s has no cuGetProcAddress_v2\n", argv[1]);
    return 1;
  }
  // Name answers by address: the driver may hand out the same entry points dlsym does.
  std::map<void*, std::string> names;
  for (const auto& row : ivcuda::api::detail::kSymbols) {
    const std::string s(row.symbol);
    if (void* p = dlsym(lib, s.c_str())) names.emplace(p, s);
  }

  std::vector<Question> asked;
  std::ifstream in(argv[2]);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;  // data/cudart13-requests.tsv: symbol, version, flags, kind
    const auto sp = line.find('\t');
    Question q{line.substr(0, sp), 0, 0};
    if (q.name == "-") q.name.clear();  // the empty name
    if (sp == std::string::npos || std::sscanf(line.c_str() + sp, "%d %llu", &q.version, &q.flags) != 2) {
      std::fprintf(stderr, "api_probe: bad request line: %s\n", line.c_str());
      return 1;
    }
    asked.push_back(q);
  }
  std::set<Question> sweep;
  for (const auto& e : ivcuda::api::detail::kProcEntries) {
    for (int v : {e.version - 10, e.version, CUDA_VERSION}) {
      if (v <= 0) continue;
      for (unsigned long long f : {0ull, 1ull, 2ull, 3ull}) sweep.insert({std::string(e.name), v, f});
    }
  }
  asked.insert(asked.end(), sweep.begin(), sweep.end());
  for (const char* n : {"", "cuNoSuchFunction", "cuMemAlloc_v2", "cuGetProcAddress_v2", "CUMEMALLOC"}) {
    asked.push_back({n, CUDA_VERSION, 0});
  }
  for (int v : {CUDA_VERSION + 10, CUDA_VERSION + 1000, 0, 1, -1, INT_MIN}) {
    for (unsigned long long f : {0ull, 2ull}) {
      asked.push_back({"cuMemAlloc", v, f});
      asked.push_back({"cuMemcpyHtoD", v, f});
    }
  }
  for (unsigned long long f : {4ull, 6ull, 1ull << 63}) asked.push_back({"cuMemAlloc", 3020, f});

  static char sentinel;  // tells "left *pfn alone" from "wrote NULL"
  for (const auto& q : asked) {
    void* fn = &sentinel;
    auto status = -1;
    const CUresult rc = get(q.name.c_str(), &fn, q.version, q.flags, &status);
    std::string what;
    if (fn == nullptr) {
      what = "NULL";
    } else if (fn == &sentinel) {
      what = "UNWRITTEN";
    } else if (auto it = names.find(fn); it != names.end()) {
      what = it->second;
    } else {
      what = "UNNAMED";
    }
    std::printf("'%s' %d %llu -> rc=%d status=%d %s\n", q.name.c_str(), q.version, q.flags,
                static_cast<int>(rc), status, what.c_str());
  }
  // Last, in case a driver does not survive it.
  std::fflush(stdout);
  void* fn = &sentinel;
  auto status = -1;
  const CUresult rc = get(nullptr, &fn, CUDA_VERSION, 0, &status);
  std::printf("(null) %d 0 -> rc=%d status=%d %s\n", CUDA_VERSION, static_cast<int>(rc),
              status, fn == nullptr ? "NULL" : fn == &sentinel ? "UNWRITTEN" : "SET");
  return 0;
}
