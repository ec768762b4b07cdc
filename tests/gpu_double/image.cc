#include "image.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

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

CUresult load_fatbin(const unsigned char* base, PtxImage& out, std::string& why) {
  FatbinHeader h;
  std::memcpy(&h, base, sizeof h);
  if (h.header_size < sizeof h || h.payload_size > kMaxFatbinBytes) {
    why = "corrupt fatbin header";
    return CUDA_ERROR_INVALID_IMAGE;
  }
  const std::uint64_t end = h.header_size + h.payload_size;
  std::uint64_t off = h.header_size;
  const unsigned char* best = nullptr;
  std::uint64_t best_len = 0;
  std::uint32_t best_arch = 0;
  bool saw_compressed = false;
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
    if (e.kind == kFatbinKindPtx) {
      const bool compressed = (e.flags & kFatbinCompressedFlags) != 0 || e.uncompressed_size != 0;
      saw_compressed |= compressed;
      if (!compressed && e.arch <= kDeviceSm && (best == nullptr || e.arch > best_arch)) {
        best = base + off + e.header_size;
        best_len = e.payload_size;
        best_arch = e.arch;
      }
    } else if (e.kind != kFatbinKindElf) {
      why = "unknown fatbin entry kind " + std::to_string(e.kind);
      return CUDA_ERROR_INVALID_IMAGE;
    }
    off += e.header_size + e.payload_size;
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
