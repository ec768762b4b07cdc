// CUDA IPC through the runtime API, as torch.multiprocessing uses it: the
// parent exports a cudaMalloc buffer and an interprocess event, a child
// process (this program run again with --child: a fresh CUDA) opens both,
// checks the parent's data, writes its own with a kernel and a copy, records
// the event; the parent waits on the event and checks the child's data.
// Knows nothing of ivcuda; built with static and shared cudart.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" __global__ void ivc_fill_u32(unsigned* p, unsigned value, unsigned long long n) {
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = value;
}

namespace {
int failures = 0;
#define CK(call)                                                                               \
  do {                                                                                         \
    const cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

constexpr size_t kWords = 1 << 18;
constexpr size_t kHead = 1024;
constexpr unsigned kFill = 0x600dcafeu;

struct Handles {
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t event;
};

bool xfer(int fd, void* p, size_t n, bool out) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = out ? ::write(fd, b, n) : ::read(fd, b, n);
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool child_data_ok(const std::vector<unsigned>& v) {
  for (size_t i = 0; i < kWords; ++i)
    if (v[i] != (i < kHead ? static_cast<unsigned>(i ^ 0x55u) : kFill)) return false;
  return true;
}

int child(int in, int out) {
  Handles h{};
  if (!xfer(in, &h, sizeof h, false)) return 3;
  unsigned* p = nullptr;
  CK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&p), h.mem, cudaIpcMemLazyEnablePeerAccess));
  std::vector<unsigned> v(kWords);
  CK(cudaMemcpy(v.data(), p, kWords * 4, cudaMemcpyDeviceToHost));
  bool same = true;
  for (size_t i = 0; i < kWords; ++i) same = same && v[i] == static_cast<unsigned>(i * 5 + 3);
  if (!same) ++failures;
  std::printf("child: the parent's data through cudaIpcOpenMemHandle: %s\n", same ? "ok" : "WRONG");
  cudaPointerAttributes attr{};
  CK(cudaPointerGetAttributes(&attr, p));
  if (attr.type != cudaMemoryTypeDevice) ++failures;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ivc_fill_u32<<<64, 256, 0, s>>>(p, kFill, kWords);
  CK(cudaGetLastError());
  std::vector<unsigned> head(kHead);
  for (size_t i = 0; i < kHead; ++i) head[i] = static_cast<unsigned>(i ^ 0x55u);
  CK(cudaMemcpyAsync(p, head.data(), kHead * 4, cudaMemcpyHostToDevice, s));
  cudaEvent_t ev;
  CK(cudaIpcOpenEventHandle(&ev, h.event));
  CK(cudaEventRecord(ev, s));
  CK(cudaStreamSynchronize(s));
  char c = 'W';
  if (!xfer(out, &c, 1, true) || !xfer(in, &c, 1, false)) return 3;
  CK(cudaEventDestroy(ev));
  CK(cudaStreamDestroy(s));
  CK(cudaIpcCloseMemHandle(p));
  std::printf("child: %d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--child") == 0) {
    const int rc = child(std::atoi(argv[2]), std::atoi(argv[3]));
    std::fflush(stdout);
    return rc;
  }
  unsigned* d = nullptr;
  CK(cudaMalloc(&d, kWords * 4));
  std::vector<unsigned> v(kWords);
  for (size_t i = 0; i < kWords; ++i) v[i] = static_cast<unsigned>(i * 5 + 3);
  CK(cudaMemcpy(d, v.data(), kWords * 4, cudaMemcpyHostToDevice));
  Handles h{};
  CK(cudaIpcGetMemHandle(&h.mem, d));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
  CK(cudaIpcGetEventHandle(&h.event, ev));
  int down[2], up[2];
  if (::pipe(down) != 0 || ::pipe(up) != 0) return 3;
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::string in = std::to_string(down[0]), out = std::to_string(up[1]);
    char* args[] = {argv[0], const_cast<char*>("--child"), in.data(), out.data(), nullptr};
    ::execv("/proc/self/exe", args);
    ::_exit(127);
  }
  char c = 0;
  bool talk = xfer(down[1], &h, sizeof h, true) && xfer(up[0], &c, 1, false) && c == 'W';
  if (talk) {
    CK(cudaStreamWaitEvent(nullptr, ev, 0));
    CK(cudaMemcpy(v.data(), d, kWords * 4, cudaMemcpyDeviceToHost));
    const bool seen = child_data_ok(v);
    if (!seen) ++failures;
    std::printf("parent: the child's kernel and copy, after its IPC event: %s\n", seen ? "ok" : "WRONG");
    talk = xfer(down[1], &c, 1, true);
  }
  if (!talk) ++failures;
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  CK(cudaEventDestroy(ev));
  CK(cudaFree(d));
  std::printf("rt_ipc: %s\n", failures == 0 ? "all checks passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
