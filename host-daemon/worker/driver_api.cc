#include "host-daemon/worker/driver_api.h"

#include <dlfcn.h>

#include <cerrno>

namespace ivcuda::host {

#define IVCUDA_STR_(x) #x
#define IVCUDA_STR(x) IVCUDA_STR_(x)

Result<DriverApi> load_driver(const std::string& path) {
  DriverApi api;
  api.path = path;
  // RTLD_LOCAL: the driver's symbols must not satisfy anything else.
  api.handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api.handle == nullptr) {
    const char* e = ::dlerror();
    return make_error(ENOENT, "cannot load the CUDA driver '" + path + "': " + (e ? e : "?"));
  }
#define IVCUDA_DRIVER_LOAD(f)                                                              \
  api.f = reinterpret_cast<decltype(api.f)>(::dlsym(api.handle, IVCUDA_STR(f)));          \
  if (api.f == nullptr)                                                                    \
    return make_error(ENOENT, "the CUDA driver '" + path + "' lacks " IVCUDA_STR(f));
  IVCUDA_DRIVER_FUNCTIONS(IVCUDA_DRIVER_LOAD)
#undef IVCUDA_DRIVER_LOAD
  return api;
}

}  // namespace ivcuda::host
