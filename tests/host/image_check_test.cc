// The worker's check of module images (host-daemon/worker/image_check.h): real
// images from nvcc pass; any image whose declared extents reach past the
// bytes received, or that holds a pointer, is refused.
#include <catch2/catch.hpp>

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "host-daemon/worker/image_check.h"

using ivcuda::host::check_image;
using ivcuda::host::ImageKind;

namespace {

// A file's bytes with the NUL the worker appends to its copy.
std::vector<std::byte> image_file(const std::string& name) {
  std::ifstream f(std::string(IVCUDA_TEST_IMAGES) + "/" + name, std::ios::binary);
  REQUIRE(f);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(!c.empty());
  std::vector<std::byte> v(c.size() + 1);
  std::transform(c.begin(), c.end(), v.begin(), [](char ch) { return static_cast<std::byte>(ch); });
  return v;
}

// The image without its last `n` bytes (then NUL-terminated again).
std::vector<std::byte> shortened(std::vector<std::byte> v, std::size_t n) {
  v.resize(v.size() - 1 - n);
  v.push_back(std::byte{0});
  return v;
}

template <class T>
void poke(std::vector<std::byte>& v, std::size_t off, T value) {
  REQUIRE(off + sizeof value <= v.size());
  std::memcpy(v.data() + off, &value, sizeof value);
}

template <class T>
T peek(const std::vector<std::byte>& v, std::size_t off) {
  T value;
  std::memcpy(&value, v.data() + off, sizeof value);
  return value;
}

}  // namespace

TEST_CASE("images nvcc makes pass the check", "[host][image]") {
  const struct {
    const char* file;
    ImageKind kind;
  } cases[] = {{"k.ptx", ImageKind::kPtx},
               {"k.cubin", ImageKind::kElf},
               {"k.fatbin", ImageKind::kFatbin},
               {"k_plain.fatbin", ImageKind::kFatbin}};
  for (const auto& c : cases) {
    INFO(c.file);
    const auto v = check_image(image_file(c.file));
    CHECK(v.ok);
    CHECK(v.why.empty());
    CHECK(v.kind == c.kind);
  }
}

TEST_CASE("an image declares the device memory its code and globals take", "[host][image][quota]") {
  constexpr std::uint64_t kBig = 512ull << 20;  // big_global.cu's uninitialised array
  for (const char* file : {"big.cubin", "big_plain.fatbin"}) {
    INFO(file);
    const auto v = check_image(image_file(file));
    REQUIRE(v.ok);
    CHECK(v.device_bytes >= kBig);
    CHECK(v.device_bytes < kBig + (1u << 20));
  }
  const auto k = check_image(image_file("k.cubin"));
  REQUIRE(k.ok);
  CHECK(k.device_bytes > 0);
  CHECK(k.device_bytes < (1u << 20));
  CHECK(check_image(image_file("k_plain.fatbin")).device_bytes == k.device_bytes);
  CHECK(check_image(image_file("k.ptx")).device_bytes == 0);  // what the JIT makes is not known before
}

TEST_CASE("a fatbin whose sizes reach past the bytes received is refused", "[host][image]") {
  for (const char* file : {"k.fatbin", "k_plain.fatbin"}) {
    INFO(file);
    const auto full = image_file(file);
    CHECK_FALSE(check_image(shortened(full, 1)).ok);  // one byte of payload missing
    auto big = full;  // the header declares one byte more than there is
    poke(big, 8, peek<std::uint64_t>(big, 8) + 1);
    CHECK_FALSE(check_image(big).ok);
    auto wrap = full;  // a payload size that wraps when added to the header
    poke(wrap, 8, ~std::uint64_t{0} - 8);
    CHECK_FALSE(check_image(wrap).ok);
    auto entry = full;  // the first entry claims more than the fatbin
    const auto header = peek<std::uint16_t>(entry, 6);
    poke(entry, header + 8, peek<std::uint64_t>(entry, header + 8) + 4096);
    CHECK_FALSE(check_image(entry).ok);
    auto small_header = full;  // an entry header smaller than the fields read from it
    poke(small_header, header + 4, std::uint32_t{8});
    CHECK_FALSE(check_image(small_header).ok);
  }
}

TEST_CASE("a cubin whose tables or sections reach past the bytes received is refused", "[host][image]") {
  const auto full = image_file("k.cubin");
  const auto eh = peek<Elf64_Ehdr>(full, 0);
  REQUIRE(eh.e_shnum > 1);
  // The section header table sits at the end of nvcc's cubins: cut into it.
  CHECK_FALSE(check_image(shortened(full, 1)).ok);
  auto shoff = full;
  poke(shoff, offsetof(Elf64_Ehdr, e_shoff), eh.e_shoff + 4096);
  CHECK_FALSE(check_image(shoff).ok);
  auto shnum = full;
  poke(shnum, offsetof(Elf64_Ehdr, e_shnum), static_cast<Elf64_Half>(eh.e_shnum + 100));
  CHECK_FALSE(check_image(shnum).ok);
  auto shent = full;
  poke(shent, offsetof(Elf64_Ehdr, e_shentsize), Elf64_Half{16});
  CHECK_FALSE(check_image(shent).ok);
  // each section in turn made to run past the end of the image
  for (Elf64_Half i = 1; i < eh.e_shnum; ++i) {
    const std::size_t at = eh.e_shoff + i * eh.e_shentsize;
    if (peek<Elf64_Shdr>(full, at).sh_type == SHT_NOBITS) continue;
    auto sec = full;
    poke(sec, at + offsetof(Elf64_Shdr, sh_size), Elf64_Xword{full.size()});
    INFO("section " << i);
    CHECK_FALSE(check_image(sec).ok);
  }
  if (eh.e_phnum > 0) {
    auto seg = full;
    poke(seg, eh.e_phoff + offsetof(Elf64_Phdr, p_filesz), Elf64_Xword{full.size()});
    CHECK_FALSE(check_image(seg).ok);
  }
  auto strtab = full;  // the section-name table loses its terminator
  const auto names = peek<Elf64_Shdr>(full, eh.e_shoff + eh.e_shstrndx * eh.e_shentsize);
  poke(strtab, names.sh_offset + names.sh_size - 1, 'x');
  CHECK_FALSE(check_image(strtab).ok);
  auto null0 = full;  // section 0 posing as a symbol table whose string table lies far away
  poke(null0, eh.e_shoff + offsetof(Elf64_Shdr, sh_type), Elf64_Word{SHT_SYMTAB});
  poke(null0, eh.e_shoff + offsetof(Elf64_Shdr, sh_link), Elf64_Word{0x7fffffff});
  poke(null0, eh.e_shoff + offsetof(Elf64_Shdr, sh_entsize), Elf64_Xword{sizeof(Elf64_Sym)});
  CHECK_FALSE(check_image(null0).ok);
  auto cls = full;  // ELF32 is not a cubin
  poke(cls, EI_CLASS, static_cast<unsigned char>(ELFCLASS32));
  CHECK_FALSE(check_image(cls).ok);
}

TEST_CASE("a fatbin wrapper is refused whatever it points at", "[host][image]") {
  std::vector<std::byte> w(25);
  poke(w, 0, 0x466243B1u);
  poke(w, 4, 1u);
  poke(w, 8, reinterpret_cast<std::uintptr_t>(w.data()));
  const auto v = check_image(w);
  CHECK_FALSE(v.ok);
  CHECK(v.why.find("wrapper") != std::string::npos);
}

TEST_CASE("an image without the worker's terminating NUL is refused", "[host][image]") {
  auto ptx = image_file("k.ptx");
  CHECK(check_image(ptx).ok);
  ptx.back() = std::byte{'x'};
  CHECK_FALSE(check_image(ptx).ok);
  CHECK_FALSE(check_image({}).ok);
}
