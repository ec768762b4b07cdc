// A small Result<T> for code that must not throw across the C ABI.
// g++ 12 in C++20 mode has no std::expected; this is the subset we use.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace ivcuda {

struct Error {
  int code = 0;       // errno value, CUresult, or another domain's code
  std::string what;   // what failed, for logs
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T v) : v_(std::move(v)) {}                    // NOLINT: implicit by design
  Result(Error e) : v_(std::move(e)) {}                // NOLINT
  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  T& operator*() & { return std::get<0>(v_); }
  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error e) : err_(std::move(e)), ok_(false) {}  // NOLINT
  bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  const Error& error() const& { return err_; }
  Error&& error() && { return std::move(err_); }

 private:
  Error err_{};
  bool ok_ = true;
};

inline Error make_error(int code, std::string what) { return Error{code, std::move(what)}; }

}  // namespace ivcuda

#define IVCUDA_CONCAT_INNER(a, b) a##b
#define IVCUDA_CONCAT(a, b) IVCUDA_CONCAT_INNER(a, b)

// TRY(expr): return the error of a failed Result<void>.
#define IVCUDA_TRY(expr)                                  \
  do {                                                    \
    auto ivcuda_try_r_ = (expr);                          \
    if (!ivcuda_try_r_.ok()) return std::move(ivcuda_try_r_).error(); \
  } while (0)

// TRY_ASSIGN(lhs, expr): lhs = value of a Result<T>, or return its error.
#define IVCUDA_TRY_ASSIGN(lhs, expr) \
  IVCUDA_TRY_ASSIGN_IMPL(IVCUDA_CONCAT(ivcuda_try_v_, __LINE__), lhs, expr)
#define IVCUDA_TRY_ASSIGN_IMPL(tmp, lhs, expr)    \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).error();   \
  lhs = std::move(tmp).value()
