// Checks a code image a guest sent (a module, library, linker or JIT input)
// before the driver parses it. The driver takes such images without a
// length and believes what they say about themselves: a fatbin header's
// payload size, an ELF file's section and program-header extents, a fatbin
// wrapper's pointer. The worker holds a private copy of exactly the bytes
// the guest sent; this decides whether every extent the image declares lies
// within that copy, and refuses what would make the driver follow a pointer.
// docs/security.md lists the rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace ivcuda::host {

enum class ImageKind : std::uint8_t { kPtx, kElf, kFatbin };

struct ImageVerdict {
  bool ok = false;
  ImageKind kind = ImageKind::kPtx;
  std::string why;  // set when !ok: what was wrong, for the log
  // What loading it takes of device memory, as the image declares it (the
  // device-memory quota charges it, quota.h): an ELF's allocated sections,
  // code and globals with their uninitialised ones; a fatbin's largest
  // cubin (the driver loads one), a compressed one by its declared
  // uncompressed size. PTX: 0 - the JIT's output is not known beforehand.
  std::uint64_t device_bytes = 0;
};

inline constexpr std::uint32_t kFatbinMagic = 0xBA55ED50u;
inline constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1u;

// `image` is the copy the driver will get, which must end in a NUL byte that
// is not part of what the guest sent (so PTX is always terminated): the
// checked image is image[0 .. size-1).
[[nodiscard]] ImageVerdict check_image(std::span<const std::byte> image);

// An input to the JIT linker of `input_type` (CUjitInputType; host-daemon/worker/link.cc),
// terminated as for check_image: it must pass check_image and be of that kind
// (PTX; a fatbin; an ELF for a cubin or an object). Libraries (host objects
// with embedded fatbins) and NVVM IR are refused before this, in link.cc.
[[nodiscard]] ImageVerdict check_link_input(std::span<const std::byte> image, unsigned input_type);

}  // namespace ivcuda::host
