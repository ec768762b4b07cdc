// CUDA IPC between two processes: the parent allocates, fills and exports
// device memory and an interprocess event; a child (this program run again
// with --child, so that it starts with a fresh CUDA) opens both, reads the
// parent's data, writes its own through the opened pointer (copies, a memset
// and, with --ptx, a kernel), records the event; the parent waits on the
// event and checks what the child wrote. Then the parent frees its memory
// while the child still has it open: the child still reads it. Answers the
// driver gives to odd requests (opening in the exporting process, closing a
// pointer that was never opened, exporting an event without the interprocess
// flag) are printed, so that a native run and an ivcuda run can be compared.
//   drv_ipc [--ptx test_kernels.ptx] [--forged CUDA_ERROR_NAME]
// --forged: also open forged handles (random bytes, a real handle with one
// byte flipped) and expect that exact answer. A real driver's answer to a
// forged handle is its own business (a flipped byte may even go unnoticed),
// so the native comparison runs without it.
//   drv_ipc --child-env VAR=VALUE --foreign CUDA_ERROR_NAME
// The child runs with VAR=VALUE in its environment (e.g. served by another
// tenant), only tries to open the handles and expects that answer for both.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

#include "check.h"

namespace {

constexpr size_t kBytes = 1 << 20;
constexpr size_t kWords = kBytes / 4;
constexpr size_t kHead = 4096 / 4;  // words the child writes with a copy

struct Handles {
  CUipcMemHandle mem;
  CUipcEventHandle event;
};

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool say(int fd, char c) { return write_all(fd, &c, 1); }
bool hear(int fd, char want) {
  char c = 0;
  return read_all(fd, &c, 1) && c == want;
}

unsigned pattern_a(size_t i) { return static_cast<unsigned>(i * 3 + 1); }
unsigned pattern_b(size_t i) { return static_cast<unsigned>(i * 7 + 2); }
constexpr unsigned kFill = 0x5a5a5a5au;
constexpr unsigned kKernelFill = 0x0badf00du;

CUcontext primary() {
  CUdevice dev;
  CUcontext ctx = nullptr;
  OK(cuDeviceGet(&dev, 0));
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  return ctx;
}

bool check_child_pattern(const std::vector<unsigned>& v, bool kernel) {
  for (size_t i = 0; i < kWords; ++i) {
    const unsigned want = i < kHead ? pattern_b(i) : (kernel && i >= kWords / 2) ? kKernelFill : kFill;
    if (v[i] != want) return false;
  }
  return true;
}

int child(int in, int out, const char* ptx, const char* forged, const char* foreign) {
  Handles h{};
  if (!read_all(in, &h, sizeof h)) return 3;
  OK(cuInit(0));
  primary();
  CUdeviceptr p = 0, p2 = 0;
  if (foreign != nullptr) {
    CUevent e = nullptr;
    const CUresult r1 = cuIpcOpenMemHandle(&p, h.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    const CUresult r2 = cuIpcOpenEventHandle(&e, h.event);
    std::printf("child: open of another's handles: memory %s, event %s\n", check::name(r1), check::name(r2));
    EXPECT(std::strcmp(check::name(r1), foreign) == 0 && std::strcmp(check::name(r2), foreign) == 0);
    if (!say(out, 'W') || !hear(in, 'F') || !say(out, 'D')) return 3;
    return check::finish("drv_ipc child");
  }
  OK(cuIpcOpenMemHandle(&p, h.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  OK(cuIpcOpenMemHandle(&p2, h.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  EXPECT(p != 0 && p2 == p);  // opened again: the same pointer, counted
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
  std::printf("child: read the parent's data through the opened handle: %s\n", same ? "ok" : "WRONG");

  if (forged != nullptr) {
    CUipcMemHandle bad{};
    const auto noise = check::random_bytes(sizeof bad.reserved, 99);
    std::memcpy(bad.reserved, noise.data(), sizeof bad.reserved);
    CUdeviceptr q = 0;
    const CUresult r1 = cuIpcOpenMemHandle(&q, bad, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    bad = h.mem;
    bad.reserved[9] = static_cast<char>(bad.reserved[9] ^ 0x40);
    const CUresult r2 = cuIpcOpenMemHandle(&q, bad, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    CUipcEventHandle bad_event = h.event;
    bad_event.reserved[12] = static_cast<char>(bad_event.reserved[12] ^ 0x01);
    CUevent qe = nullptr;
    const CUresult r3 = cuIpcOpenEventHandle(&qe, bad_event);
    std::printf("child: forged handles: random %s, flipped byte %s, flipped event byte %s\n", check::name(r1),
                check::name(r2), check::name(r3));
    EXPECT(std::strcmp(check::name(r1), forged) == 0 && std::strcmp(check::name(r2), forged) == 0 &&
           std::strcmp(check::name(r3), forged) == 0);
  }

  // Write through the opened pointer: a memset, a copy, and a kernel.
  OK(cuMemsetD32(p, kFill, kWords));
  std::vector<unsigned> head(kHead);
  for (size_t i = 0; i < kHead; ++i) head[i] = pattern_b(i);
  OK(cuMemcpyHtoD(p, head.data(), kHead * 4));
  if (ptx != nullptr) {
    const std::string image = check::read_file(ptx);
    CUmodule mod;
    CUfunction fill;
    OK(cuModuleLoadData(&mod, image.c_str()));
    OK(cuModuleGetFunction(&fill, mod, "ivc_fill_u32"));
    CUdeviceptr dst = p + kBytes / 2;
    unsigned value = kKernelFill;
    unsigned long long n = kWords / 2;
    void* args[] = {&dst, &value, &n};
    OK(cuLaunchKernel(fill, 64, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  }
  CUevent ev = nullptr;
  OK(cuIpcOpenEventHandle(&ev, h.event));
  OK(cuEventRecord(ev, nullptr));
  OK(cuEventSynchronize(ev));
  OK(cuEventQuery(ev));
  if (!say(out, 'W')) return 3;

  // The parent frees its allocation now; what we opened stays.
  if (!hear(in, 'F')) return 3;
  OK(cuMemcpyDtoH(v.data(), p, kBytes));
  const bool kept = check_child_pattern(v, ptx != nullptr);
  EXPECT(kept);
  std::printf("child: memory still readable after the exporter freed it: %s\n", kept ? "ok" : "WRONG");
  OK(cuEventDestroy(ev));
  OK(cuIpcCloseMemHandle(p));
  OK(cuIpcCloseMemHandle(p));  // one close per open
  std::printf("child: close after the last close: %s\n", check::name(cuIpcCloseMemHandle(p)));
  if (!say(out, 'D')) return 3;
  return check::finish("drv_ipc child");
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  const char* forged = check::arg(argc, argv, "--forged");
  const char* foreign = check::arg(argc, argv, "--foreign");
  const char* child_env = check::arg(argc, argv, "--child-env");
  if (argc >= 4 && std::strcmp(argv[1], "--child") == 0) {
    const int rc = child(std::atoi(argv[2]), std::atoi(argv[3]), ptx, forged, foreign);
    std::fflush(stdout);
    return rc;
  }
  OK(cuInit(0));
  primary();
  CUdeviceptr d = 0, other = 0;
  OK(cuMemAlloc(&d, kBytes));
  OK(cuMemAlloc(&other, 4096));
  std::vector<unsigned> v(kWords);
  for (size_t i = 0; i < kWords; ++i) v[i] = pattern_a(i);
  OK(cuMemcpyHtoD(d, v.data(), kBytes));

  Handles h{};
  CUipcMemHandle again{};
  OK(cuIpcGetMemHandle(&h.mem, d));
  OK(cuIpcGetMemHandle(&again, d));
  EXPECT(std::memcmp(&h.mem, &again, sizeof again) == 0);  // exporting twice: one handle
  CUevent ev = nullptr, plain = nullptr;
  OK(cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
  OK(cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING));
  OK(cuIpcGetEventHandle(&h.event, ev));

  // What the driver says to requests it refuses (printed: the comparison with
  // a native run decides).
  CUipcEventHandle eh{};
  CUipcMemHandle mh{};
  CUdeviceptr self = 0;
  CUevent self_ev = nullptr;
  std::printf("parent: event without CU_EVENT_INTERPROCESS: %s\n", check::name(cuIpcGetEventHandle(&eh, plain)));
  std::printf("parent: export of a null pointer: %s\n", check::name(cuIpcGetMemHandle(&mh, 0)));
  std::printf("parent: open in the exporting process: %s\n",
              check::name(cuIpcOpenMemHandle(&self, h.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)));
  std::printf("parent: event open in the exporting process: %s\n",
              check::name(cuIpcOpenEventHandle(&self_ev, h.event)));
  std::printf("parent: close of a pointer never opened: %s\n", check::name(cuIpcCloseMemHandle(other)));
  unsigned capable = 0;
  OK(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, d));
  std::printf("parent: cuMemAlloc memory is legacy-IPC capable: %u\n", capable);

  int down[2], up[2];
  if (::pipe(down) != 0 || ::pipe(up) != 0) return 3;
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(down[1]);
    ::close(up[0]);
    std::string in = std::to_string(down[0]), out = std::to_string(up[1]);
    std::vector<char*> args{argv[0], const_cast<char*>("--child"), in.data(), out.data()};
    std::string ptx_s = ptx ? ptx : "", forged_s = forged ? forged : "", foreign_s = foreign ? foreign : "";
    if (child_env != nullptr) ::putenv(const_cast<char*>(child_env));
    if (foreign != nullptr) {
      args.push_back(const_cast<char*>("--foreign"));
      args.push_back(foreign_s.data());
    }
    if (ptx != nullptr) {
      args.push_back(const_cast<char*>("--ptx"));
      args.push_back(ptx_s.data());
    }
    if (forged != nullptr) {
      args.push_back(const_cast<char*>("--forged"));
      args.push_back(forged_s.data());
    }
    args.push_back(nullptr);
    ::execv("/proc/self/exe", args.data());
    ::_exit(127);
  }
  ::close(down[0]);
  ::close(up[1]);
  bool talk = write_all(down[1], &h, sizeof h) && hear(up[0], 'W');
  EXPECT(talk);
  if (talk && foreign != nullptr) {
    talk = say(down[1], 'F') && hear(up[0], 'D');
    EXPECT(talk);
    OK(cuMemFree(d));
  } else if (talk) {
    OK(cuStreamWaitEvent(nullptr, ev, 0));
    OK(cuEventSynchronize(ev));
    OK(cuMemcpyDtoH(v.data(), d, kBytes));
    const bool seen = check_child_pattern(v, ptx != nullptr);
    EXPECT(seen);
    std::printf("parent: sees what the child wrote after waiting on the IPC event: %s\n", seen ? "ok" : "WRONG");
    OK(cuMemFree(d));
    talk = say(down[1], 'F') && hear(up[0], 'D');
    EXPECT(talk);
  }
  ::close(down[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::printf("parent: child ended with status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  OK(cuEventDestroy(ev));
  OK(cuEventDestroy(plain));
  OK(cuMemFree(other));
  return check::finish("drv_ipc");
}
