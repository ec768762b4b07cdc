// See plain_file.h.
#include "host-daemon/daemon/plain_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "host-daemon/shared/rules.h"
#include "ivcuda/shm_abi.h"

namespace ivcuda::host {

namespace {

Error refused(const std::string& path, const std::string& why) {
  return make_error(EPERM, path + ": refused: " + why + " (docs/libvirt.md, \"ivshmem-plain\")");
}

// Why somebody other than root and the daemon's user could put another file
// under this name in directory `dir`, or "" when nobody can.
std::string replaceable(const struct stat& st, const std::string& dir) {
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    return dir + " belongs to uid " + std::to_string(st.st_uid) + ", who can replace what is in it";
  // Sticky: others may add files but not remove or rename ours.
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0)
    return dir + " may be written by others (and it has no sticky bit)";
  return "";
}

// The directory `path` names its file in, walked from / without following a
// link, each step checked; the file's own name in *name.
Result<sys::UniqueFd> open_directory(const std::string& path, std::string* name) {
  if (path.empty() || path[0] != '/') return refused(path, "not an absolute path");
  const auto last = path.rfind('/');
  *name = path.substr(last + 1);
  if (name->empty() || *name == "." || *name == "..") return refused(path, "names no file");
  sys::UniqueFd dir(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  std::string walked = "/";
  for (std::size_t at = 0;;) {
    struct stat st {};
    if (!dir.valid() || ::fstat(dir.get(), &st) != 0)
      return make_error(errno, path + ": " + walked + ": " + std::strerror(errno));
    if (const std::string why = replaceable(st, walked); !why.empty()) return refused(path, why);
    const auto next = path.find('/', at + 1);
    if (next == std::string::npos || next > last) break;
    const std::string part = path.substr(at + 1, next - at - 1);
    at = next;
    if (part.empty() || part == ".") continue;
    if (part == "..") return refused(path, "a path with .. in it");
    walked += part + "/";
    dir = sys::UniqueFd(::openat(dir.get(), part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid())
      return errno == ENOTDIR || errno == ELOOP
                 ? refused(path, walked + " is a symbolic link or no directory (give the real path)")
                 : make_error(errno, path + ": " + walked + ": " + std::strerror(errno));
  }
  return dir;
}

// An existing file: served again only if an ivcudad made it (a restart while
// QEMU still maps it) and nobody else can reach it.
Result<void> check_existing(const std::string& path, int fd, gid_t group) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return refused(path, "it exists and is no regular file");
  if (st.st_uid != ::geteuid())
    return refused(path, "it exists and belongs to uid " + std::to_string(st.st_uid) + ", not to ivcudad");
  if (st.st_nlink != 1) return refused(path, "it exists with " + std::to_string(st.st_nlink) + " links");
  if ((st.st_mode & S_IRWXO) != 0) return refused(path, "it exists and others may open it");
  if ((st.st_mode & S_IRWXG) != 0 && (group == static_cast<gid_t>(-1) || st.st_gid != group))
    return refused(path, "it exists and group " + std::to_string(st.st_gid) + " may open it (not --socket-group)");
  std::uint64_t magic = 0;
  if (::pread(fd, &magic, sizeof magic, 0) != static_cast<ssize_t>(sizeof magic) || magic != abi::kMagic)
    return refused(path, "it exists and is no memory file ivcudad made (remove it if it is stale)");
  return {};
}

}  // namespace

Result<PlainFile> open_plain_file(const std::string& path, std::uint64_t size, gid_t group) {
  PlainFile f;
  if (!IVCUDA_RULE("plain-file-exclusive")) {
    // The mutation build's stand-in for the rule removed: whatever is there.
    f.fd = sys::UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  } else {
    std::string name;
    IVCUDA_TRY_ASSIGN(const sys::UniqueFd dir, open_directory(path, &name));
    f.fd = sys::UniqueFd(::openat(dir.get(), name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    f.created = f.fd.valid();
    if (!f.fd.valid() && errno == EEXIST) {
      // O_NONBLOCK: a FIFO put there must not hold the daemon up.
      f.fd = sys::UniqueFd(::openat(dir.get(), name.c_str(), O_RDWR | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC));
      if (!f.fd.valid() && errno == ELOOP) return refused(path, "it is a symbolic link");
      if (f.fd.valid()) IVCUDA_TRY(check_existing(path, f.fd.get(), group));
    }
  }
  if (!f.fd.valid()) return make_error(errno, path + ": " + std::strerror(errno));
  // QEMU's user reaches the file through the group of the daemon's sockets.
  if (f.created && group != static_cast<gid_t>(-1) &&
      (::fchown(f.fd.get(), static_cast<uid_t>(-1), group) != 0 || ::fchmod(f.fd.get(), 0660) != 0))
    return make_error(errno, path + ": cannot give it to group " + std::to_string(group) + ": " + std::strerror(errno));
  if (::ftruncate(f.fd.get(), static_cast<off_t>(size)) != 0)
    return make_error(errno, path + ": " + std::strerror(errno));
  return f;
}

}  // namespace ivcuda::host
