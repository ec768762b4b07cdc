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

// What the device heap hands out: one block of threads takes every block it
// can get, largest first down to 16 bytes, zeroes each, and gives them all
// back at the end (a chain through their first words).
struct ScrubBlock {
  ScrubBlock* next;
};
extern "C" __global__ void ivcuda_scrub_heap(unsigned long long largest) {
  __shared__ void* got;
  __shared__ ScrubBlock* head;
  if (threadIdx.x == 0) head = nullptr;
  for (unsigned long long size = largest; size >= 16; size /= 4) {
    for (;;) {
      __syncthreads();
      if (threadIdx.x == 0) got = malloc(size);
      __syncthreads();
      if (got == nullptr) break;
      unsigned long long* w = static_cast<unsigned long long*>(got);
      for (unsigned long long i = threadIdx.x; i < size / 8; i += blockDim.x) w[i] = 0;
      __syncthreads();
      if (threadIdx.x == 0) {
        static_cast<ScrubBlock*>(got)->next = head;
        head = static_cast<ScrubBlock*>(got);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0)
    while (head != nullptr) {
      ScrubBlock* n = head->next;
      free(head);
      head = n;
    }
}
