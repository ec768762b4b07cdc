// The Catch2 runner of every test executable. With IVCUDA_FAIL_FAST=1 (the
// mutation runner's mutant runs: tests/mutations/run_mutations.py) a test case
// ends at its first failed assertion, CHECK included: a run with a security
// rule removed needs only to fail.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  if (const char* ff = std::getenv("IVCUDA_FAIL_FAST"); ff != nullptr && std::strcmp(ff, "1") == 0)
    session.configData().abortAfter = 1;
  return session.run();
}
