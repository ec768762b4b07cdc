// The fuzz harnesses' reader of libFuzzer's input: typed values and byte runs
// taken from the front, in order, with no framing of its own, so that each
// harness's input format (its header comment) is the sequence of its takes.
//
// A short input: a value cut short by the end of the input keeps the bytes
// that were there (its low bytes: the formats are little-endian, as is the
// host) and is zero above them; a value taken at the end is zero, and a byte
// run is what is left of the input. The end stops nothing by itself: each
// harness checks done() where its format lets a chunk begin, so a chunk cut
// short is taken as far as it goes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

namespace ivcuda::fuzz {

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : d_(data), n_(size) {}

  bool done() const { return pos_ >= n_; }

  template <class T>
  T take() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    const std::size_t k = std::min(sizeof v, n_ - pos_);
    std::memcpy(&v, d_ + pos_, k);
    pos_ += k;
    return v;
  }

  // Up to `want` bytes, in place in the input.
  std::span<const std::uint8_t> bytes(std::size_t want) {
    const std::size_t k = std::min(want, n_ - pos_);
    std::span<const std::uint8_t> s(d_ + pos_, k);
    pos_ += k;
    return s;
  }

  // Up to `max` bytes copied to `out`; how many there were. What is left of
  // `out` is untouched: the caller's zeroes stand for the missing bytes.
  std::size_t copy(void* out, std::size_t max) {
    const auto s = bytes(max);
    if (!s.empty()) std::memcpy(out, s.data(), s.size());
    return s.size();
  }

 private:
  const std::uint8_t* d_;
  std::size_t n_;
  std::size_t pos_ = 0;
};

}  // namespace ivcuda::fuzz
