#include "guest/errors.h"

namespace ivcuda::guest {

const char* error_name(CUresult e) noexcept {
  switch (static_cast<int>(e)) {
#define IVCUDA_ERROR(v, name, desc) \
  case v:                           \
    return name;
#include "cuda_errors.inc"
#undef IVCUDA_ERROR
    default:
      return nullptr;
  }
}

const char* error_string(CUresult e) noexcept {
  switch (static_cast<int>(e)) {
#define IVCUDA_ERROR(v, name, desc) \
  case v:                           \
    return desc;
#include "cuda_errors.inc"
#undef IVCUDA_ERROR
    default:
      return nullptr;
  }
}

}  // namespace ivcuda::guest
