// Sharing a memory pool between two processes, as cuda.core's IPC-enabled
// memory resources and UCX do: a pool made with POSIX file descriptor
// handles, cuMemPoolExportToShareableHandle, the fd sent to another process
// over a UNIX socket (SCM_RIGHTS) with a pointer's CUmemPoolPtrExportData,
// cuMemPoolImportFromShareableHandle + cuMemPoolImportPointer there. The
// child reads what the parent wrote, writes its own through the imported
// pointer (a memset, a copy and, with --ptx, a kernel) and frees it; the
// parent checks what the child wrote. Also printed, for native and ivcuda
// runs to be compared: imports in the exporting process itself, export data
// of another pool, an imported pool asked to allocate, fds that are no
// exported pool.
//   drv_pool_share [--ptx test_kernels.ptx] [--forged]
//   drv_pool_share --child-socket PATH    the child talks to ivcudad on PATH
//                                         (another tenant): its import must fail
// --forged: the child also imports export data with each byte flipped and
// random bytes, and expects CUDA_ERROR_INVALID_VALUE with nothing imported
// (what ivcuda promises; a real driver's answer to forged data is its own
// business, so native comparisons run without it).
// The child is this program run again (spawned before the parent touches
// CUDA, so that it starts CUDA afresh), with the socket fd as argument.
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

constexpr size_t kBytes = 1 << 20;
constexpr size_t kWords = kBytes / 4;
constexpr size_t kHead = 4096 / 4;  // words the child writes with a copy
constexpr unsigned kFill = 0x5a5a5a5au;
constexpr unsigned kKernelFill = 0x0badf00du;
unsigned pattern_a(size_t i) { return static_cast<unsigned>(i * 3 + 1); }
unsigned pattern_b(size_t i) { return static_cast<unsigned>(i * 7 + 2); }

// What travels with the pool's fd.
struct Message {
  CUmemPoolPtrExportData ptr;    // the shared allocation, of the exported pool
  CUmemPoolPtrExportData other;  // an allocation of another pool
};

bool send_fd(int sock, int fd, const Message& m) {
  iovec iov{const_cast<Message*>(&m), sizeof m};
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
  return ::sendmsg(sock, &h, 0) == static_cast<ssize_t>(sizeof m);
}

int recv_fd(int sock, Message* m) {
  iovec iov{m, sizeof *m};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  h.msg_control = ctl;
  h.msg_controllen = sizeof ctl;
  if (::recvmsg(sock, &h, MSG_WAITALL) != static_cast<ssize_t>(sizeof *m)) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&h);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

bool say(int fd, char c) { return ::write(fd, &c, 1) == 1; }
bool hear(int fd, char want) {
  char c = 0;
  return ::read(fd, &c, 1) == 1 && c == want;
}

void* as_handle(int fd) { return reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)); }

CUmemPoolProps fd_pool_props(CUdevice dev) {
  CUmemPoolProps p{};
  p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

void start_cuda(CUdevice* dev) {
  OK(cuInit(0));
  OK(cuDeviceGet(dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, *dev));
  OK(cuCtxSetCurrent(ctx));
}

bool child_pattern(const std::vector<unsigned>& v, bool kernel) {
  for (size_t i = 0; i < kWords; ++i) {
    const unsigned want = i < kHead ? pattern_b(i) : (kernel && i >= kWords / 2) ? kKernelFill : kFill;
    if (v[i] != want) return false;
  }
  return true;
}

// Export data with one byte changed, or random bytes: nothing may come of it.
void forged_imports(CUmemoryPool pool, const CUmemPoolPtrExportData& real) {
  bool all_refused = true, nothing_out = true;
  for (size_t i = 0; i < sizeof real.reserved; ++i) {
    CUmemPoolPtrExportData bad = real;
    bad.reserved[i] = static_cast<unsigned char>(bad.reserved[i] ^ 0x10);
    CUdeviceptr p = 0;
    all_refused &= cuMemPoolImportPointer(&p, pool, &bad) == CUDA_ERROR_INVALID_VALUE;
    nothing_out &= p == 0;
  }
  CUmemPoolPtrExportData noise{};
  const auto bytes = check::random_bytes(sizeof noise.reserved, 77);
  std::memcpy(noise.reserved, bytes.data(), sizeof noise.reserved);
  CUdeviceptr p = 0;
  all_refused &= cuMemPoolImportPointer(&p, pool, &noise) == CUDA_ERROR_INVALID_VALUE;
  nothing_out &= p == 0;
  EXPECT(all_refused);
  EXPECT(nothing_out);
  std::printf("child: forged export data (each byte flipped, random bytes): %s\n",
              all_refused && nothing_out ? "all refused, nothing imported" : "WRONG");
}

// The child: imports the pool and the parent's allocation, checks the
// parent's data, writes its own. Answers 'W' once written (the parent checks
// and answers 'F'), then frees what it imported and answers 'D'; 'n' when
// the pool would not import (another tenant).
int child(int sock, const char* ptx, bool forged, bool foreign) {
  CUdevice dev;
  start_cuda(&dev);
  Message m{};
  const int fd = recv_fd(sock, &m);
  EXPECT(fd >= 0);
  CUmemoryPool pool = nullptr;
  const CUresult imp = cuMemPoolImportFromShareableHandle(&pool, as_handle(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  ::close(fd);
  if (foreign) {
    // Another tenant's token is no exported pool here: the driver's answer for one.
    std::printf("child: import of another tenant's pool: %s\n", imp == CUDA_SUCCESS ? "imported" : "refused");
    EXPECT(imp != CUDA_SUCCESS);
    std::fflush(stdout);
    EXPECT(say(sock, 'n'));
    return check::finish("drv_pool_share child");
  }
  std::printf("child: import of the parent's pool -> %s\n", check::name(imp));
  EXPECT(imp == CUDA_SUCCESS);
  if (imp != CUDA_SUCCESS) {
    std::fflush(stdout);
    say(sock, 'n');
    return check::finish("drv_pool_share child");
  }
  CUstream s = nullptr;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr none = 0;
  std::printf("child: allocate from the imported pool -> %s\n",
              check::name(cuMemAllocFromPoolAsync(&none, 4096, pool, s)));
  std::printf("child: make the imported pool the device's current pool -> %s\n",
              check::name(cuDeviceSetMemPool(dev, pool)));
  CUdeviceptr wrong = 0;
  std::printf("child: import a pointer of another pool -> %s\n",
              check::name(cuMemPoolImportPointer(&wrong, pool, &m.other)));
  EXPECT(wrong == 0);
  if (forged) forged_imports(pool, m.ptr);

  CUdeviceptr p = 0;
  OK(cuMemPoolImportPointer(&p, pool, &m.ptr));
  EXPECT(p != 0);
  CUdeviceptr base = 0;
  size_t size = 0;
  OK(cuMemGetAddressRange(&base, &size, p + 100));
  EXPECT(base == p && size >= kBytes);
  unsigned type = 0;
  OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
  EXPECT(type == CU_MEMORYTYPE_DEVICE);
  std::vector<unsigned> v(kWords);
  OK(cuMemcpyDtoH(v.data(), p, kBytes));
  bool same = true;
  for (size_t i = 0; i < kWords; ++i) same = same && v[i] == pattern_a(i);
  EXPECT(same);
  std::printf("child: reads the parent's data through the imported pointer: %s\n", same ? "ok" : "WRONG");

  // Write through it: a memset, a copy, and a kernel.
  OK(cuMemsetD32Async(p, kFill, kWords, s));
  std::vector<unsigned> head(kHead);
  for (size_t i = 0; i < kHead; ++i) head[i] = pattern_b(i);
  OK(cuMemcpyHtoDAsync(p, head.data(), kHead * 4, s));
  CUmodule mod = nullptr;
  if (ptx != nullptr) {
    const std::string image = check::read_file(ptx);
    CUfunction fill = nullptr;
    OK(cuModuleLoadData(&mod, image.c_str()));
    OK(cuModuleGetFunction(&fill, mod, "ivc_fill_u32"));
    CUdeviceptr dst = p + kBytes / 2;
    unsigned value = kKernelFill;
    unsigned long long n = kWords / 2;
    void* args[] = {&dst, &value, &n};
    OK(cuLaunchKernel(fill, 64, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  }
  OK(cuStreamSynchronize(s));
  std::fflush(stdout);
  if (!say(sock, 'W') || !hear(sock, 'F')) return 3;

  // Importers free before the exporter does (CUDA's rule).
  OK(cuMemFreeAsync(p, s));
  OK(cuStreamSynchronize(s));
  OK(cuMemPoolDestroy(pool));
  if (mod != nullptr) OK(cuModuleUnload(mod));
  OK(cuStreamDestroy(s));
  std::printf("child: freed the imported pointer and destroyed the imported pool\n");
  std::fflush(stdout);
  if (!say(sock, 'D')) return 3;
  return check::finish("drv_pool_share child");
}

// Files that are no exported pool: what the driver answers for each.
void not_pools() {
  CUmemoryPool bad = nullptr;
  const int forged = ::memfd_create("not-a-pool", MFD_CLOEXEC);
  const auto junk = check::random_bytes(64, 3);
  EXPECT(::write(forged, junk.data(), junk.size()) == 64);
  std::printf("parent: import of a memfd of random bytes -> %s\n",
              check::name(cuMemPoolImportFromShareableHandle(&bad, as_handle(forged),
                                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::printf("parent: import of /dev/null -> %s\n",
              check::name(cuMemPoolImportFromShareableHandle(&bad, as_handle(devnull),
                                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE,
             cuMemPoolImportFromShareableHandle(nullptr, as_handle(forged), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ::close(forged);
  ::close(devnull);
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  bool forged = false, foreign = false;
  for (int i = 1; i < argc; ++i) {
    forged |= std::strcmp(argv[i], "--forged") == 0;
    foreign |= std::strcmp(argv[i], "--foreign") == 0;
  }
  if (const char* c = check::arg(argc, argv, "--child-fd")) return child(std::atoi(c), ptx, forged, foreign);
  const char* foreign_socket = check::arg(argc, argv, "--child-socket");

  // The child starts before this process touches CUDA.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 2;
  if (::fcntl(sv[1], F_SETFD, 0) != 0) return 2;  // the child's end crosses exec
  const std::string fd_arg = std::to_string(sv[1]);
  std::vector<const char*> cargv = {"/proc/self/exe", "--child-fd", fd_arg.c_str()};
  if (ptx != nullptr) {
    cargv.push_back("--ptx");
    cargv.push_back(ptx);
  }
  if (forged) cargv.push_back("--forged");
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
  int types = 0;
  OK(cuDeviceGetAttribute(&types, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, dev));
  const bool fd_pools = (types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  std::printf("parent: pools offer POSIX fd handles: %s\n", fd_pools ? "yes" : "no");
  EXPECT(fd_pools);
  if (!fd_pools) {
    ::close(sv[0]);
    ::waitpid(pid, nullptr, 0);
    return check::finish("drv_pool_share");
  }

  const CUmemPoolProps props = fd_pool_props(dev);
  CUmemoryPool pool = nullptr, other = nullptr;
  OK(cuMemPoolCreate(&pool, &props));
  OK(cuMemPoolCreate(&other, &props));
  CUstream s = nullptr;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = 0, o = 0;
  OK(cuMemAllocFromPoolAsync(&d, kBytes, pool, s));
  OK(cuMemAllocFromPoolAsync(&o, 4096, other, s));
  std::vector<unsigned> v(kWords);
  for (size_t i = 0; i < kWords; ++i) v[i] = pattern_a(i);
  OK(cuMemcpyHtoDAsync(d, v.data(), kBytes, s));
  OK(cuStreamSynchronize(s));  // importers must not touch it before the allocation completed

  int fd = -1;
  OK(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT(fd >= 0);
  Message m{};
  OK(cuMemPoolExportPointer(&m.ptr, d));
  // The driver exports pointers only of a pool that was exported itself.
  std::printf("parent: export of a pointer of a pool never exported -> %s\n",
              check::name(cuMemPoolExportPointer(&m.other, o)));
  int other_fd = -1;
  OK(cuMemPoolExportToShareableHandle(&other_fd, other, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  OK(cuMemPoolExportPointer(&m.other, o));
  if (other_fd >= 0) ::close(other_fd);

  // In this very process: whatever the driver answers.
  CUmemoryPool self = nullptr;
  const CUresult self_imp =
      cuMemPoolImportFromShareableHandle(&self, as_handle(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  std::printf("parent: import of its own pool in the exporting process -> %s\n", check::name(self_imp));
  if (self_imp == CUDA_SUCCESS) {
    CUdeviceptr mine = 0;
    const CUresult self_ptr = cuMemPoolImportPointer(&mine, self, &m.ptr);
    std::printf("parent: import of its own pointer into it -> %s\n", check::name(self_ptr));
    if (self_ptr == CUDA_SUCCESS) {
      std::vector<unsigned> back(kWords);
      OK(cuMemcpyDtoH(back.data(), mine, kBytes));
      std::printf("parent: that pointer is the allocation's own address: %s; reads its data: %s\n",
                  mine == d ? "yes" : "no", back == v ? "yes" : "no");
      if (mine != d) OK(cuMemFree(mine));
    }
    OK(cuMemPoolDestroy(self));
  }
  // Refusals the driver makes in its own words.
  CUmemoryPool typed = nullptr;
  std::printf("parent: import as another handle type -> %s\n",
              check::name(cuMemPoolImportFromShareableHandle(&typed, as_handle(fd), CU_MEM_HANDLE_TYPE_NONE, 0)));
  CUdeviceptr q = 0;
  std::printf("parent: import a pointer into a pool that is not imported -> %s\n",
              check::name(cuMemPoolImportPointer(&q, pool, &m.ptr)));
  CUmemoryPool plain_pool = nullptr;
  CUmemPoolProps plain = props;
  plain.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  OK(cuMemPoolCreate(&plain_pool, &plain));
  int fd2 = -1;
  std::printf("parent: export of a pool made without fd handles -> %s\n",
              check::name(cuMemPoolExportToShareableHandle(&fd2, plain_pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
  OK(cuMemPoolDestroy(plain_pool));
  not_pools();

  // Another process.
  std::fflush(stdout);
  EXPECT(send_fd(sv[0], fd, m));
  ::close(fd);
  if (foreign_socket != nullptr) {
    EXPECT(hear(sv[0], 'n'));
  } else if (hear(sv[0], 'W')) {
    OK(cuMemcpyDtoH(v.data(), d, kBytes));
    const bool seen = child_pattern(v, ptx != nullptr);
    EXPECT(seen);
    std::printf("parent: sees what the child wrote through its import: %s\n", seen ? "ok" : "WRONG");
    std::fflush(stdout);
    EXPECT(say(sv[0], 'F') && hear(sv[0], 'D'));
  } else {
    std::printf("parent: the child did not write\n");
    EXPECT(false);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::printf("parent: child ended with status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  ::close(sv[0]);

  OK(cuMemFreeAsync(d, s));
  OK(cuMemFreeAsync(o, s));
  OK(cuStreamSynchronize(s));
  OK(cuMemPoolDestroy(other));
  OK(cuMemPoolDestroy(pool));
  OK(cuStreamDestroy(s));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_pool_share");
}
