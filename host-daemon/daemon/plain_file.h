// The memory file of an ivshmem-plain guest (--plain-file). The daemon runs
// as root and QEMU maps the same file as the VM's BAR, so whoever controls
// the path controls either a file root writes (a symbolic link made it
// overwrite /etc/...) or the VM's GPU traffic (a file a local user made
// beforehand). The rule (docs/security.md, `plain-file-exclusive`):
//   - every directory from / down to the file belongs to root or the daemon's
//     user, is no symbolic link, and nobody else may write it - except where
//     the sticky bit keeps others from replacing files they do not own
//     (/dev/shm, which libvirt imposes: docs/libvirt.md);
//   - the file is made here, exclusively (O_CREAT|O_EXCL|O_NOFOLLOW), or it is
//     one an ivcudad made before (a restart while QEMU still maps it): a
//     regular file of the daemon's user with one link, no access for others,
//     group access only for `group`, and ivcuda's superblock magic at its start.
// Anything else is refused, and the daemon does not serve that file.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "ivcuda/result.h"
#include "ring/sys.h"

namespace ivcuda::host {

struct PlainFile {
  sys::UniqueFd fd;
  bool created = false;  // made by this call (else: an ivcudad's earlier file)
};

// Opens (or makes) `path` as above and sizes it to `size`. group: the
// --socket-group (QEMU's user is in it): the file gets it and mode 0660;
// -1 keeps the file the daemon's alone (0600).
Result<PlainFile> open_plain_file(const std::string& path, std::uint64_t size, gid_t group);

}  // namespace ivcuda::host
