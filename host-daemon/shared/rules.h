// The security rules of docs/security.md, named where they are enforced.
//
// Each rule the host keeps against a hostile guest (or a subverted worker) is
// guarded by IVCUDA_RULE("id") at the place that enforces it:
//
//   if (IVCUDA_RULE("device-range") && !owns_device(dst, n)) return CUDA_ERROR_INVALID_VALUE;
//
// In a product build the macro is the constant `true` and costs nothing. In
// the mutation build (the asan preset: IVCUDA_MUTANTS) it asks whether the
// rule was removed for this run (IVCUDA_MUTATE=id[,id...] in the daemon's
// environment, inherited by every worker), so that tests/mutations can run
// each row's test with its rule gone and require the test to fail: a rule
// whose test still passes without it is not tested. The ids are the first
// column of the rule table in docs/security.md.
#pragma once

#if defined(IVCUDA_MUTANTS)
namespace ivcuda::host::rules {
// False when IVCUDA_MUTATE names `id` (read once per process).
bool enabled(const char* id) noexcept;
// The ids IVCUDA_MUTATE removes, comma-separated ("" when none): logged once
// at the daemon's start so that no mutant run is mistaken for a real one.
const char* removed() noexcept;
}  // namespace ivcuda::host::rules
#define IVCUDA_RULE(id) (::ivcuda::host::rules::enabled(id))
#else
#define IVCUDA_RULE(id) true
#endif
