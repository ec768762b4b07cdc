#include "host-daemon/worker/image_check.h"

#include <cuda.h>
#include <elf.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "host-daemon/shared/rules.h"

namespace ivcuda::host {
namespace {

// Fatbin layout (observed from nvcc 13; tests/gpu_double/README.md): a
// 16-byte header (u32 magic, u16 version, u16 header size, u64 payload size),
// then entries, each a header of at least 64 bytes (u16 kind, u16, u32 header
// size, u64 payload size, ..., u64 flags at 40, u64 uncompressed size at 56)
// and its payload. Only the fields that locate bytes are read here.
constexpr std::size_t kFatbinHeaderBytes = 16;
constexpr std::size_t kFatbinEntryHeaderBytes = 64;
constexpr std::uint16_t kFatbinKindElf = 2;
constexpr std::uint64_t kFatbinCompressedFlags = 0x2000 | 0x8000;

template <class T>
T load(std::span<const std::byte> s, std::size_t off) {
  T v;
  std::memcpy(&v, s.data() + off, sizeof v);
  return v;
}

// [off, off + len) lies within `size`, written so that nothing can wrap.
bool within(std::uint64_t off, std::uint64_t len, std::uint64_t size) { return off <= size && len <= size - off; }

ImageVerdict refuse(ImageKind kind, std::string why) {
  return ImageVerdict{!IVCUDA_RULE("image-extents"), kind, std::move(why)};
}

// A table of `count` entries of `entsize` bytes at `off`: the entry size must
// hold the structure the driver reads, and the whole table must fit.
bool table_fits(std::uint64_t off, std::uint64_t count, std::uint64_t entsize, std::size_t need,
                std::uint64_t size) {
  if (count == 0) return true;
  if (entsize < need) return false;
  if (count > size / entsize) return false;  // count * entsize would exceed size (or wrap)
  return within(off, count * entsize, size);
}

// An ELF image (a cubin): the header, the program and section header tables,
// every program segment's and every section's file extent, section links and
// the string tables' terminators.
std::optional<std::string> check_elf(std::span<const std::byte> s, std::uint64_t* alloc) {
  *alloc = 0;
  const std::uint64_t size = s.size();
  if (size < sizeof(Elf64_Ehdr)) return "an ELF image shorter than its header";
  const auto* ident = reinterpret_cast<const unsigned char*>(s.data());
  if (ident[EI_CLASS] != ELFCLASS64) return "an ELF image that is not ELF64";
  if (ident[EI_DATA] != ELFDATA2LSB) return "an ELF image that is not little-endian";
  const auto eh = load<Elf64_Ehdr>(s, 0);
  if (eh.e_ehsize < sizeof(Elf64_Ehdr) || eh.e_ehsize > size) return "an ELF header size out of range";

  if (!table_fits(eh.e_phoff, eh.e_phnum, eh.e_phentsize, sizeof(Elf64_Phdr), size))
    return "an ELF program header table outside the image";
  for (std::uint64_t i = 0; i < eh.e_phnum; ++i) {
    const auto ph = load<Elf64_Phdr>(s, eh.e_phoff + i * eh.e_phentsize);
    if (!within(ph.p_offset, ph.p_filesz, size))
      return "ELF segment " + std::to_string(i) + " outside the image";
  }

  std::uint64_t shnum = eh.e_shnum;
  std::uint64_t shstrndx = eh.e_shstrndx;
  if (eh.e_shoff == 0) {
    if (shnum != 0) return "ELF sections without a section header table";
    return std::nullopt;
  }
  if (eh.e_shentsize < sizeof(Elf64_Shdr) || !within(eh.e_shoff, eh.e_shentsize, size))
    return "an ELF section header table outside the image";
  // Extended numbering: section 0 holds the real count and string-table index.
  const auto sh0 = load<Elf64_Shdr>(s, eh.e_shoff);
  if (shnum == 0) shnum = sh0.sh_size;
  if (shstrndx == SHN_XINDEX) shstrndx = sh0.sh_link;
  if (!table_fits(eh.e_shoff, shnum, eh.e_shentsize, sizeof(Elf64_Shdr), size))
    return "an ELF section header table outside the image";
  if (shstrndx != SHN_UNDEF && shstrndx >= shnum) return "an ELF section-name table index out of range";

  auto section = [&](std::uint64_t i) { return load<Elf64_Shdr>(s, eh.e_shoff + i * eh.e_shentsize); };
  // Section 0 is the null section (its size and link fields may carry the
  // extended counts read above): any other type there would make the checks
  // below follow its unchecked link.
  if (sh0.sh_type != SHT_NULL) return "ELF section 0 is not the null section";
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const auto sh = section(i);
    if (sh.sh_type != SHT_NOBITS && !within(sh.sh_offset, sh.sh_size, size))
      return "ELF section " + std::to_string(i) + " outside the image";
    if (sh.sh_link >= shnum && i != 0) return "ELF section " + std::to_string(i) + " links to a missing section";
    if ((sh.sh_flags & SHF_ALLOC) != 0) *alloc = sh.sh_size > ~*alloc ? ~0ull : *alloc + sh.sh_size;
    const bool strtab = sh.sh_type == SHT_STRTAB || (i == shstrndx && shstrndx != SHN_UNDEF);
    if (strtab && sh.sh_size != 0 && s[sh.sh_offset + sh.sh_size - 1] != std::byte{0})
      return "ELF string table " + std::to_string(i) + " not terminated";
    if (sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM) {
      if (sh.sh_entsize < sizeof(Elf64_Sym)) return "an ELF symbol table with short entries";
      const auto strtab_sh = section(sh.sh_link);
      const std::uint64_t names = strtab_sh.sh_type == SHT_STRTAB ? strtab_sh.sh_size : 0;
      for (std::uint64_t k = 0; k < sh.sh_size / sh.sh_entsize; ++k) {
        const auto sym = load<Elf64_Sym>(s, sh.sh_offset + k * sh.sh_entsize);
        if (sym.st_name != 0 && sym.st_name >= names)
          return "ELF symbol " + std::to_string(k) + " has a name outside its string table";
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> check_fatbin(std::span<const std::byte> s, std::uint64_t* largest) {
  *largest = 0;
  if (s.size() < kFatbinHeaderBytes) return "a fatbin shorter than its header";
  const auto header_size = load<std::uint16_t>(s, 6);
  const auto payload_size = load<std::uint64_t>(s, 8);
  if (header_size < kFatbinHeaderBytes || !within(header_size, payload_size, s.size()))
    return "a fatbin whose header declares " + std::to_string(header_size) + " + " + std::to_string(payload_size) +
           " bytes, of " + std::to_string(s.size()) + " sent";
  const std::uint64_t end = header_size + payload_size;
  for (std::uint64_t off = header_size; off < end;) {
    if (end - off < kFatbinEntryHeaderBytes) return "a truncated fatbin entry header";
    const auto kind = load<std::uint16_t>(s, off);
    const auto entry_header = load<std::uint32_t>(s, off + 4);
    const auto entry_payload = load<std::uint64_t>(s, off + 8);
    const auto flags = load<std::uint64_t>(s, off + 40);
    const auto uncompressed = load<std::uint64_t>(s, off + 56);
    if (entry_header < kFatbinEntryHeaderBytes || !within(off + entry_header, entry_payload, end) ||
        entry_header > end - off)
      return "a fatbin entry that overruns the fatbin";
    const bool compressed = (flags & kFatbinCompressedFlags) != 0 || uncompressed != 0;
    if (kind == kFatbinKindElf && !compressed) {
      std::uint64_t alloc = 0;
      if (auto why = check_elf(s.subspan(off + entry_header, entry_payload), &alloc)) return "in a fatbin: " + *why;
      *largest = std::max(*largest, alloc);
    } else if (kind == kFatbinKindElf) {
      *largest = std::max(*largest, uncompressed);
    }
    off += entry_header + entry_payload;
  }
  return std::nullopt;
}

}  // namespace

ImageVerdict check_link_input(std::span<const std::byte> image, unsigned input_type) {
  ImageVerdict v = check_image(image);
  // The driver parses an input by the type the caller names: what the bytes are must agree.
  const bool agrees = (input_type == CU_JIT_INPUT_PTX && v.kind == ImageKind::kPtx) ||
                      (input_type == CU_JIT_INPUT_FATBINARY && v.kind == ImageKind::kFatbin) ||
                      ((input_type == CU_JIT_INPUT_CUBIN || input_type == CU_JIT_INPUT_OBJECT) &&
                       v.kind == ImageKind::kElf);
  if (v.ok && !agrees) return refuse(v.kind, "an input whose bytes are not of the type it is added as");
  return v;
}

ImageVerdict check_image(std::span<const std::byte> image) {
  if (image.empty() || image.back() != std::byte{0}) return refuse(ImageKind::kPtx, "no terminating NUL");
  const auto body = image.first(image.size() - 1);
  std::uint32_t magic = 0;
  if (body.size() >= sizeof magic) magic = load<std::uint32_t>(body, 0);
  if (magic == kFatbinWrapperMagic)
    return refuse(ImageKind::kFatbin, "a fatbin wrapper (it holds a pointer, which the guest unwraps itself)");
  std::uint64_t bytes = 0;
  if (magic == kFatbinMagic) {
    if (auto why = check_fatbin(body, &bytes)) return refuse(ImageKind::kFatbin, *why);
    return ImageVerdict{true, ImageKind::kFatbin, {}, bytes};
  }
  if (body.size() >= 4 && std::memcmp(body.data(), ELFMAG, SELFMAG) == 0) {
    if (auto why = check_elf(body, &bytes)) return refuse(ImageKind::kElf, *why);
    return ImageVerdict{true, ImageKind::kElf, {}, bytes};
  }
  // PTX: text, terminated by the NUL the worker appended.
  return ImageVerdict{true, ImageKind::kPtx, {}};
}

}  // namespace ivcuda::host
