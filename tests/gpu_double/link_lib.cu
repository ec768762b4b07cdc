// The other half of link_main.cu: the function its kernel calls.
extern "C" __device__ float ivc_link_twice(float x) { return 2.0f * x; }
