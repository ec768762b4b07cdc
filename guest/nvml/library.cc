// libnvidia-ml.so.1 is assembled from the static archive (the generated
// defaults and guest/nvml/*.cc); this file gives the shared library a source
// of its own and records what it is.
extern "C" const char ivcuda_nvml_library[] = "ivcuda guest libnvidia-ml.so.1";
