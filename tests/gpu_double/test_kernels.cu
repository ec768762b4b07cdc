// Test kernels shared by the GPU test double and real-GPU runs. The double has a CPU
// implementation of each entry (cpu_kernels.cc), looked up by these exact extern "C" names;
// a change to a parameter list here must be mirrored there.

struct ivc_scale_params {
  float scale;
  int offset;
  double bias;
};

__constant__ float ivc_const_addend = 1.5f;
__device__ unsigned ivc_launch_count = 0;

extern "C" __global__ void ivc_vec_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void ivc_fill_u32(unsigned* p, unsigned value, unsigned long long n) {
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    p[i] = value;
}

// One block: the launch is expected to use a single block; the double just sums.
extern "C" __global__ void ivc_reduce_sum(const float* in, float* out, int n) {
  __shared__ float partial[1024];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += in[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (unsigned t = 0; t < blockDim.x; ++t) total += partial[t];
    out[0] = total;
  }
}

extern "C" __global__ void ivc_scale_struct(ivc_scale_params s, float* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = (float)(data[i] * s.scale + s.offset + s.bias);
}

extern "C" __global__ void ivc_add_const(float* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] += ivc_const_addend;
  if (i == 0) atomicAdd(&ivc_launch_count, 1u);
}

extern "C" __global__ void ivc_spin_ns(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// Compute-bound: `iters` rounds of four independent FMA chains per thread
// (bench/compute_share.cc measures SM shares with it). The result is stored
// so that the compiler keeps the work.
extern "C" __global__ void ivc_fma_loop(float* out, int iters) {
  float a = threadIdx.x * 1e-3f, b = blockIdx.x * 1e-3f, c = 1.0f, d = 0.5f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, 0.999f, 0.001f);
    b = fmaf(b, 0.998f, 0.002f);
    c = fmaf(c, 0.997f, 0.003f);
    d = fmaf(d, 0.996f, 0.004f);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = a + b + c + d;
}

extern "C" __global__ void ivc_fault(int* p) { *p = 42; }

// Mapped host memory shared without API calls (cuMemHostRegister): spins until the CPU
// stores a non-zero *flag, then answers *out = *flag + 1 (0xffffffff on timeout).
extern "C" __global__ void ivc_wait_flag(const volatile unsigned* flag, volatile unsigned* out,
                                         unsigned long long timeout_ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  unsigned v;
  while ((v = *flag) == 0) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= timeout_ns) {
      *out = 0xffffffffu;
      __threadfence_system();
      return;
    }
  }
  *out = v + 1;
  __threadfence_system();
}

// One increment of a counter in mapped host memory, by one thread.
// NCCL's pattern: a large by-value argument struct of which the launch
// passes (through cuLaunchKernel's `extra`) only the head it uses.
struct ivc_head_args {
  unsigned count;
  unsigned vals[1023];
};
extern "C" __global__ void ivc_head_args(unsigned* out, ivc_head_args a) {
  if (blockIdx.x == 0 && threadIdx.x < a.count && threadIdx.x < 16) out[threadIdx.x] = a.vals[threadIdx.x];
}

extern "C" __global__ void ivc_inc_u32(volatile unsigned* p) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p = *p + 1;
    __threadfence_system();
  }
}

// Device printf. The same entry as tests/runtime/rt_features.cu's, so that the double's
// CPU version of it (kernels.cc) serves both: one thread prints, so the order is defined.
extern "C" __global__ void ivc_rtf_printf(int lines, long long big, double x) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (int k = 0; k < lines; ++k)
    printf("ivc printf %d/%d: %lld %u 0x%x %.3f %c\n", k, lines, big + k, (unsigned)k * 7u, k * 255, x * k,
           'a' + k);
}

// Texture and surface objects (drv_arrays, rt_texture). Point-sampled tex2D<float> at
// unnormalised texel centres shifted by (dx, dy) texels, so that clamp or border
// addressing decides the edges; one thread per output element of a w x h grid.
extern "C" __global__ void ivc_tex2d_read(unsigned long long tex, float* out, int w, int h, int dx, int dy) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h)
    out[y * w + x] = tex2D<float>((cudaTextureObject_t)tex, x + dx + 0.5f, y + dy + 0.5f);
}

// Writes value(x, y) = base + x + 1000 * y into a w x h float surface.
extern "C" __global__ void ivc_surf2d_write(unsigned long long surf, int w, int h, float base) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) surf2Dwrite(base + x + 1000.0f * y, (cudaSurfaceObject_t)surf, x * (int)sizeof(float), y);
}

// What a kernel leaves outside allocations, and whether a later kernel finds it
// (drv_recycle --kernels: the tenant's next guest on a kept context must find
// nothing; the worker's scrub, host-daemon/worker/scrub_kernels.cu). Shared memory:
// as much as the launch gave the block; local memory: a 1 KiB frame a thread;
// the device heap: 4 KiB blocks, up to 1 MiB left, up to 8 MiB looked through.
__device__ unsigned ivc_dynamic_smem_words() {
  unsigned bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes / 4;
}
extern "C" __global__ void ivc_leave_shared(unsigned pattern) {
  extern __shared__ unsigned ivc_smem[];
  volatile unsigned* s = ivc_smem;
  for (unsigned i = threadIdx.x; i < ivc_dynamic_smem_words(); i += blockDim.x) s[i] = pattern;
}
extern "C" __global__ void ivc_find_shared(unsigned pattern, unsigned* found) {
  extern __shared__ unsigned ivc_smem[];
  volatile unsigned* s = ivc_smem;
  unsigned n = 0;
  for (unsigned i = threadIdx.x; i < ivc_dynamic_smem_words(); i += blockDim.x) n += s[i] == pattern ? 1u : 0u;
  if (n != 0) atomicAdd(found, n);
}
extern "C" __global__ void ivc_leave_local(unsigned pattern) {
  volatile unsigned frame[256];
#pragma unroll 1
  for (unsigned i = 0; i < 256; ++i) frame[i] = pattern;
}
extern "C" __global__ void ivc_find_local(unsigned pattern, unsigned* found) {
  volatile unsigned frame[256];
  unsigned n = 0;
#pragma unroll 1
  for (unsigned i = 0; i < 256; ++i) n += frame[i] == pattern ? 1u : 0u;
  if (n != 0) atomicAdd(found, n);
}
extern "C" __global__ void ivc_leave_heap(unsigned pattern) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  // Chained through their first words (an array of pointers would take more stack than a
  // context starts with, and a grown stack makes the worker reset the context).
  unsigned* first = nullptr;
  for (unsigned k = 0; k < 256; ++k) {
    unsigned* b = static_cast<unsigned*>(malloc(4096));
    if (b == nullptr) break;
    for (unsigned i = 2; i < 1024; ++i) b[i] = pattern;
    *reinterpret_cast<unsigned**>(b) = first;
    first = b;
  }
  while (first != nullptr) {
    unsigned* next = *reinterpret_cast<unsigned**>(first);
    free(first);
    first = next;
  }
}
extern "C" __global__ void ivc_find_heap(unsigned pattern, unsigned* found) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  unsigned* first = nullptr;  // the blocks taken, chained through their first words
  unsigned n = 0;
  for (unsigned k = 0; k < 2048; ++k) {
    unsigned* b = static_cast<unsigned*>(malloc(4096));
    if (b == nullptr) break;
    for (unsigned i = 1; i < 1024; ++i) n += b[i] == pattern ? 1u : 0u;
    *reinterpret_cast<unsigned**>(b) = first;
    first = b;
  }
  while (first != nullptr) {
    unsigned* next = *reinterpret_cast<unsigned**>(first);
    free(first);
    first = next;
  }
  *found += n;
}
