// The compile cache behind export table da9151d3... (guest/compile_cache.h).
// Entries are keyed by everything NVRTC hands over when it opens one - the
// stage, the input's bytes, the options and the compiler build - compared in
// full, so a hit returns exactly what NVRTC stored for that same key. The cache
// lives in this process's memory, bounded (oldest entries go first).
#include "guest/compile_cache.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

namespace ivcuda::guest::compile_cache {
namespace {

constexpr int kNotFound = 500;      // CUDA_ERROR_NOT_FOUND, as the driver answers a miss
constexpr int kInvalidValue = 1;    // CUDA_ERROR_INVALID_VALUE
constexpr int kOutOfMemory = 2;     // CUDA_ERROR_OUT_OF_MEMORY
constexpr std::size_t kMaxBytes = std::size_t{512} << 20;  // keys and values together

struct Entry {
  std::string key;
};

struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::string> by_key;  // guarded by mu
  std::deque<const std::string*> order;                  // the map's keys, oldest first
  std::size_t bytes = 0;
  Counts counts;
};

Cache& cache() {
  static auto* c = new Cache;  // never destroyed: NVRTC may compile from exit handlers
  return *c;
}

void put(std::string& key, std::uint64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); }

}  // namespace

int open(void** entry, std::uint32_t stage, const void* input, std::size_t input_len, const char* options,
         const char* build) noexcept {
  if (entry == nullptr || (input == nullptr && input_len != 0)) return kInvalidValue;
  try {
    auto* e = new Entry;
    // Length-prefixed fields: no two different keys spell the same string.
    put(e->key, stage);
    put(e->key, input_len);
    e->key.append(static_cast<const char*>(input), input_len);
    for (const char* s : {options, build}) {
      const std::size_t n = s != nullptr ? std::strlen(s) : ~std::size_t{0};
      put(e->key, n);
      if (s != nullptr) e->key.append(s, n);
    }
    *entry = e;
    return 0;
  } catch (const std::bad_alloc&) {
    return kOutOfMemory;
  }
}

int close(void* entry, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t) noexcept {
  delete static_cast<Entry*>(entry);
  return 0;
}

int lookup(void* entry, std::uint64_t, void** data, std::uint32_t* len, std::uint64_t, std::uint64_t) noexcept {
  if (entry == nullptr || data == nullptr || len == nullptr) return kInvalidValue;
  Cache& c = cache();
  std::lock_guard lk(c.mu);
  ++c.counts.lookups;
  const auto it = c.by_key.find(static_cast<Entry*>(entry)->key);
  if (it == c.by_key.end() || it->second.size() > UINT32_MAX) return kNotFound;
  void* copy = std::malloc(it->second.empty() ? 1 : it->second.size());
  if (copy == nullptr) return kNotFound;  // compiling again is always right
  std::memcpy(copy, it->second.data(), it->second.size());
  *data = copy;
  *len = static_cast<std::uint32_t>(it->second.size());
  ++c.counts.hits;
  return 0;
}

int store(void* entry, std::uint64_t, const void* data, std::size_t len, std::uint64_t, std::uint64_t) noexcept {
  if (entry == nullptr || (data == nullptr && len != 0)) return kInvalidValue;
  const std::string& key = static_cast<Entry*>(entry)->key;
  if (key.size() + len > kMaxBytes) return 0;  // too big to keep: not an error
  try {
    Cache& c = cache();
    std::lock_guard lk(c.mu);
    if (c.by_key.count(key) != 0) return 0;
    while (c.bytes + key.size() + len > kMaxBytes && !c.order.empty()) {
      auto old = c.by_key.find(*c.order.front());
      if (old != c.by_key.end()) {
        c.bytes -= old->first.size() + old->second.size();
        c.by_key.erase(old);
      }
      c.order.pop_front();
    }
    const auto [it, fresh] = c.by_key.emplace(key, std::string(static_cast<const char*>(data), len));
    (void)fresh;
    c.order.push_back(&it->first);  // node keys stay where they are until erased
    c.bytes += key.size() + len;
    c.counts.stored_bytes += len;
    return 0;
  } catch (const std::bad_alloc&) {
    return 0;  // a cache that could not keep it: the next compile runs again
  }
}

int unknown5(std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t) noexcept {
  return kNotFound;
}

int release(void* data, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t) noexcept {
  std::free(data);
  return 0;
}

Counts counts() noexcept {
  Cache& c = cache();
  std::lock_guard lk(c.mu);
  return c.counts;
}

}  // namespace ivcuda::guest::compile_cache
