// The GPU test double in its hostile mode, for the tests that attack
// ivcudad's workers (tests/gpu_double/README.md, "Ranges outside the
// books"). Header-only.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace ivcuda::testing {

// The double keeps its own table of allocations and refuses what lies outside
// it with the worker's error, so a range check the worker left out would go
// unseen. Here it takes any mapped memory of the worker for device memory, as
// a driver with HMM does, so a missing check shows as a wrong answer; and it
// writes down every device range outside its allocations that reached it, so
// that one it refused anyway shows too. Made before the test's daemon, whose
// workers inherit the environment.
struct Strays {
  std::string path;
  Strays() {
    static int made = 0;
    path = "/tmp/ivcuda-strays-" + std::to_string(::getpid()) + "-" + std::to_string(++made);
    ::unlink(path.c_str());
    ::setenv("IVCUDA_GPU_DOUBLE_HMM", "1", 1);
    ::setenv("IVCUDA_GPU_DOUBLE_STRAYS", path.c_str(), 1);
  }
  ~Strays() { ::unlink(path.c_str()); }
  Strays(const Strays&) = delete;
  Strays& operator=(const Strays&) = delete;
  // The device ranges outside the guest's books that reached the driver, one
  // line each: "" when the worker kept them all away.
  std::string seen() const {
    std::ifstream f(path);
    std::ostringstream text;
    text << f.rdbuf();
    return text.str();
  }
};

}  // namespace ivcuda::testing
