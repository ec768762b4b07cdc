// libcuda.so.1 is assembled from static archives (the forwarded core and
// the generated API surface); this file gives the shared library a source
// of its own and records what it is.
extern "C" const char ivcuda_guest_library[] = "ivcuda guest libcuda.so.1";
