// The compile cache behind export table da9151d3... (guest/compile_cache.h).
// Entries are keyed by everything NVRTC hands over when it opens one - the
// stage, the input's bytes, the options and the compiler build - compared in
// full, so a hit returns exactly what NVRTC stored for that same key. The cache
// lives in this process's memory, bounded (oldest entries go first), and on
// disk, as the driver keeps its own JIT cache across processes: each entry is
// a file of CUDA_CACHE_PATH/ivcuda-nvrtc (default ~/.nv/ComputeCache), in the
// guest's own file system; CUDA_CACHE_DISABLE=1 keeps none there, and
// CUDA_CACHE_MAXSIZE (bytes, 256 MiB by default, at most 4 GiB) bounds the
// directory, the files used longest ago going first. A file is trusted no more
// than memory is: its key is compared in full, and a short or odd one is a miss.
#include "guest/compile_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

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

// ------------------------------------------------------------------ disk

constexpr char kMagic[8] = {'I', 'V', 'C', 'N', 'V', 'R', 'C', '1'};
constexpr std::uint64_t kDefaultDiskBytes = std::uint64_t{256} << 20;  // the driver's default
constexpr std::uint64_t kMaxDiskBytes = std::uint64_t{4} << 30;         // and its largest

struct Disk {
  std::string dir;
  std::uint64_t max_bytes;
};

// Read at each use: a program may set the variables before it first compiles.
std::optional<Disk> disk() {
  const char* off = std::getenv("CUDA_CACHE_DISABLE");
  if (off != nullptr && std::strcmp(off, "1") == 0) return std::nullopt;
  Disk d{{}, kDefaultDiskBytes};
  if (const char* p = std::getenv("CUDA_CACHE_PATH"); p != nullptr && *p != '\0') {
    d.dir = p;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    d.dir = std::string(h) + "/.nv/ComputeCache";
  } else {
    return std::nullopt;
  }
  d.dir += "/ivcuda-nvrtc";
  if (const char* m = std::getenv("CUDA_CACHE_MAXSIZE"); m != nullptr && *m != '\0') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(m, &end, 10);
    if (*end == '\0') d.max_bytes = std::min<std::uint64_t>(v, kMaxDiskBytes);
  }
  if (d.max_bytes == 0) return std::nullopt;
  return d;
}

std::string file_of(const Disk& d, const std::string& key) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a; the key itself is compared on reading
  for (const char ch : key) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  char name[32];
  std::snprintf(name, sizeof name, "/%016llx.ivc", static_cast<unsigned long long>(h));
  return d.dir + name;
}

bool read_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// What a file holds for `key`, or nothing; a hit counts as a use (its time).
std::optional<std::string> disk_lookup(const std::string& key) {
  const auto d = disk();
  if (!d) return std::nullopt;
  const int fd = ::open(file_of(*d, key).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> out;
  struct stat st {};
  char head[sizeof kMagic + 16];
  std::uint64_t key_len = 0, data_len = 0;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && read_all(fd, head, sizeof head) &&
      std::memcmp(head, kMagic, sizeof kMagic) == 0) {
    std::memcpy(&key_len, head + 8, 8);
    std::memcpy(&data_len, head + 16, 8);
    if (key_len == key.size() && data_len <= kMaxBytes &&
        static_cast<std::uint64_t>(st.st_size) == sizeof head + key_len + data_len) {
      try {
        std::string k(key_len, '\0'), v(data_len, '\0');
        if (read_all(fd, k.data(), k.size()) && k == key && read_all(fd, v.data(), v.size())) out = std::move(v);
      } catch (const std::bad_alloc&) {
      }
    }
  }
  if (out) (void)::futimens(fd, nullptr);
  ::close(fd);
  return out;
}

// The directory's files beyond its bound go, those used longest ago first.
void disk_prune(const Disk& d) {
  DIR* dir = ::opendir(d.dir.c_str());
  if (dir == nullptr) return;
  struct File {
    std::string path;
    std::int64_t when;
    std::uint64_t bytes;
  };
  std::vector<File> files;
  std::uint64_t total = 0;
  while (dirent* e = ::readdir(dir)) {
    const std::size_t n = std::strlen(e->d_name);
    if (n < 4 || std::strcmp(e->d_name + n - 4, ".ivc") != 0) continue;
    struct stat st {};
    std::string path = d.dir + "/" + e->d_name;
    if (::fstatat(::dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    files.push_back({std::move(path), static_cast<std::int64_t>(st.st_mtime), static_cast<std::uint64_t>(st.st_size)});
    total += static_cast<std::uint64_t>(st.st_size);
  }
  ::closedir(dir);
  if (total <= d.max_bytes) return;
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.when < b.when; });
  for (const File& f : files) {
    if (total <= d.max_bytes / 10 * 9) break;
    if (::unlink(f.path.c_str()) == 0) total -= f.bytes;
  }
}

// Written whole under a name of its own, then renamed into place: a reader
// sees the old file, the new one, or none.
void disk_store(const std::string& key, const void* data, std::size_t len) {
  const auto d = disk();
  if (!d || sizeof kMagic + 16 + key.size() + len > d->max_bytes) return;
  for (std::size_t at = d->dir.find('/', 1);; at = d->dir.find('/', at + 1)) {
    const std::string part = d->dir.substr(0, at);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return;
    if (at == std::string::npos) break;
  }
  static std::atomic<unsigned> serial{0};
  char tmp_name[64];
  std::snprintf(tmp_name, sizeof tmp_name, "/.tmp-%d-%u", static_cast<int>(::getpid()), serial.fetch_add(1));
  const std::string tmp = d->dir + tmp_name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  char head[sizeof kMagic + 16];
  const std::uint64_t key_len = key.size(), data_len = len;
  std::memcpy(head, kMagic, sizeof kMagic);
  std::memcpy(head + 8, &key_len, 8);
  std::memcpy(head + 16, &data_len, 8);
  const bool ok = write_all(fd, head, sizeof head) && write_all(fd, key.data(), key.size()) &&
                  write_all(fd, static_cast<const char*>(data), len);
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), file_of(*d, key).c_str()) != 0) {
    ::unlink(tmp.c_str());
    return;
  }
  disk_prune(*d);
}

// Keeps a copy in memory (c.mu held), the oldest going past kMaxBytes.
void remember(Cache& c, const std::string& key, std::string value) {
  if (c.by_key.count(key) != 0) return;
  while (c.bytes + key.size() + value.size() > kMaxBytes && !c.order.empty()) {
    auto old = c.by_key.find(*c.order.front());
    if (old != c.by_key.end()) {
      c.bytes -= old->first.size() + old->second.size();
      c.by_key.erase(old);
    }
    c.order.pop_front();
  }
  const std::size_t n = key.size() + value.size();
  const auto [it, fresh] = c.by_key.emplace(key, std::move(value));
  (void)fresh;
  c.order.push_back(&it->first);  // node keys stay where they are until erased
  c.bytes += n;
}

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
  const std::string& key = static_cast<Entry*>(entry)->key;
  Cache& c = cache();
  std::unique_lock lk(c.mu);
  ++c.counts.lookups;
  auto it = c.by_key.find(key);
  if (it == c.by_key.end()) {
    // Another process of the guest's may have compiled it: its file.
    lk.unlock();
    std::optional<std::string> found = disk_lookup(key);
    lk.lock();
    if (!found) return kNotFound;
    try {
      remember(c, key, std::move(*found));
    } catch (const std::bad_alloc&) {
      return kNotFound;
    }
    ++c.counts.disk_hits;
    it = c.by_key.find(key);
    if (it == c.by_key.end()) return kNotFound;
  }
  if (it->second.size() > UINT32_MAX) return kNotFound;
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
    {
      Cache& c = cache();
      std::lock_guard lk(c.mu);
      if (c.by_key.count(key) != 0) return 0;
      remember(c, key, std::string(static_cast<const char*>(data), len));
      c.counts.stored_bytes += len;
    }
    disk_store(key, data, len);
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
