// Where the guest libraries' exit reports go (IVCUDA_CALL_STATS,
// IVCUDA_TRACE_STAGES, IVCUDA_LOG_UNSUPPORTED, IVCUDA_LOG_ERRORS, in libcuda
// and in the NVML library alike): the variable's value, `1` for stderr or a
// file the report is appended to.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ivcuda::guest {

// The variable's value, or null where it is unset or empty.
inline const char* report_target(const char* var) noexcept {
  const char* w = std::getenv(var);
  return w != nullptr && *w != '\0' ? w : nullptr;
}

// The stream a report is written to (null if the file cannot be opened); a
// file is closed when the sink goes.
class ReportSink {
 public:
  explicit ReportSink(const char* where) noexcept
      : to_file_(std::strcmp(where, "1") != 0), out_(to_file_ ? std::fopen(where, "a") : stderr) {}
  ~ReportSink() {
    if (to_file_ && out_ != nullptr) std::fclose(out_);
  }
  ReportSink(const ReportSink&) = delete;
  ReportSink& operator=(const ReportSink&) = delete;
  FILE* get() const noexcept { return out_; }

 private:
  bool to_file_;
  FILE* out_;
};

}  // namespace ivcuda::guest
