#include "ring/uio.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace ivcuda::uio {

using sys::Mapping;
using sys::UniqueFd;

Error errno_error(const std::string& what) {
  const int e = errno;
  return make_error(e, what + ": " + ivcuda::sys::errno_string(e));
}

Result<std::string> read_text(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_error("open " + path);
  char buf[256];
  const ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  if (n < 0) return errno_error("read " + path);
  std::string s(buf, static_cast<std::size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Parses a whole decimal or 0x-prefixed number.
Result<std::uint64_t> parse_u64(const std::string& s, const std::string& what) {
  if (s.empty() || s[0] == '-') return make_error(EINVAL, what + ": not a number: '" + s + "'");
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (errno != 0 || end == s.c_str() || *end != '\0')
    return make_error(EINVAL, what + ": not a number: '" + s + "'");
  return static_cast<std::uint64_t>(v);
}



Result<std::vector<UioVector>> find_vectors(const std::string& pci) {
  std::map<std::string, std::map<unsigned, unsigned>> by_pci;  // pci -> vector -> minor
  DIR* dir = ::opendir("/sys/class/uio");
  if (dir == nullptr) return errno_error("/sys/class/uio (is uio.ko loaded?)");
  while (const dirent* e = ::readdir(dir)) {
    unsigned minor = 0;
    char tail = 0;
    if (std::sscanf(e->d_name, "uio%u%c", &minor, &tail) != 1) continue;
    const std::string base = std::string("/sys/class/uio/") + e->d_name;
    auto name = read_text(base + "/name");
    unsigned vec = 0;
    if (!name || std::sscanf(name->c_str(), "ivcuda-vec%u%c", &vec, &tail) != 1) continue;
    char link[512];
    const ssize_t n = ::readlink((base + "/device").c_str(), link, sizeof link - 1);
    if (n <= 0) continue;
    link[n] = '\0';
    const char* slash = std::strrchr(link, '/');
    by_pci[slash != nullptr ? slash + 1 : link][vec] = minor;
  }
  ::closedir(dir);

  if (by_pci.empty()) return make_error(ENODEV, "no ivcuda UIO device (is ivcuda_uio.ko loaded?)");
  const auto it = pci.empty() ? by_pci.begin() : by_pci.find(pci);
  if (it == by_pci.end()) return make_error(ENODEV, "no ivcuda UIO device on PCI " + pci);
  std::vector<UioVector> out;
  for (const auto& [vec, minor] : it->second) {
    if (vec != out.size())
      return make_error(EPROTO, "ivcuda vectors of " + it->first + " are not 0..n-1");
    out.push_back({minor, it->first});
  }
  return out;
}



Result<Device> open_device(const std::string& pci) {
  Device d;
  IVCUDA_TRY_ASSIGN(d.vectors, find_vectors(pci));
  const std::string sys = "/sys/class/uio/uio" + std::to_string(d.vectors[0].minor);
  const std::string node = "/dev/uio" + std::to_string(d.vectors[0].minor);
  IVCUDA_TRY_ASSIGN(const std::string s0, read_text(sys + "/maps/map0/size"));
  IVCUDA_TRY_ASSIGN(const std::string o0, read_text(sys + "/maps/map0/offset"));
  IVCUDA_TRY_ASSIGN(const std::string s1, read_text(sys + "/maps/map1/size"));
  IVCUDA_TRY_ASSIGN(const std::uint64_t regs_size, parse_u64(s0, "map0 size"));
  IVCUDA_TRY_ASSIGN(d.regs_off, parse_u64(o0, "map0 offset"));
  IVCUDA_TRY_ASSIGN(const std::uint64_t shm_size, parse_u64(s1, "map1 size"));
  if (regs_size < kRegsUsed || d.regs_off > regs_size - kRegsUsed)
    return make_error(EPROTO, "map0 is too small for the ivshmem registers");

  UniqueFd fd(::open(node.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return errno_error("open " + node);
  // UIO selects map N by the mmap offset N * page size.
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  IVCUDA_TRY_ASSIGN(d.regs, Mapping::map_shared(fd.get(), regs_size, 0));
  IVCUDA_TRY_ASSIGN(d.shm, Mapping::map_shared(fd.get(), shm_size, page));
  return d;
}

}  // namespace ivcuda::uio
