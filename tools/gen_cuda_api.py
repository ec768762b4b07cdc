#!/usr/bin/env python3
"""Generate the exported API surface of the guest libcuda.so.1 from the CUDA toolkit headers.

Inputs (all from --cuda-include):
  cuda.h, cudaProfiler.h           the functions and every ABI generation of them. The legacy
                                   forms (cuMemAlloc taking 32-bit sizes, cuCtxSynchronize
                                   without a context, ...) and the _ptds/_ptsz forms are only
                                   declared when __CUDA_API_VERSION_INTERNAL is defined, so the
                                   headers are run through the C preprocessor with it.
  cudaTypedefs.h,
  cudaProfilerTypedefs.h           PFN_<name>_v<version>[_ptds|_ptsz]: the CUDA version at which
                                   each ABI generation of a public name appeared. This is what
                                   cuGetProcAddress(name, cudaVersion, flags) is keyed on.

Outputs (all to --out-dir, rewritten only when their content changes):
  cuda_api_table.inc     IVCUDA_API_ROW(symbol, base, version, per_thread) per exported symbol
  cuda_stubs.cc          a weak stub per symbol: logs once, returns CUDA_ERROR_NOT_SUPPORTED
  cuda_symbols.cc        the address of every exported symbol, by table index
  cuda_exports.map       linker version script exporting exactly the table
  cuda_procaddress.inc   the (public name, version) -> symbol map for cuGetProcAddress

How a PFN typedef is tied to a symbol: within one public name, the ABI generations are
cuX, cuX_v2, cuX_v3, ... in the order they appeared, and the typedef versions sorted
ascending follow the same order (cuCtxCreate: v2000 -> cuCtxCreate, v3020 -> _v2,
v11040 -> _v3, v12050 -> _v4). The per-thread forms (cuX[_vN]_ptds / _ptsz) are matched the same
way among themselves. The generator refuses to run if the counts disagree anywhere, so a
toolkit that breaks the rule is caught here, not at run time.

The header parsing shared with gen_nvml_api.py (the preprocessor run, statements,
declarations) is in cheader.py.

Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import sys
import tempfile
from pathlib import Path

from cheader import (GenError, file_scope_statements, function_declarations, preprocess,
                     version_script, write_outputs)

# Headers whose functions libcuda.so.1 exports. cudaGL.h, cudaEGL.h and cudaVDPAU.h are also
# implemented by the real driver, but graphics interop cannot cross to the host, so the guest
# library deliberately leaves them out (cuGetProcAddress answers "not found" for them).
API_HEADERS = ("cuda.h", "cudaProfiler.h")
TYPEDEF_HEADERS = ("cudaTypedefs.h", "cudaProfilerTypedefs.h")

SUFFIX_RE = re.compile(r"^(?P<base>\w+?)(?:_v(?P<gen>\d+))?(?:_(?P<pt>ptds|ptsz))?$")
PFN_RE = re.compile(r"\bPFN_(?P<name>\w+)_v(?P<ver>\d+)(?:_(?P<pt>ptds|ptsz))?\s*\)")
LINEMARK_RE = re.compile(r'^#\s+\d+\s+"(?P<file>[^"]*)"')


@dataclasses.dataclass
class Symbol:
    name: str
    base: str = ""         # public name cuGetProcAddress knows it by
    version: int = 0       # CUDA version at which this ABI appeared
    per_thread: str = ""   # "", "ptds" or "ptsz"


# --------------------------------------------------------------------------------------------
# Parsing

def preprocess_api(cc: str, include: Path, internal: bool) -> str:
    src = "".join(f"#include <{h}>\n" for h in API_HEADERS)
    flags = ["-I", str(include)]
    if internal:
        flags.append("-D__CUDA_API_VERSION_INTERNAL")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "api.c"
        path.write_text(src)
        return preprocess(cc, path, flags)


def api_text(pp: str, include: Path) -> str:
    """The preprocessed lines that come from API_HEADERS, not from the libc headers they
    include: told apart by the preprocessor's line markers, which is why there is no -P here."""
    wanted = {str((include / h).resolve()) for h in API_HEADERS}
    kept: list[str] = []
    in_api = False
    for line in pp.splitlines():
        m = LINEMARK_RE.match(line)
        if m:
            in_api = str(Path(m.group("file")).resolve()) in wanted
        elif in_api:
            # A statement never spans files here, so dropping a system header's lines
            # leaves no partial statement behind.
            kept.append(line)
    return "\n".join(kept)


def declared_functions(pp: str, include: Path) -> dict[str, str]:
    """name -> return type of every function declared at file scope in the API headers."""
    statements = file_scope_statements(api_text(pp, include))
    return {f.name: f.ret for f in function_declarations(statements)}


def typedef_versions(include: Path) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for h in TYPEDEF_HEADERS:
        text = (include / h).read_text()
        for m in PFN_RE.finditer(text):
            out[m.group("name")].append((int(m.group("ver")), m.group("pt") or ""))
    if not out:
        raise GenError(f"no PFN_ typedefs found in {include}")
    return out


def header_int(text: str, pattern: str, what: str) -> int:
    m = re.search(pattern, text, re.M)
    if not m:
        raise GenError(f"cannot find {what} in cuda.h")
    return int(m.group(1))


# --------------------------------------------------------------------------------------------
# Model

@dataclasses.dataclass
class Api:
    cuda_version: int
    not_supported: int
    symbols: list[Symbol]                              # sorted by name
    # public name -> its symbols, default-stream forms first, each group by version
    proc: dict[str, list[Symbol]]


def build_model(include: Path, cc: str) -> Api:
    cuda_h = (include / "cuda.h").read_text()
    cuda_version = header_int(cuda_h, r"^#define\s+CUDA_VERSION\s+(\d+)", "CUDA_VERSION")
    not_supported = header_int(cuda_h, r"\bCUDA_ERROR_NOT_SUPPORTED\s*=\s*(\d+)",
                               "CUDA_ERROR_NOT_SUPPORTED")

    internal = declared_functions(preprocess_api(cc, include, True), include)
    public = declared_functions(preprocess_api(cc, include, False), include)
    if missing := sorted(set(public) - set(internal)):
        raise GenError(f"declared only without __CUDA_API_VERSION_INTERNAL: {missing}")
    bad = {n: r for n, r in internal.items() if r != "CUresult" or not n.startswith("cu")}
    if bad:
        # The stubs return an int in the CUresult register; anything else needs a real body.
        raise GenError("functions not of the form 'CUresult cu...(...)': "
                       + ", ".join(f"{r} {n}" for n, r in sorted(bad.items())))

    symbols = {n: Symbol(n) for n in internal}
    families: dict[str, list[Symbol]] = collections.defaultdict(list)
    gen_of: dict[str, int] = {}
    for s in symbols.values():
        m = SUFFIX_RE.match(s.name)
        assert m
        s.base = m.group("base")
        s.per_thread = m.group("pt") or ""
        gen_of[s.name] = int(m.group("gen") or 1)
        families[s.base].append(s)

    pfns = typedef_versions(include)
    if orphans := sorted(set(pfns) - set(families)):
        raise GenError(f"PFN typedefs without a declared function: {orphans}")
    if untyped := sorted(set(families) - set(pfns)):
        raise GenError(f"functions without a PFN typedef (no version known): {untyped}")

    for base, members in families.items():
        for pt in ("", "ptds", "ptsz"):
            syms = sorted((s for s in members if s.per_thread == pt), key=lambda s: gen_of[s.name])
            vers = sorted(v for v, p in pfns[base] if p == pt)
            if len(syms) != len(vers) or len(set(vers)) != len(vers):
                raise GenError(f"{base}{'/' + pt if pt else ''}: typedef versions {vers} do not "
                               f"pair with symbols {[s.name for s in syms]}")
            for s, v in zip(syms, vers):
                s.version = v

    for s in symbols.values():
        if s.per_thread:
            twin = s.name[: -len("_" + s.per_thread)]
            if twin not in symbols or symbols[twin].base != s.base:
                raise GenError(f"{s.name} has no default-stream twin {twin}")

    # Per-thread forms are looked up among themselves, by their own versions: NVIDIA's driver
    # answers cuMemcpyHtoD@3020 with PER_THREAD "version not sufficient", not with the legacy
    # cuMemcpyHtoD_v2 (recorded in tests/api/data/real_driver_answers.txt).
    proc: dict[str, list[Symbol]] = {
        base: sorted(members, key=lambda s: (s.per_thread != "", s.version))
        for base, members in families.items()}
    return Api(cuda_version, not_supported, sorted(symbols.values(), key=lambda s: s.name), proc)


# --------------------------------------------------------------------------------------------
# Emitters

HEADER = "// Generated by tools/gen_cuda_api.py from the CUDA {ver} headers. Do not edit.\n"


def emit_table(api: Api) -> str:
    lines = [HEADER.format(ver=api.cuda_version),
             "// IVCUDA_API_ROW(symbol, base, version, per_thread): one row per exported symbol,",
             "// sorted by symbol name; the row's position is its index everywhere else.",
             f"// {len(api.symbols)} rows.\n"]
    for s in api.symbols:
        lines.append(f"IVCUDA_API_ROW({s.name}, {s.base}, {s.version}, "
                     f"{1 if s.per_thread else 0})")
    return "\n".join(lines) + "\n"


def emit_stubs(api: Api) -> str:
    n = len(api.symbols)
    out = [HEADER.format(ver=api.cuda_version), """\
// Default definitions of every exported driver function. They are weak, so a real
// implementation anywhere else in the library replaces one at link time. This file must not
// include cuda.h: the prototypes here are deliberately all `int f(void)`, which returns the
// CUresult in the same register on x86-64 and aarch64 whatever the caller passed.
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <iterator>

namespace {

std::atomic<unsigned> g_calls[%d];

[[gnu::cold, gnu::noinline]] int unsupported(std::size_t index, const char* name) noexcept {
  // One line per function, not per call: a loop over an unsupported call must not flood.
  if (g_calls[index].fetch_add(1, std::memory_order_relaxed) == 0) {
    std::fprintf(stderr, "ivcuda: %%s is not supported yet\\n", name);
  }
  return %d;  // CUDA_ERROR_NOT_SUPPORTED
}

}  // namespace

namespace ivcuda::api::detail {
// How often the stub of kSymbols[index] answered (a strong definition never counts).
unsigned stub_calls(std::size_t index) noexcept {
  return index < std::size(g_calls) ? g_calls[index].load(std::memory_order_relaxed) : 0;
}
}  // namespace ivcuda::api::detail

#define IVCUDA_STUB(index, name) \\
  extern "C" [[gnu::weak, gnu::visibility("default")]] int name(void) noexcept { \\
    return unsupported(index, #name); \\
  }
""" % (n, api.not_supported)]
    for i, s in enumerate(api.symbols):
        out.append(f"IVCUDA_STUB({i}, {s.name})")
    return "\n".join(out) + "\n"


def emit_symbols(api: Api) -> str:
    out = [HEADER.format(ver=api.cuda_version), """\
// Addresses of the exported functions, by table index. The declarations are `int f(void)` on
// purpose (no cuda.h here): only the address is taken, and the linker binds each name to the
// strongest definition in the library, the weak stub only where nothing else defines it.
#include <cstddef>

#define IVCUDA_API_ROW(symbol, base, version, per_thread) extern "C" int symbol(void) noexcept;
#include "cuda_api_table.inc"
#undef IVCUDA_API_ROW

namespace ivcuda::api::detail {

namespace {
using Fn = int (*)(void) noexcept;
constexpr Fn kAddresses[] = {
#define IVCUDA_API_ROW(symbol, base, version, per_thread) &symbol,
#include "cuda_api_table.inc"
#undef IVCUDA_API_ROW
};
}  // namespace

extern const std::size_t kSymbolAddressCount = sizeof kAddresses / sizeof kAddresses[0];

void* symbol_address(std::size_t index) noexcept {
  if (index >= kSymbolAddressCount) return nullptr;
  // Function to object pointer: conditionally supported, and what dlsym does on ELF.
  return reinterpret_cast<void*>(kAddresses[index]);
}

}  // namespace ivcuda::api::detail
"""]
    return "\n".join(out)


def emit_map(api: Api) -> str:
    return version_script("gen_cuda_api.py", "libcuda.so.1", "the driver API",
                          (s.name for s in api.symbols))


def emit_procaddress(api: Api) -> str:
    index = {s.name: i for i, s in enumerate(api.symbols)}
    rows = []
    for base in sorted(api.proc):  # byte order == strcmp order for these ASCII names
        for s in api.proc[base]:
            rows.append(f'    {{"{base}", {1 if s.per_thread else 0}, {s.version}, '
                        f"{index[s.name]}}},  // {s.name}")
    return (HEADER.format(ver=api.cuda_version)
            + "// cuGetProcAddress data: one row per ABI generation of a public name, sorted by\n"
            + "// name, then default-stream forms before per-thread ones, then version.\n"
            + "// The last column indexes cuda_api_table.inc.\n"
            + f"inline constexpr int kHeaderCudaVersion = {api.cuda_version};\n"
            + f"inline constexpr std::size_t kSymbolCount = {len(api.symbols)};\n"
            + "inline constexpr ProcEntry kProcEntries[] = {\n"
            + "\n".join(rows) + "\n};\n")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda-include", required=True, type=Path)
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"), help="C preprocessor driver")
    args = ap.parse_args(argv)
    try:
        for h in API_HEADERS + TYPEDEF_HEADERS:
            if not (args.cuda_include / h).is_file():
                raise GenError(f"{args.cuda_include / h} not found")
        api = build_model(args.cuda_include, args.cc)
        write_outputs(args.out_dir, {"cuda_api_table.inc": emit_table(api),
                                     "cuda_stubs.cc": emit_stubs(api),
                                     "cuda_symbols.cc": emit_symbols(api),
                                     "cuda_exports.map": emit_map(api),
                                     "cuda_procaddress.inc": emit_procaddress(api)})
    except (GenError, OSError) as e:
        print(f"gen_cuda_api.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
