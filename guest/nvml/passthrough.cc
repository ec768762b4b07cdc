// Passthrough::run (passthrough.h): one query, the outputs copied back.
#include "guest/nvml/passthrough.h"

namespace ivcuda::nvml {

nvmlReturn_t Passthrough::run() noexcept {
  if (err_ == NVML_SUCCESS && !initialized()) err_ = NVML_ERROR_UNINITIALIZED;
  if (err_ != NVML_SUCCESS) return err_;
  alignas(16) std::byte buf[nvml_wire::kPassthroughMaxBody];
  const std::uint64_t arg0 = slots_[0] | static_cast<std::uint64_t>(slots_[1]) << 32;
  const std::uint64_t arg1 = slots_[2] | static_cast<std::uint64_t>(slots_[3]) << 32;
  nvml_wire::RepNvml rep{};
  const auto cap = static_cast<std::uint32_t>(used_);
  const nvmlReturn_t r = query(static_cast<NvmlFn>(nvml_wire::kPassthroughBase + row_), device_, arg0, arg1,
                               cap != 0 ? buf : nullptr, cap, &rep, name_);
  if (count_ != nullptr && (r == NVML_SUCCESS || r == NVML_ERROR_INSUFFICIENT_SIZE))
    *count_ = static_cast<unsigned>(rep.val[0]);
  if (r != NVML_SUCCESS) return r;
  // The worker sizes its answer as this request does; anything else is no answer of it.
  if (rep.out_len != used_) return note_answer(name_, NVML_ERROR_UNKNOWN);
  std::size_t off = 0;
  for (unsigned i = 0; i < nsections_; ++i) {
    const Section& s = sections_[i];
    const std::byte* src = buf + off;
    off += s.bytes;
    if (s.dst == nullptr || s.bytes == 0) continue;
    switch (s.kind) {
      case Kind::kValue: std::memcpy(s.dst, src, s.copy); break;
      case Kind::kList: {
        std::size_t n = s.bytes / s.elem;
        if (!fixed_list_) n = std::min<std::size_t>(n, rep.val[0]);
        std::memcpy(s.dst, src, n * s.elem);
        break;
      }
      case Kind::kText: {
        const std::size_t n = ::strnlen(reinterpret_cast<const char*>(src), s.bytes - 1);
        std::memcpy(s.dst, src, n);
        static_cast<char*>(s.dst)[n] = '\0';
        break;
      }
    }
  }
  return NVML_SUCCESS;
}

}  // namespace ivcuda::nvml
