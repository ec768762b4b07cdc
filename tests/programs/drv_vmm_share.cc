// Sharing a physical allocation between two processes as NCCL and PyTorch do:
// cuMemCreate with POSIX file descriptor handles, cuMemExportToShareableHandle,
// the fd sent to another process over a UNIX socket (SCM_RIGHTS), and
// cuMemImportFromShareableHandle + cuMemMap there. The child writes through
// its own mapping what the parent then reads through its own. Also: an
// import in the exporting process itself, and fds that are no exported
// memory (a forged one, /dev/null).
//   drv_vmm_share                         parent: runs the child itself
//   drv_vmm_share --child-socket PATH     the child talks to ivcudad on PATH
//                                         (another tenant): its import must fail
// The child is this program run again (fork + exec, so that it starts CUDA
// afresh), with the socket fd as argument.
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "check.h"

extern char** environ;

namespace {

bool send_fd(int sock, int fd, std::uint64_t size) {
  iovec iov{&size, sizeof size};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  h.msg_control = ctl;
  h.msg_controllen = sizeof ctl;
  cmsghdr* c = CMSG_FIRSTHDR(&h);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return ::sendmsg(sock, &h, 0) == static_cast<ssize_t>(sizeof size);
}

int recv_fd(int sock, std::uint64_t* size) {
  iovec iov{size, sizeof *size};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  h.msg_control = ctl;
  h.msg_controllen = sizeof ctl;
  if (::recvmsg(sock, &h, 0) != static_cast<ssize_t>(sizeof *size)) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&h);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

CUmemAllocationProp fd_prop(CUdevice dev) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// Maps `h` (size bytes) at a fresh reservation with read-write access.
CUdeviceptr map_rw(CUmemGenericAllocationHandle h, size_t size, CUdevice dev) {
  CUdeviceptr va = 0;
  OK(cuMemAddressReserve(&va, size, 0, 0, 0));
  OK(cuMemMap(va, size, 0, h, 0));
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  OK(cuMemSetAccess(va, size, &acc, 1));
  return va;
}

void unmap(CUdeviceptr va, size_t size) {
  OK(cuMemUnmap(va, size));
  OK(cuMemAddressFree(va, size));
}

void start_cuda(CUdevice* dev) {
  OK(cuInit(0));
  OK(cuDeviceGet(dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, *dev));
  OK(cuCtxSetCurrent(ctx));
}

// The child: imports what the parent sent, checks the parent's bytes and
// adds one to each. Answers one byte: 'y' done, 'n' the import failed.
int child(int sock, bool foreign) {
  CUdevice dev;
  start_cuda(&dev);
  std::uint64_t size = 0;
  const int fd = recv_fd(sock, &size);
  EXPECT(fd >= 0);
  CUmemGenericAllocationHandle h = 0;
  const CUresult imp = cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  std::printf("child: import of the parent's allocation -> %s\n", check::name(imp));
  if (foreign) {
    EXPECT(imp == CUDA_ERROR_UNKNOWN);  // another tenant's token is no exported memory here
    const char no = 'n';
    EXPECT(::write(sock, &no, 1) == 1);
    return check::finish("drv_vmm_share child");
  }
  EXPECT(imp == CUDA_SUCCESS);
  CUmemAllocationProp got{};
  OK(cuMemGetAllocationPropertiesFromHandle(&got, h));
  EXPECT(got.location.type == CU_MEM_LOCATION_TYPE_DEVICE);
  const CUdeviceptr va = map_rw(h, size, dev);
  std::vector<unsigned char> buf(size);
  OK(cuMemcpyDtoH(buf.data(), va, size));
  EXPECT(buf == check::random_bytes(size, 11));
  for (auto& b : buf) b = static_cast<unsigned char>(b + 1);
  OK(cuMemcpyHtoD(va, buf.data(), size));
  OK(cuCtxSynchronize());
  unmap(va, size);
  OK(cuMemRelease(h));
  ::close(fd);
  const char yes = 'y';
  EXPECT(::write(sock, &yes, 1) == 1);
  return check::finish("drv_vmm_share child");
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* c = check::arg(argc, argv, "--child-fd")) return child(std::atoi(c), argc > 3);
  const char* foreign_socket = check::arg(argc, argv, "--child-socket");

  // The child starts before this process touches CUDA.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 2;
  const std::string fd_arg = std::to_string(sv[1]);
  std::vector<const char*> cargv = {"/proc/self/exe", "--child-fd", fd_arg.c_str()};
  if (foreign_socket != nullptr) cargv.push_back("--foreign");
  cargv.push_back(nullptr);
  std::vector<std::string> env_store;
  std::vector<char*> cenv;
  for (char** e = environ; *e != nullptr; ++e) {
    if (foreign_socket != nullptr && std::strncmp(*e, "IVCUDA_SOCKET=", 14) == 0) continue;
    cenv.push_back(*e);
  }
  if (foreign_socket != nullptr) {
    env_store.push_back(std::string("IVCUDA_SOCKET=") + foreign_socket);
    cenv.push_back(env_store.back().data());
  }
  cenv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, const_cast<char* const*>(cargv.data()),
                    cenv.data()) != 0)
    return 2;
  ::close(sv[1]);

  CUdevice dev;
  start_cuda(&dev);
  const CUmemAllocationProp prop = fd_prop(dev);
  size_t g = 0;
  OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t size = 2 * g;
  CUmemGenericAllocationHandle h = 0;
  OK(cuMemCreate(&h, size, &prop, 0));
  const CUdeviceptr va = map_rw(h, size, dev);
  const auto data = check::random_bytes(size, 11);
  OK(cuMemcpyHtoD(va, data.data(), size));
  int fd = -1;
  OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT(fd >= 0);

  // In this very process: the import is another handle of the same memory.
  CUmemGenericAllocationHandle same = 0;
  OK(cuMemImportFromShareableHandle(&same, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  const CUdeviceptr va2 = map_rw(same, size, dev);
  std::vector<unsigned char> back(size);
  OK(cuMemcpyDtoH(back.data(), va2, size));
  EXPECT(back == data);
  std::printf("parent: the import in the exporting process aliases the allocation: %s\n",
              back == data ? "yes" : "no");
  unmap(va2, size);
  OK(cuMemRelease(same));

  // Another process.
  EXPECT(send_fd(sv[0], fd, size));
  char answer = 0;
  EXPECT(::read(sv[0], &answer, 1) == 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (foreign_socket == nullptr) {
    EXPECT(answer == 'y');
    OK(cuMemcpyDtoH(back.data(), va, size));
    bool plus_one = true;
    for (size_t i = 0; i < size; ++i) plus_one &= back[i] == static_cast<unsigned char>(data[i] + 1);
    EXPECT(plus_one);
    std::printf("parent: sees what the child wrote through its own mapping: %s\n", plus_one ? "yes" : "no");
  } else {
    EXPECT(answer == 'n');
  }

  // Files that are no exported memory.
  const int forged = ::memfd_create("not-exported", MFD_CLOEXEC);
  const auto junk = check::random_bytes(64, 3);
  EXPECT(::write(forged, junk.data(), junk.size()) == 64);
  CUmemGenericAllocationHandle bad = 0;
  std::printf("import of a memfd of random bytes -> %s\n",
              check::name(cuMemImportFromShareableHandle(&bad, reinterpret_cast<void*>(static_cast<std::intptr_t>(forged)),
                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::printf("import of /dev/null -> %s\n",
              check::name(cuMemImportFromShareableHandle(&bad, reinterpret_cast<void*>(static_cast<std::intptr_t>(devnull)),
                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemImportFromShareableHandle(nullptr, reinterpret_cast<void*>(3),
                                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  ::close(forged);
  ::close(devnull);
  // An allocation made without the fd handle type cannot be exported as one.
  CUmemAllocationProp plain = prop;
  plain.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  CUmemGenericAllocationHandle hp = 0;
  OK(cuMemCreate(&hp, g, &plain, 0));
  int fd2 = -1;
  std::printf("export of an allocation made without fd handles -> %s\n",
              check::name(cuMemExportToShareableHandle(&fd2, hp, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
  OK(cuMemRelease(hp));

  ::close(fd);
  unmap(va, size);
  OK(cuMemRelease(h));
  return check::finish("drv_vmm_share");
}
