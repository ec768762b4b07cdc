// Linked into the Catch2 tests whose daemons serve the GPU test double's
// cross-process state: hostile_guest_test and hostile_tenant_test (CUDA IPC memory and pools shared
// between workers: the double opens the exporter's memfd through
// /proc/PID/fd, which Landlock refuses across workers, and fills it with
// pwrite64, which no driver needs) and nvml_worker_test (the NVML double
// reads the GPU double's ledger file, which no Landlock rule names). So the
// daemons they start run with the explicit test switch
// IVCUDA_TEST_DOUBLE_IPC=1, which they log (host-daemon/sandbox/sandbox.h). Set
// before main; every daemon inherits it.
#include <cstdlib>

namespace {
[[maybe_unused]] const bool kTestDoubleIpc = ::setenv("IVCUDA_TEST_DOUBLE_IPC", "1", 0) == 0;
}  // namespace
