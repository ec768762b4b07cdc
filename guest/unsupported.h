// What a program asked for that ivcuda does not support, for the user to see.
// Every exported function that is not forwarded yet logs its name once on
// stderr (guest/api's stubs); with IVCUDA_LOG_UNSUPPORTED set, the library
// also lists at exit every call that answered CUDA_ERROR_NOT_SUPPORTED: the
// unforwarded functions, the options of forwarded ones that are refused, and
// the requests the host refused - each with how often it happened.
//   IVCUDA_LOG_UNSUPPORTED=1     the list goes to stderr
//   IVCUDA_LOG_UNSUPPORTED=PATH  appended to that file
// IVCUDA_LOG_ERRORS (1 or a path, the same way) lists at exit every call
// that failed, by function and error, with counts: where a framework reports
// only "invalid value", this says which call it was (guard.h counts them).
#pragma once

#include <string_view>

namespace ivcuda::guest {

// Counts one NOT_SUPPORTED answer for `what` (a function name, or a name and
// the refused option).
void note_unsupported(std::string_view what) noexcept;

}  // namespace ivcuda::guest
