// Linked into hostile_guest_test, whose guests share CUDA IPC memory and
// pools between workers through the GPU test double: the double opens the
// exporter's memfd through /proc/PID/fd (which Landlock refuses across
// workers) and fills it with pwrite64 (which no driver needs). So the daemons
// it starts run with the explicit test switch IVCUDA_TEST_DOUBLE_IPC=1, which
// they log (host-daemon/sandbox.h). Set before main; every daemon inherits it.
#include <cstdlib>

namespace {
[[maybe_unused]] const bool kTestDoubleIpc = ::setenv("IVCUDA_TEST_DOUBLE_IPC", "1", 0) == 0;
}  // namespace
