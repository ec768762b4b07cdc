// The kernels a worker runs on a context it keeps for the tenant's next guest
// (keep.cc; docs/security.md, "Recycled workers"). Built into PTX and
// embedded in the worker; the driver compiles them for the GPU at hand.

// Each SM's shared memory: launched with the most dynamic shared memory a
// block may have, one block per SM at a time, twice as many blocks as SMs.
extern "C" __global__ void ivcuda_scrub_shared(unsigned words) {
  extern __shared__ unsigned s[];
  for (unsigned i = threadIdx.x; i < words; i += blockDim.x) s[i] = 0u;
}

// Every thread slot's local memory, up to the stack a context is made with
// (1 KiB a thread): launched to fill every SM's thread slots, twice over.
extern "C" __global__ void ivcuda_scrub_local(unsigned words) {
  volatile unsigned frame[256];
#pragma unroll 1
  for (unsigned i = 0; i < 256 && i < words; ++i) frame[i] = 0u;
}
