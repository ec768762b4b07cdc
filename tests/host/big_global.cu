// A module whose globals take 512 MiB of device memory although its image is
// small (the array is uninitialised: a NOBITS section). The quota charges a
// module what its image declares (host-daemon/worker/image_check.h).
__device__ char ivc_big_global[512u << 20];

extern "C" __global__ void ivc_touch_big(unsigned i) { ivc_big_global[i] = 1; }
