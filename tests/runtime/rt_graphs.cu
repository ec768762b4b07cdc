// Graphs built with the runtime API, as frameworks build them: kernel, memset,
// memcpy (device to page-locked host) and host nodes with dependencies,
// launched several times, kernel parameters changed on the executable graph
// and through cudaGraphExecUpdate, a clone. Knows nothing of ivcuda; the
// kernels are the project's test kernels (the GPU test double runs the same
// names on the CPU). Prints only what a native run prints too.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

extern "C" __global__ void ivc_vec_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void ivc_fill_u32(unsigned* p, unsigned value, unsigned long long n) {
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = value;
}

namespace {

int g_failures = 0;

#define CHECK_RT(call)                                                                              \
  do {                                                                                             \
    const cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      ++g_failures;                                                                                \
      std::fprintf(stderr, "FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
    }                                                                                              \
  } while (0)
#define EXPECT(cond)                                                               \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      ++g_failures;                                                                \
      std::fprintf(stderr, "FAIL %s:%d: not true: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                              \
  } while (0)

constexpr int kN = 4096;
constexpr int kBlock = 256;

unsigned bits(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

bool all_float(const float* p, float v) {
  return std::all_of(p, p + kN, [v](float x) { return x == v; });
}

struct Seen {
  int calls = 0;
  float first = 0;
  const float* watch = nullptr;
};
void CUDART_CB on_host(void* data) {
  auto* s = static_cast<Seen*>(data);
  ++s->calls;
  s->first = s->watch[0];
}

}  // namespace

int main() {
  float *a = nullptr, *b = nullptr, *c = nullptr, *pinned = nullptr;
  CHECK_RT(cudaMalloc(&a, kN * 4));
  CHECK_RT(cudaMalloc(&b, kN * 4));
  CHECK_RT(cudaMalloc(&c, kN * 4));
  CHECK_RT(cudaMallocHost(&pinned, kN * 4));
  cudaStream_t s = nullptr;
  CHECK_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (g_failures != 0) return 1;

  // A = 1 (memset), B = value (kernel), C = A + B (kernel), pinned = C (copy), then a host node.
  cudaGraph_t g = nullptr;
  CHECK_RT(cudaGraphCreate(&g, 0));
  cudaGraphNode_t set = nullptr, fill = nullptr, add = nullptr, copy = nullptr, host = nullptr;
  cudaMemsetParams ms{};
  ms.dst = a;
  ms.value = bits(1.0f);
  ms.elementSize = 4;
  ms.width = kN;
  ms.height = 1;
  CHECK_RT(cudaGraphAddMemsetNode(&set, g, nullptr, 0, &ms));
  unsigned value = bits(2.0f);
  unsigned long long n64 = kN;
  unsigned* bu = reinterpret_cast<unsigned*>(b);
  void* fill_args[] = {&bu, &value, &n64};
  cudaKernelNodeParams kf{};
  kf.func = reinterpret_cast<void*>(ivc_fill_u32);
  kf.gridDim = dim3(kN / kBlock);
  kf.blockDim = dim3(kBlock);
  kf.kernelParams = fill_args;
  CHECK_RT(cudaGraphAddKernelNode(&fill, g, nullptr, 0, &kf));
  int n = kN;
  void* add_args[] = {&a, &b, &c, &n};
  cudaKernelNodeParams ka{};
  ka.func = reinterpret_cast<void*>(ivc_vec_add);
  ka.gridDim = dim3(kN / kBlock);
  ka.blockDim = dim3(kBlock);
  ka.kernelParams = add_args;
  const cudaGraphNode_t both[] = {set, fill};
  CHECK_RT(cudaGraphAddKernelNode(&add, g, both, 2, &ka));
  CHECK_RT(cudaGraphAddMemcpyNode1D(&copy, g, &add, 1, pinned, c, kN * 4, cudaMemcpyDeviceToHost));
  Seen seen;
  seen.watch = pinned;
  cudaHostNodeParams hp{};
  hp.fn = on_host;
  hp.userData = &seen;
  CHECK_RT(cudaGraphAddHostNode(&host, g, &copy, 1, &hp));
  size_t count = 0;
  CHECK_RT(cudaGraphGetNodes(g, nullptr, &count));
  EXPECT(count == 5);
  size_t edges = 0;
  CHECK_RT(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
  EXPECT(edges == 4);
  std::printf("build: %zu nodes, %zu edges\n", count, edges);

  cudaGraphExec_t ex = nullptr;
  CHECK_RT(cudaGraphInstantiate(&ex, g, 0));
  bool ok = true;
  for (int i = 0; i < 3; ++i) {
    std::fill(pinned, pinned + kN, 0.0f);
    CHECK_RT(cudaGraphLaunch(ex, s));
    CHECK_RT(cudaStreamSynchronize(s));
    ok = ok && all_float(pinned, 3.0f) && seen.calls == i + 1 && seen.first == 3.0f;
  }
  EXPECT(ok);
  std::printf("launch x3: 1 + 2 = 3 in page-locked memory, seen by the host node: %s\n", ok ? "ok" : "WRONG");

  // The executable graph's kernel given B = 5.
  unsigned five = bits(5.0f);
  void* fill5_args[] = {&bu, &five, &n64};
  cudaKernelNodeParams kf5 = kf;
  kf5.kernelParams = fill5_args;
  CHECK_RT(cudaGraphExecKernelNodeSetParams(ex, fill, &kf5));
  CHECK_RT(cudaGraphLaunch(ex, s));
  CHECK_RT(cudaStreamSynchronize(s));
  EXPECT(all_float(pinned, 6.0f));
  std::printf("exec kernel params: 1 + 5 = 6\n");

  // A clone with B = 10, and the executable graph updated from it.
  cudaGraph_t cl = nullptr;
  CHECK_RT(cudaGraphClone(&cl, g));
  cudaGraphNode_t fill_clone = nullptr;
  CHECK_RT(cudaGraphNodeFindInClone(&fill_clone, fill, cl));
  unsigned ten = bits(10.0f);
  void* fill10_args[] = {&bu, &ten, &n64};
  cudaKernelNodeParams kf10 = kf;
  kf10.kernelParams = fill10_args;
  CHECK_RT(cudaGraphKernelNodeSetParams(fill_clone, &kf10));
  cudaGraphExecUpdateResultInfo info{};
  CHECK_RT(cudaGraphExecUpdate(ex, cl, &info));
  EXPECT(info.result == cudaGraphExecUpdateSuccess);
  CHECK_RT(cudaGraphLaunch(ex, s));
  CHECK_RT(cudaStreamSynchronize(s));
  EXPECT(all_float(pinned, 11.0f));
  std::printf("exec update from a clone: 1 + 10 = 11\n");

  CHECK_RT(cudaGraphExecDestroy(ex));
  CHECK_RT(cudaGraphDestroy(cl));
  CHECK_RT(cudaGraphDestroy(g));
  CHECK_RT(cudaStreamDestroy(s));
  CHECK_RT(cudaFreeHost(pinned));
  CHECK_RT(cudaFree(a));
  CHECK_RT(cudaFree(b));
  CHECK_RT(cudaFree(c));
  std::printf("rt_graphs: %d failed\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}
