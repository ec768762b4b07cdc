// Relocatable device code for the JIT linker's tests (tests/programs/drv_link.cc):
// this kernel calls a function that only link_lib.cu defines.
extern "C" __device__ float ivc_link_twice(float x);

extern "C" __global__ void ivc_link_apply(float* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = ivc_link_twice(data[i]) + 1.0f;
}
