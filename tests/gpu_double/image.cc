#include "image.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <optional>
#include <string>

namespace ivcuda::gpu_double {
namespace {

bool is_punct(char c) { return std::strchr("(){}[],;=<>", c) != nullptr && c != '\0'; }

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// PTX needs no real lexer for what we extract: directives, names and numbers are runs of
// non-space, non-punctuation characters.
std::vector<std::string_view> tokenize(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  const std::size_t n = s.size();
  auto comment_at = [&](std::size_t k) {
    return s[k] == '/' && k + 1 < n && (s[k + 1] == '/' || s[k + 1] == '*');
  };
  while (i < n) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
    } else if (comment_at(i)) {
      const std::size_t end = s[i + 1] == '/' ? s.find('\n', i) : s.find("*/", i + 2);
      i = end == std::string_view::npos ? n : end + (s[i + 1] == '/' ? 1 : 2);
    } else if (c == '"') {
      const std::size_t end = s.find('"', i + 1);
      const std::size_t stop = end == std::string_view::npos ? n : end + 1;
      out.push_back(s.substr(i, stop - i));
      i = stop;
    } else if (is_punct(c)) {
      out.push_back(s.substr(i, 1));
      ++i;
    } else {
      std::size_t j = i;
      while (j < n && !is_space(s[j]) && !is_punct(s[j]) && s[j] != '"' && !comment_at(j)) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    }
  }
  return out;
}

std::size_t scalar_size(std::string_view type) {
  static constexpr struct {
    std::string_view name;
    std::size_t size;
  } kTypes[] = {
      {".u8", 1},    {".s8", 1},     {".b8", 1},  {".u16", 2}, {".s16", 2}, {".b16", 2},
      {".f16", 2},   {".bf16", 2},   {".u32", 4}, {".s32", 4}, {".b32", 4}, {".f32", 4},
      {".f16x2", 4}, {".bf16x2", 4}, {".u64", 8}, {".s64", 8}, {".b64", 8}, {".f64", 8},
  };
  for (const auto& t : kTypes)
    if (t.name == type) return t.size;
  return 0;
}

std::optional<std::uint64_t> parse_uint(std::string_view s) {
  while (!s.empty() && (s.back() == 'U' || s.back() == 'u')) s.remove_suffix(1);
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s.remove_prefix(2);
  }
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc{} || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<std::uint64_t> parse_hex_bits(std::string_view digits, std::size_t n) {
  if (digits.size() != n) return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v, 16);
  if (ec != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
  return v;
}

// The bit pattern of one initialiser element of `type`, or nullopt where it is not a plain
// number (addresses of other symbols, generic(), ...): those initialisers are not emulated.
std::optional<std::uint64_t> literal_bits(std::string_view lit, std::string_view type) {
  if (lit.size() > 2 && lit[0] == '0' && (lit[1] == 'f' || lit[1] == 'F'))
    return parse_hex_bits(lit.substr(2), 8);
  if (lit.size() > 2 && lit[0] == '0' && (lit[1] == 'd' || lit[1] == 'D'))
    return parse_hex_bits(lit.substr(2), 16);
  const bool is_float = type == ".f32" || type == ".f64";
  if (is_float || lit.find('.') != std::string_view::npos) {
    const std::string copy(lit);
    char* end = nullptr;
    const double d = std::strtod(copy.c_str(), &end);
    if (end != copy.c_str() + copy.size()) return std::nullopt;
    if (type == ".f64") return std::bit_cast<std::uint64_t>(d);
    return std::bit_cast<std::uint32_t>(static_cast<float>(d));
  }
  const bool negative = !lit.empty() && lit[0] == '-';
  auto v = parse_uint(negative ? lit.substr(1) : lit);
  if (!v) return std::nullopt;
  return negative ? ~*v + 1 : *v;  // two's complement, truncated to the element size later
}

bool is_pow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

struct Decl {
  std::string_view name;
  std::string_view type;
  std::size_t elem = 0;
  std::size_t count = 1;
  std::size_t align = 0;
  std::vector<std::string_view> init;  // literals in order; empty = no initialiser
  bool init_simple = true;
};

class Parser {
 public:
  Parser(std::string_view text, PtxImage& img, std::string& why)
      : t_(tokenize(text)), img_(img), why_(why) {}

  CUresult run() {
    int depth = 0;
    int paren = 0;
    // The entry whose body is being skipped. A sentinel rather than std::optional, which
    // g++ 12 -O2 flags as maybe-uninitialized.
    constexpr std::size_t kNoEntry = SIZE_MAX;
    std::size_t entry = kNoEntry;
    std::string_view prev;
    bool saw_version = false;
    while (i_ < t_.size()) {
      const std::string_view tok = t_[i_++];
      if (tok == "{") {
        ++depth;
      } else if (tok == "}") {
        if (depth == 0) return fail("unbalanced '}'");
        if (--depth == 0) entry = kNoEntry;
      } else if (depth > 0) {
        // Static shared memory counts toward the launch's shared-memory limit.
        // Device-side malloc: "call.uni (retval0), malloc, (param0);" in the entry's body.
        if (entry != kNoEntry && tok.starts_with("malloc") && (tok.size() == 6 || tok[6] == ','))
          img_.entries[entry].calls_malloc = true;
        if (tok == ".shared" && entry != kNoEntry && prev != ".extern") {
          Decl d;
          if (!parse_decl(d)) return CUDA_ERROR_INVALID_PTX;
          auto& e = img_.entries[entry];
          e.static_shared = align_up(e.static_shared, d.align) + d.elem * d.count;
        }
      } else if (tok == "(") {
        ++paren;
      } else if (tok == ")") {
        --paren;
      } else if (paren > 0) {
        // .func parameter lists: nothing we need.
      } else if (tok == ".version") {
        if (!parse_version(next())) return fail("bad .version");
        saw_version = true;
      } else if (tok == ".target") {
        const std::string_view target = next();
        if (target.starts_with("sm_")) {
          int sm = 0;
          std::from_chars(target.data() + 3, target.data() + target.size(), sm);
          img_.target_sm = sm;
        }
      } else if (tok == ".entry") {
        if (!parse_entry()) return CUDA_ERROR_INVALID_PTX;
        entry = img_.entries.size() - 1;
      } else if (tok == ".func") {
        entry = kNoEntry;
      } else if (tok == ".global" || tok == ".const") {
        // .extern ones too: the real driver gives them storage when nothing defines them.
        if (!parse_global(tok == ".const")) return CUDA_ERROR_INVALID_PTX;
      }
      prev = tok;
    }
    if (!saw_version) return fail("no .version directive");
    if (depth != 0) return fail("unterminated '{'");
    return CUDA_SUCCESS;
  }

 private:
  std::string_view next() { return i_ < t_.size() ? t_[i_++] : std::string_view{}; }
  std::string_view peek() const { return i_ < t_.size() ? t_[i_] : std::string_view{}; }

  CUresult fail(std::string msg) {
    why_ = std::move(msg);
    return CUDA_ERROR_INVALID_PTX;
  }

  bool parse_version(std::string_view v) {
    const auto dot = v.find('.');
    if (dot == std::string_view::npos) return false;
    const auto major = parse_uint(v.substr(0, dot));
    const auto minor = parse_uint(v.substr(dot + 1));
    if (!major || !minor || *major > 99 || *minor > 9) return false;
    img_.ptx_version = static_cast<int>(*major * 10 + *minor);
    return true;
  }

  bool parse_entry() {
    PtxEntry e;
    e.name = std::string(next());
    if (e.name.empty() || is_punct(e.name[0])) {
      fail("missing .entry name");
      return false;
    }
    if (peek() == "(") {
      ++i_;
      while (peek() != ")") {
        if (i_ >= t_.size()) {
          fail("unterminated parameter list of " + e.name);
          return false;
        }
        std::vector<std::string_view> toks;
        while (i_ < t_.size() && peek() != "," && peek() != ")") toks.push_back(next());
        if (!add_param(e, toks)) return false;
        if (peek() == ",") ++i_;
      }
      ++i_;
    }
    img_.entries.push_back(std::move(e));
    return true;
  }

  bool add_param(PtxEntry& e, const std::vector<std::string_view>& toks) {
    if (toks.empty() || toks[0] != ".param") {
      fail("parameter of " + e.name + " is not a .param");
      return false;
    }
    std::size_t align = 0, elem = 0, count = 1;
    for (std::size_t k = 1; k < toks.size(); ++k) {
      const auto tok = toks[k];
      if (tok == ".align" && k + 1 < toks.size()) {
        const auto a = parse_uint(toks[++k]);
        // An .align after the type belongs to a .ptr attribute (the pointee), not the slot.
        if (elem == 0) {
          if (!a || !is_pow2(*a) || *a > 4096) {
            fail("bad .align in a parameter of " + e.name);
            return false;
          }
          align = *a;
        }
      } else if (const std::size_t s = scalar_size(tok); s != 0 && elem == 0) {
        elem = s;
      } else if (tok == "[" && k + 2 < toks.size() && toks[k + 2] == "]") {
        const auto n = parse_uint(toks[k + 1]);
        if (!n || *n == 0 || *n > kMaxParamBytes || count > kMaxParamBytes / *n) {
          fail("bad array size in a parameter of " + e.name);
          return false;
        }
        count *= *n;
        k += 2;
      }
    }
    if (elem == 0) {
      fail("parameter of " + e.name + " has no type we know");
      return false;
    }
    if (align == 0) align = elem;
    if (count > kMaxParamBytes / elem) {
      fail("parameters of " + e.name + " exceed " + std::to_string(kMaxParamBytes) + " bytes");
      return false;
    }
    PtxParam p;
    p.align = align;
    p.size = elem * count;
    p.offset = align_up(e.param_bytes, align);
    if (p.offset > kMaxParamBytes || p.size > kMaxParamBytes - p.offset) {
      fail("parameters of " + e.name + " exceed " + std::to_string(kMaxParamBytes) + " bytes");
      return false;
    }
    e.param_bytes = p.offset + p.size;
    e.params.push_back(p);
    return true;
  }

  // [.align N] [.v2|.v4] .type name [N]... [= init] ;   (the state space is already consumed)
  bool parse_decl(Decl& d) {
    std::size_t vec = 1;
    while (i_ < t_.size()) {
      const auto tok = next();
      if (tok == ";") break;
      if (tok == ".align") {
        const auto a = parse_uint(next());
        if (!a || !is_pow2(*a) || *a > 4096) {
          fail("bad .align in a declaration");
          return false;
        }
        d.align = *a;
      } else if (tok == ".v2" || tok == ".v4") {
        vec = tok == ".v2" ? 2 : 4;
      } else if (const std::size_t s = scalar_size(tok); s != 0 && d.elem == 0) {
        d.type = tok;
        d.elem = s * vec;
      } else if (tok == "[") {
        const auto n = peek() == "]" ? std::optional<std::uint64_t>{0} : parse_uint(next());
        if (next() != "]" || !n || (*n != 0 && d.count > (std::size_t{1} << 40) / *n)) {
          fail("bad array bound in a declaration");
          return false;
        }
        d.count *= *n;  // an unsized [] takes its size from the initialiser
      } else if (tok == "=") {
        parse_init(d);
      } else if (d.name.empty() && !tok.starts_with(".")) {
        d.name = tok;
      }
    }
    if (d.align == 0) d.align = d.elem != 0 ? d.elem : 1;
    if (d.count == 0 && !d.init.empty()) d.count = (d.init.size() + vec - 1) / vec;
    return true;
  }

  void parse_init(Decl& d) {
    int braces = 0;
    while (i_ < t_.size() && !(braces == 0 && peek() == ";")) {
      const auto tok = next();
      if (tok == "{") {
        ++braces;
      } else if (tok == "}") {
        --braces;
      } else if (tok != ",") {
        d.init.push_back(tok);
      }
    }
  }

  bool parse_global(bool constant) {
    Decl d;
    if (!parse_decl(d)) return false;
    if (d.elem == 0 || d.name.empty()) return true;  // .texref and friends: not emulated
    PtxGlobal g;
    g.name = std::string(d.name);
    g.constant = constant;
    g.align = d.align;
    if (d.count > (std::size_t{1} << 40) / d.elem) {
      fail("global " + g.name + " is too large");
      return false;
    }
    g.size = d.elem * d.count;
    const std::size_t scalar = scalar_size(d.type);
    if (!d.init.empty() && d.init.size() * scalar <= g.size) {
      std::vector<std::uint8_t> bytes(g.size, 0);
      bool simple = true;
      for (std::size_t k = 0; k < d.init.size() && simple; ++k) {
        const auto bits = literal_bits(d.init[k], d.type);
        if (!bits) {
          simple = false;
          break;
        }
        // Little-endian, like the GPU and every host this double runs on.
        for (std::size_t b = 0; b < scalar; ++b)
          bytes[k * scalar + b] = static_cast<std::uint8_t>(*bits >> (8 * b));
      }
      if (simple) g.init = std::move(bytes);
    }
    img_.globals.push_back(std::move(g));
    return true;
  }

  std::vector<std::string_view> t_;
  std::size_t i_ = 0;
  PtxImage& img_;
  std::string& why_;
};

constexpr std::uint32_t kFatbinMagic = 0xBA55ED50u;
constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1u;
constexpr std::uint16_t kFatbinKindPtx = 1;
constexpr std::uint16_t kFatbinKindElf = 2;
// Entry flags that mark a compressed payload (two compression schemes seen from nvcc 13).
constexpr std::uint64_t kFatbinCompressedFlags = 0x2000 | 0x8000;
// Fatbins are at most a few hundred MiB; a bigger size field is corrupt.
constexpr std::uint64_t kMaxFatbinBytes = std::uint64_t{1} << 32;

struct FatbinHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t header_size;
  std::uint64_t payload_size;
};
static_assert(sizeof(FatbinHeader) == 16);

struct FatbinEntryHeader {
  std::uint16_t kind;
  std::uint16_t unknown0;
  std::uint32_t header_size;
  std::uint64_t payload_size;
  std::uint32_t compressed_size;
  std::uint32_t unknown1;
  std::uint16_t minor;
  std::uint16_t major;
  std::uint32_t arch;
  std::uint32_t name_offset;
  std::uint32_t name_size;
  std::uint64_t flags;
  std::uint64_t reserved;
  std::uint64_t uncompressed_size;
};
static_assert(sizeof(FatbinEntryHeader) == 0x40);

constexpr int kDeviceSm = 90;
constexpr std::uint64_t kZstdFlag = 0x8000;
constexpr std::uint64_t kLz4Flag = 0x2000;
// Uncompressed entries of the toolkit's libraries stay below a few MiB; a larger claim is corrupt.
constexpr std::uint64_t kMaxEntryBytes = std::uint64_t{1} << 30;

// The decompressors come from the system's libzstd/liblz4 at run time, so that the double
// has no build dependency for a path that only foreign images take.
struct Decompressors {
  using ZstdFn = std::size_t (*)(void*, std::size_t, const void*, std::size_t);
  using ZstdIsError = unsigned (*)(std::size_t);
  using Lz4Fn = int (*)(const char*, char*, int, int);
  ZstdFn zstd = nullptr;
  ZstdIsError zstd_is_error = nullptr;
  Lz4Fn lz4 = nullptr;

  Decompressors() {
    if (void* z = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL)) {
      zstd = reinterpret_cast<ZstdFn>(dlsym(z, "ZSTD_decompress"));
      zstd_is_error = reinterpret_cast<ZstdIsError>(dlsym(z, "ZSTD_isError"));
    }
    if (void* l = dlopen("liblz4.so.1", RTLD_NOW | RTLD_LOCAL))
      lz4 = reinterpret_cast<Lz4Fn>(dlsym(l, "LZ4_decompress_safe"));
  }
};

const Decompressors& decompressors() {
  static const Decompressors d;
  return d;
}

// The payload of a fatbin entry, decompressed when its flags say so.
std::optional<std::vector<unsigned char>> entry_payload(const FatbinEntryHeader& e,
                                                        const unsigned char* payload,
                                                        std::string& why) {
  const bool zstd = (e.flags & kZstdFlag) != 0, lz4 = (e.flags & kLz4Flag) != 0;
  if (!zstd && !lz4) return std::vector<unsigned char>(payload, payload + e.payload_size);
  if (e.compressed_size > e.payload_size || e.uncompressed_size == 0 ||
      e.uncompressed_size > kMaxEntryBytes) {
    why = "corrupt sizes in a compressed fatbin entry";
    return std::nullopt;
  }
  std::vector<unsigned char> out(static_cast<std::size_t>(e.uncompressed_size));
  const Decompressors& d = decompressors();
  if (zstd) {
    if (d.zstd == nullptr || d.zstd_is_error == nullptr) {
      why = "a zstd-compressed fatbin entry, and libzstd.so.1 is not loadable";
      return std::nullopt;
    }
    const std::size_t n = d.zstd(out.data(), out.size(), payload, e.compressed_size);
    if (d.zstd_is_error(n) != 0 || n != out.size()) {
      why = "a zstd-compressed fatbin entry does not decompress to its stated size";
      return std::nullopt;
    }
    return out;
  }
  if (d.lz4 == nullptr) {
    why = "an LZ4-compressed fatbin entry, and liblz4.so.1 is not loadable";
    return std::nullopt;
  }
  if (e.compressed_size > INT32_MAX || out.size() > INT32_MAX) {
    why = "an LZ4-compressed fatbin entry too large for LZ4";
    return std::nullopt;
  }
  const int n = d.lz4(reinterpret_cast<const char*>(payload), reinterpret_cast<char*>(out.data()),
                      static_cast<int>(e.compressed_size), static_cast<int>(out.size()));
  if (n < 0 || static_cast<std::size_t>(n) != out.size()) {
    why = "an LZ4-compressed fatbin entry does not decompress to its stated size";
    return std::nullopt;
  }
  return out;
}

// ---- cubins (ELF): what their symbol table and .nv.info sections declare -------------------

constexpr std::uint32_t kShtSymtab = 2;
constexpr std::uint32_t kShtNobits = 8;
constexpr unsigned char kSttObject = 1;
constexpr unsigned char kSttFunc = 2;
constexpr unsigned char kStoCudaEntry = 0x10;
constexpr unsigned char kEiFmtSval = 4;  // .nv.info record with a u16 size and a payload
constexpr unsigned char kEiAttrParamCbank = 0x0a;
constexpr unsigned char kEiAttrKparamInfo = 0x17;

struct ElfSection {
  std::uint32_t name = 0;
  std::uint32_t type = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint32_t link = 0;
  std::uint64_t entsize = 0;
  std::string_view sname;
};

template <class T>
T read_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

class CubinParser {
 public:
  CubinParser(const unsigned char* p, std::size_t len, std::string& why) : p_(p), len_(len), why_(why) {}

  CUresult run(PtxImage& img) {
    if (!read_sections()) return CUDA_ERROR_INVALID_IMAGE;
    const ElfSection* symtab = nullptr;
    for (const auto& s : secs_)
      if (s.type == kShtSymtab) symtab = &s;
    if (symtab == nullptr || symtab->entsize != 24 || symtab->link >= secs_.size())
      return fail("cubin without a usable symbol table");
    const ElfSection& strtab = secs_[symtab->link];
    img.target_sm = kDeviceSm;  // SASS for the emulated GPU (or the closest there was)
    for (std::uint64_t k = 0; k < symtab->size / 24; ++k) {
      const unsigned char* sym = p_ + symtab->offset + k * 24;
      const auto name = str(strtab, read_le<std::uint32_t>(sym));
      const unsigned char info = sym[4], other = sym[5];
      const auto shndx = read_le<std::uint16_t>(sym + 6);
      const auto value = read_le<std::uint64_t>(sym + 8);
      const auto size = read_le<std::uint64_t>(sym + 16);
      if (name.empty() || shndx == 0 || shndx >= secs_.size()) continue;
      if ((info & 0xf) == kSttFunc && (other & kStoCudaEntry) != 0) {
        if (!add_entry(img, name)) return CUDA_ERROR_INVALID_IMAGE;
      } else if ((info & 0xf) == kSttObject && size != 0) {
        const ElfSection& home = secs_[shndx];
        const bool global = home.sname.starts_with(".nv.global");
        const bool constant = home.sname.starts_with(".nv.constant") && !home.sname.starts_with(".nv.constant0");
        if (!global && !constant) continue;
        if (size > (std::uint64_t{1} << 40)) return fail("global " + std::string(name) + " is too large");
        PtxGlobal g;
        g.name = std::string(name);
        g.constant = constant;
        g.size = static_cast<std::size_t>(size);
        g.align = 8;
        if (home.type != kShtNobits && value <= home.size && size <= home.size - value)
          g.init.assign(p_ + home.offset + value, p_ + home.offset + value + size);
        img.globals.push_back(std::move(g));
      }
    }
    return CUDA_SUCCESS;
  }

 private:
  CUresult fail(std::string msg) {
    why_ = std::move(msg);
    return CUDA_ERROR_INVALID_IMAGE;
  }

  bool read_sections() {
    if (len_ < 64 || p_[4] != 2 || p_[5] != 1) {
      fail("not a 64-bit little-endian ELF");
      return false;
    }
    const auto shoff = read_le<std::uint64_t>(p_ + 0x28);
    const auto shentsize = read_le<std::uint16_t>(p_ + 0x3a);
    const auto shnum = read_le<std::uint16_t>(p_ + 0x3c);
    const auto shstrndx = read_le<std::uint16_t>(p_ + 0x3e);
    if (shentsize != 64 || shnum == 0 || shstrndx >= shnum || shoff > len_ ||
        std::uint64_t{shnum} * 64 > len_ - shoff) {
      fail("corrupt ELF section table");
      return false;
    }
    secs_.resize(shnum);
    for (std::size_t i = 0; i < shnum; ++i) {
      const unsigned char* h = p_ + shoff + i * 64;
      ElfSection& s = secs_[i];
      s.name = read_le<std::uint32_t>(h);
      s.type = read_le<std::uint32_t>(h + 4);
      s.offset = read_le<std::uint64_t>(h + 0x18);
      s.size = read_le<std::uint64_t>(h + 0x20);
      s.link = read_le<std::uint32_t>(h + 0x28);
      s.entsize = read_le<std::uint64_t>(h + 0x38);
      if (s.type != kShtNobits && s.type != 0 && (s.offset > len_ || s.size > len_ - s.offset)) {
        fail("an ELF section overruns the image");
        return false;
      }
    }
    for (auto& s : secs_) s.sname = str(secs_[shstrndx], s.name);
    return true;
  }

  // A NUL-terminated string inside section s, or empty.
  std::string_view str(const ElfSection& s, std::uint64_t off) const {
    if (s.type == kShtNobits || off >= s.size) return {};
    const auto* b = reinterpret_cast<const char*>(p_ + s.offset + off);
    const auto* e = static_cast<const char*>(std::memchr(b, '\0', static_cast<std::size_t>(s.size - off)));
    return e == nullptr ? std::string_view{} : std::string_view(b, static_cast<std::size_t>(e - b));
  }

  const ElfSection* section(std::string_view prefix, std::string_view name) const {
    for (const auto& s : secs_)
      if (s.sname.size() == prefix.size() + name.size() && s.sname.starts_with(prefix) &&
          s.sname.ends_with(name))
        return &s;
    return nullptr;
  }

  bool add_entry(PtxImage& img, std::string_view name) {
    PtxEntry e;
    e.name = std::string(name);
    if (const ElfSection* sh = section(".nv.shared.", name)) e.static_shared = static_cast<std::size_t>(sh->size);
    struct Slot {
      std::uint16_t ordinal;
      PtxParam p;
    };
    std::vector<Slot> slots;
    if (const ElfSection* info = section(".nv.info.", name)) {
      const unsigned char* r = p_ + info->offset;
      std::uint64_t left = info->size;
      while (left >= 4) {
        const unsigned char fmt = r[0], attr = r[1];
        std::uint64_t rec = 4;
        if (fmt == kEiFmtSval) {
          const auto n = read_le<std::uint16_t>(r + 2);
          if (n > left - 4) {
            fail(".nv.info of " + e.name + " overruns its section");
            return false;
          }
          rec += n;
          if (attr == kEiAttrKparamInfo && n >= 12) {
            Slot sl{};
            sl.ordinal = read_le<std::uint16_t>(r + 8);
            sl.p.offset = read_le<std::uint16_t>(r + 10);
            sl.p.size = (read_le<std::uint32_t>(r + 12) >> 18) & 0x3fff;
            // The ELF keeps no alignment: the largest power of two (<= 8) the offset allows.
            sl.p.align = sl.p.offset == 0 ? 8 : std::min<std::size_t>(8, sl.p.offset & (~sl.p.offset + 1));
            if (sl.p.size == 0 || sl.p.offset > kMaxParamBytes || sl.p.size > kMaxParamBytes - sl.p.offset) {
              fail("a parameter of " + e.name + " lies outside the parameter space");
              return false;
            }
            slots.push_back(sl);
          } else if (attr == kEiAttrParamCbank && n >= 8) {
            e.param_bytes = std::max<std::size_t>(e.param_bytes, read_le<std::uint16_t>(r + 10));
          }
        }
        r += rec;
        left -= rec;
      }
    }
    std::sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) { return a.ordinal < b.ordinal; });
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].ordinal != i) {
        fail("the parameter ordinals of " + e.name + " are not 0..n-1");
        return false;
      }
      e.params.push_back(slots[i].p);
      e.param_bytes = std::max(e.param_bytes, slots[i].p.offset + slots[i].p.size);
    }
    if (e.param_bytes > kMaxParamBytes) {
      fail("the parameters of " + e.name + " exceed the parameter space");
      return false;
    }
    img.entries.push_back(std::move(e));
    return true;
  }

  const unsigned char* p_;
  std::size_t len_;
  std::string& why_;
  std::vector<ElfSection> secs_;
};

// The extent of an ELF image known only by its address (cuModuleLoadData of a cubin): the
// end of its section table or of its last section, whichever is further. Like the driver,
// the double has to trust the header that far.
std::optional<std::size_t> elf_extent(const unsigned char* p) {
  if (p[4] != 2 || p[5] != 1) return std::nullopt;
  const auto shoff = read_le<std::uint64_t>(p + 0x28);
  const auto shentsize = read_le<std::uint16_t>(p + 0x3a);
  const auto shnum = read_le<std::uint16_t>(p + 0x3c);
  if (shentsize != 64 || shoff > kMaxEntryBytes) return std::nullopt;
  std::uint64_t end = shoff + std::uint64_t{shnum} * 64;
  for (std::size_t i = 0; i < shnum; ++i) {
    const unsigned char* h = p + shoff + i * 64;
    const auto type = read_le<std::uint32_t>(h + 4);
    const auto off = read_le<std::uint64_t>(h + 0x18);
    const auto size = read_le<std::uint64_t>(h + 0x20);
    if (type == kShtNobits || type == 0) continue;
    if (off > kMaxEntryBytes || size > kMaxEntryBytes - off) return std::nullopt;
    end = std::max(end, off + size);
  }
  return static_cast<std::size_t>(end);
}

CUresult parse_cubin(const unsigned char* p, std::size_t len, PtxImage& out, std::string& why) {
  out = PtxImage{};
  return CubinParser(p, len, why).run(out);
}

CUresult load_fatbin(const unsigned char* base, PtxImage& out, std::string& why) {
  FatbinHeader h;
  std::memcpy(&h, base, sizeof h);
  if (h.header_size < sizeof h || h.payload_size > kMaxFatbinBytes) {
    why = "corrupt fatbin header";
    return CUDA_ERROR_INVALID_IMAGE;
  }
  const bool foreign = foreign_images_enabled();
  const std::uint64_t end = h.header_size + h.payload_size;
  std::uint64_t off = h.header_size;
  const unsigned char* best = nullptr;
  std::uint64_t best_len = 0;
  std::uint32_t best_arch = 0;
  bool saw_compressed = false;
  // Foreign images only: compressed PTX, and SASS (the exact arch preferred).
  std::optional<FatbinEntryHeader> zptx, elf;
  const unsigned char* zptx_at = nullptr;
  const unsigned char* elf_at = nullptr;
  auto elf_rank = [](std::uint32_t arch) { return arch == kDeviceSm ? 1000u : arch < kDeviceSm ? arch : 0u; };
  while (off < end) {
    FatbinEntryHeader e;
    if (end - off < sizeof e) {
      why = "truncated fatbin entry header";
      return CUDA_ERROR_INVALID_IMAGE;
    }
    std::memcpy(&e, base + off, sizeof e);
    if (e.header_size < sizeof e || e.header_size > end - off ||
        e.payload_size > end - off - e.header_size) {
      why = "fatbin entry overruns the fatbin";
      return CUDA_ERROR_INVALID_IMAGE;
    }
    const unsigned char* payload = base + off + e.header_size;
    if (e.kind == kFatbinKindPtx) {
      const bool compressed = (e.flags & kFatbinCompressedFlags) != 0 || e.uncompressed_size != 0;
      saw_compressed |= compressed;
      if (!compressed && e.arch <= kDeviceSm && (best == nullptr || e.arch > best_arch)) {
        best = payload;
        best_len = e.payload_size;
        best_arch = e.arch;
      }
      if (compressed && e.arch <= kDeviceSm && (!zptx || e.arch > zptx->arch)) {
        zptx = e;
        zptx_at = payload;
      }
    } else if (e.kind == kFatbinKindElf) {
      if (!elf || elf_rank(e.arch) > elf_rank(elf->arch)) {
        elf = e;
        elf_at = payload;
      }
    } else if (!foreign) {
      why = "unknown fatbin entry kind " + std::to_string(e.kind);
      return CUDA_ERROR_INVALID_IMAGE;
    }  // foreign images: other kinds (LTO IR, ...) carry nothing the double uses
    off += e.header_size + e.payload_size;
  }
  if (best == nullptr && foreign) {
    std::string ptx_why;
    if (zptx) {
      if (auto text = entry_payload(*zptx, zptx_at, ptx_why)) {
        const auto* t = reinterpret_cast<const char*>(text->data());
        const std::size_t len = static_cast<std::size_t>(std::find(t, t + text->size(), '\0') - t);
        if (parse_ptx(std::string_view(t, len), out, ptx_why) == CUDA_SUCCESS) return CUDA_SUCCESS;
      }
    }
    if (elf) {
      auto bytes = entry_payload(*elf, elf_at, why);
      if (!bytes) return CUDA_ERROR_INVALID_IMAGE;
      return parse_cubin(bytes->data(), bytes->size(), out, why);
    }
    why = ptx_why.empty() ? "the fatbin holds neither PTX nor SASS" : ptx_why;
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  }
  if (best == nullptr) {
    why = saw_compressed ? "the fatbin's PTX is compressed (build it with nvcc --no-compress)"
                         : "the fatbin holds no PTX for sm_90 or older, and SASS cannot run here";
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  }
  // The payload is NUL-padded text.
  const auto* text = reinterpret_cast<const char*>(best);
  const std::size_t len = static_cast<std::size_t>(std::find(text, text + best_len, '\0') - text);
  const CUresult r = parse_ptx(std::string_view(text, len), out, why);
  return r == CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_IMAGE;
}

}  // namespace

bool foreign_images_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("IVCUDA_DOUBLE_UNKNOWN_KERNELS");
    return v != nullptr && std::strcmp(v, "skip") == 0;
  }();
  return on;
}

CUresult parse_ptx(std::string_view text, PtxImage& out, std::string& why) {
  out = PtxImage{};
  return Parser(text, out, why).run();
}

CUresult load_image(const void* image, PtxImage& out, std::string& why) {
  if (image == nullptr) {
    why = "null image";
    return CUDA_ERROR_INVALID_VALUE;
  }
  const auto* bytes = static_cast<const unsigned char*>(image);
  // Read the magic byte by byte so that a PTX string shorter than four bytes is not overrun.
  std::uint32_t magic = 0;
  for (int k = 0; k < 4; ++k) {
    if (bytes[k] == 0) break;
    magic |= std::uint32_t{bytes[k]} << (8 * k);
  }
  if (magic == kFatbinWrapperMagic) {
    const void* fatbin = nullptr;
    std::memcpy(&fatbin, bytes + 8, sizeof fatbin);
    if (fatbin == nullptr) {
      why = "fatbin wrapper without a fatbin";
      return CUDA_ERROR_INVALID_IMAGE;
    }
    const auto* fb = static_cast<const unsigned char*>(fatbin);
    std::uint32_t inner = 0;
    std::memcpy(&inner, fb, sizeof inner);
    if (inner != kFatbinMagic) {
      why = "fatbin wrapper does not point at a fatbin";
      return CUDA_ERROR_INVALID_IMAGE;
    }
    return load_fatbin(fb, out, why);
  }
  if (magic == kFatbinMagic) return load_fatbin(bytes, out, why);
  if (magic == 0x464c457fu && foreign_images_enabled()) {
    const auto len = elf_extent(bytes);
    if (!len) {
      why = "corrupt cubin header";
      return CUDA_ERROR_INVALID_IMAGE;
    }
    return parse_cubin(bytes, *len, out, why);
  }
  if (magic == 0x464c457fu) {  // "\x7fELF": a cubin
    why = "cubin images hold SASS, which the GPU test double cannot run";
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes));
  if (text.find(".version") == std::string_view::npos) {
    why = "neither PTX, a fatbin nor a cubin";
    return CUDA_ERROR_INVALID_IMAGE;
  }
  const CUresult r = parse_ptx(text, out, why);
  if (r != CUDA_SUCCESS) return r;
  if (out.target_sm > kDeviceSm) {
    // What the real driver's JIT says about PTX for a newer GPU.
    why = "PTX targets sm_" + std::to_string(out.target_sm) + ", the double emulates sm_90";
    return CUDA_ERROR_INVALID_PTX;
  }
  return CUDA_SUCCESS;
}

}  // namespace ivcuda::gpu_double
