// Texture and surface objects through the runtime API, as CUDA samples use
// them: cudaMallocArray, cudaMemcpy2DToArray / FromArray, cudaCreateTextureObject
// with point sampling and clamp addressing read by tex2D<float>, and a
// cudaCreateSurfaceObject written by surf2Dwrite. It knows nothing of ivcuda;
// the kernels are the project's test kernels (the GPU test double runs the same
// names on the CPU), and every result is checked against a CPU model.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

extern "C" __global__ void ivc_tex2d_read(cudaTextureObject_t tex, float* out, int w, int h, int dx, int dy) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(tex, x + dx + 0.5f, y + dy + 0.5f);
}

extern "C" __global__ void ivc_surf2d_write(cudaSurfaceObject_t surf, int w, int h, float base) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) surf2Dwrite(base + x + 1000.0f * y, surf, x * (int)sizeof(float), y);
}

namespace {

int g_failures = 0;

#define CHECK(call)                                                                              \
  do {                                                                                           \
    const cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

float texel(int x, int y) { return static_cast<float>(x) + 100.0f * static_cast<float>(y); }

}  // namespace

int main() {
  const int W = 40, H = 24;
  std::vector<float> img(W * H);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) img[y * W + x] = texel(x, y);

  cudaChannelFormatDesc ch = cudaCreateChannelDesc<float>();
  cudaArray_t a = nullptr;
  CHECK(cudaMallocArray(&a, &ch, W, H, cudaArraySurfaceLoadStore));
  CHECK(cudaMemcpy2DToArray(a, 0, 0, img.data(), W * sizeof(float), W * sizeof(float), H, cudaMemcpyHostToDevice));

  cudaResourceDesc rd{};
  rd.resType = cudaResourceTypeArray;
  rd.res.array.array = a;
  cudaTextureDesc td{};
  td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
  td.filterMode = cudaFilterModePoint;
  td.readMode = cudaReadModeElementType;
  td.normalizedCoords = 0;
  cudaTextureObject_t tex = 0;
  CHECK(cudaCreateTextureObject(&tex, &rd, &td, nullptr));

  float* out = nullptr;
  CHECK(cudaMalloc(&out, W * H * sizeof(float)));
  const dim3 block(16, 16), grid((W + 15) / 16, (H + 15) / 16);
  const int shifts[][2] = {{-2, 3}, {5, -4}};
  std::vector<float> got(W * H);
  for (const auto& sh : shifts) {
    ivc_tex2d_read<<<grid, block>>>(tex, out, W, H, sh[0], sh[1]);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) {
        const float want = texel(std::clamp(x + sh[0], 0, W - 1), std::clamp(y + sh[1], 0, H - 1));
        if (got[y * W + x] != want) ++bad;
      }
    std::printf("rt_texture: tex2D<float> shifted (%d, %d), clamped: %d wrong\n", sh[0], sh[1], bad);
    g_failures += bad != 0;
  }
  cudaResourceDesc back{};
  CHECK(cudaGetTextureObjectResourceDesc(&back, tex));
  const bool same_array = back.resType == cudaResourceTypeArray && back.res.array.array == a;
  std::printf("rt_texture: resource of the texture is the array: %s\n", same_array ? "yes" : "no");
  g_failures += !same_array;

  cudaSurfaceObject_t surf = 0;
  CHECK(cudaCreateSurfaceObject(&surf, &rd));
  ivc_surf2d_write<<<grid, block>>>(surf, W, H, 0.5f);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy2DFromArray(got.data(), W * sizeof(float), a, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      if (got[y * W + x] != 0.5f + static_cast<float>(x) + 1000.0f * static_cast<float>(y)) ++bad;
  std::printf("rt_texture: surf2Dwrite then cudaMemcpy2DFromArray: %d wrong\n", bad);
  g_failures += bad != 0;

  CHECK(cudaDestroySurfaceObject(surf));
  CHECK(cudaDestroyTextureObject(tex));
  CHECK(cudaFree(out));
  CHECK(cudaFreeArray(a));
  std::printf("rt_texture: %s\n", g_failures == 0 ? "ok" : "FAILED");
  return g_failures == 0 ? 0 : 1;
}
