#!/usr/bin/env python3
"""Generate the guest libnvidia-ml.so.1's export table from NVIDIA's nvml.h.

usage: gen_nvml_api.py --nvml-h PATH --out-dir DIR [--cc CC] [--passthrough LIST] [--host]

Outputs (build tree only):
  nvml_api_table.inc  IVCUDA_NVML_ROW(name, default), one row per export, sorted by name;
                      default is NotSupported, NoPermission or None (nvmlErrorString, which
                      returns a string and must be written by hand)
  nvml_stubs.cc       a weak `extern "C" int name(void)` per nvmlReturn_t function answering its
                      default through ivcuda::nvml::default_answer() (UNINITIALIZED before nvmlInit)
  nvml_exports.map    linker version script: exactly the table global, everything else local
  nvml_passthrough.cc with --passthrough: the guest's definition of each function that list names,
                      forwarding it as NvmlFn kPassthroughBase + row (include/ivcuda/nvml_wire.h)
With --host, only nvml_passthrough_host.inc: the worker's side of the same list (the NvmlApi
members and the call of the host's NVML for each row), for host-daemon/worker/nvml_passthrough.cc.

How a pass-through function travels is read off its prototype: `nvmlDevice_t device` first (a
device query) or not (a system query), by-value arguments as input slots, each pointer as one
value out, unless the list's hints make it a list (array=), a text buffer (string=, chars=).

Which symbols: nvml.h through `cc -E` with NVML_NO_UNVERSIONED_FUNC_DEFS. Without it the header
#defines the legacy names to their newest ABI (nvmlInit -> nvmlInit_v2) and declares only the
latter; with it, it also declares the legacy entry points (nvmlInit, nvmlDeviceGetPciInfo,
nvmlDeviceGetPciInfo_v2, nvmlDeviceGetCount, ...), which NVIDIA's libnvidia-ml.so.1 keeps
exporting for programs built against older headers. So one pass with the guard gives both
generations; the generator checks that every name of the header's #define block is declared.

Which default: a function that changes the GPU's state or needs the host's privileges (set*,
reset*, clear*, create/destroy of MIG instances, drain/remove/discover, PRM access, power
smoothing and workload profiles, GPM streaming, vGPU version) answers NVML_ERROR_NO_PERMISSION:
a guest is not the GPU's administrator. Everything else answers NVML_ERROR_NOT_SUPPORTED until a
hand-written definition (guest/nvml/) replaces the weak stub.

The header parsing shared with gen_cuda_api.py (the preprocessor run, statements,
declarations) is in cheader.py.
"""
import argparse
import os
import re
import sys
from pathlib import Path

from cheader import (GenError, file_scope_statements, function_declarations, preprocess,
                     version_script, write_outputs)

NVML_SUCCESS_TYPE = "nvmlReturn_t"

# The verb after the object prefix (nvmlDevice, nvmlSystem, nvmlGpuInstance...) that marks a
# state change. Matched on the name with the prefix and any sub-family removed.
PRIVILEGED_VERB = re.compile(
    r"^(Set|Reset|Clear|Create|Destroy|Modify|Remove|Discover|Freeze|ReadWrite|Activate|Update)")
OBJECT_PREFIX = re.compile(
    r"^nvml(Device|System|Unit|GpuInstance|ComputeInstance|VgpuInstance|VgpuType|Gpm|)"
    r"(PowerSmoothing|WorkloadPowerProfile)?")
# Setters that need no privilege and change nothing of the GPU: they concern the calling
# process (its CPU affinity) and are meaningless in a guest, so NOT_SUPPORTED is the truth.
NOT_PRIVILEGED = {"nvmlDeviceSetCpuAffinity", "nvmlDeviceClearCpuAffinity"}


def declarations(text: str, params: dict[str, str] | None = None) -> dict[str, str]:
    """name -> return type of every function nvml.h declares (and name -> parameter list into
    `params`, when given). A return type is compared without its spaces (const char*)."""
    decls = {}
    for f in function_declarations(file_scope_statements(text)):
        if not f.name.startswith("nvml"):
            continue  # not an entry point of libnvidia-ml.so.1, so nothing to export
        if f.name in decls:
            raise GenError(f"{f.name} declared twice")
        decls[f.name] = f.ret.replace(" ", "")
        if params is not None:
            params[f.name] = f.params
    return decls


def unversioned_defines(raw: str) -> dict[str, str]:
    """The header's `#define nvmlX nvmlX_vN` block (what the guard turns off)."""
    m = re.search(r"#ifndef NVML_NO_UNVERSIONED_FUNC_DEFS(.*?)#endif", raw, re.S)
    if m is None:
        raise GenError("nvml.h has no NVML_NO_UNVERSIONED_FUNC_DEFS block")
    return dict(re.findall(r"#define\s+(nvml\w+)\s+(nvml\w+)", m.group(1)))


def default_of(name: str, ret: str) -> str:
    if ret != NVML_SUCCESS_TYPE:
        if name == "nvmlErrorString":
            return "None"
        raise GenError(f"{name} returns {ret}: a weak int stub would be wrong; write it by hand")
    if name in NOT_PRIVILEGED:
        return "NotSupported"
    rest = OBJECT_PREFIX.sub("", name, count=1)
    if name in {"nvmlSetVgpuVersion"} or PRIVILEGED_VERB.match(rest):
        return "NoPermission"
    return "NotSupported"


def build(nvml_h: Path, cc: str, params: dict[str, str] | None = None) -> dict[str, str]:
    raw = nvml_h.read_text(errors="replace")
    # -P: nvml.h includes no other header, so everything that comes out is its own and no
    # line markers are needed to tell it apart.
    decls = declarations(preprocess(cc, nvml_h, ["-P", "-DNVML_NO_UNVERSIONED_FUNC_DEFS"]), params)
    if "nvmlInit_v2" not in decls or "nvmlErrorString" not in decls:
        raise GenError("nvmlInit_v2 / nvmlErrorString not found: is this nvml.h?")
    for legacy, target in unversioned_defines(raw).items():
        if not target.startswith("nvml") or legacy.endswith("_t") or target.endswith("_t"):
            continue  # type aliases (nvmlBlacklistDeviceInfo_t)
        if target not in decls:
            raise GenError(f"#define {legacy} {target}: {target} is not declared")
        # Aliases of renamed functions (nvmlGetBlacklistDeviceCount -> nvmlGetExcludedDeviceCount)
        # are macros only: the header declares no such function, so there is nothing to export.
    return {name: default_of(name, ret) for name, ret in sorted(decls.items())}


HEADER = "// Generated by tools/gen_nvml_api.py from nvml.h. Do not edit.\n"

class Param:
    def __init__(self, text: str):
        m = re.fullmatch(r"(.*?)\s*(\w+)", text.strip())
        if m is None:
            raise GenError(f"cannot parse a parameter: {text}")
        typ, self.name = m.group(1), m.group(2)
        self.pointer = typ.count("*")
        self.const = "const" in re.findall(r"\w+", typ)
        self.base = " ".join(w for w in re.findall(r"\w+", typ) if w != "const")
        self.text = text.strip()


class Row:
    """One function of the pass-through list, its parameters classified."""

    def __init__(self, number: int, name: str, hints: list[str], params: str):
        self.number, self.name = number, name
        self.params = [] if params in ("", "void") else [Param(p) for p in params.split(",")]
        self.system = not (self.params and self.params[0].base == "nvmlDevice_t")
        body = self.params if self.system else self.params[1:]
        self.arrays: dict[str, str] = {}   # items -> count (a pointer or a by-value size)
        self.strings: dict[str, str] = {}  # buffer -> length parameter
        self.chars: dict[str, str] = {}    # buffer -> fixed size
        self.struct_in: dict[str, str] = {}  # struct out -> its leading 32-bit words the caller fills
        self.raw: dict[str, str] = {}      # buffer -> its size in bytes (a by-value parameter)
        for h in hints:
            key, _, val = h.partition("=")
            items, _, count = val.partition(":")
            if not count:
                raise GenError(f"{name}: hint {h} wants NAME:COUNT")
            for it in items.split(","):
                {"array": self.arrays, "string": self.strings, "chars": self.chars,
                 "in": self.struct_in, "bytes": self.raw}.get(key, {})[it] = count
            if key not in ("array", "string", "chars", "in", "bytes"):
                raise GenError(f"{name}: unknown hint {h}")
        names = {p.name: p for p in body}
        for what in list(self.arrays) + list(self.arrays.values()) + list(self.strings) + \
                list(self.strings.values()) + list(self.chars) + list(self.struct_in) + \
                list(self.raw) + list(self.raw.values()):
            if what not in names:
                raise GenError(f"{name}: a hint names {what}, which is not a parameter")
        for p in body:
            if p.const or p.pointer > 1:
                raise GenError(f"{name}: parameter {p.text} is neither a value in nor a value out")
        self.body = body
        self.names = names

    def counts(self) -> set[str]:
        return set(self.arrays.values()) | set(self.strings.values()) | set(self.raw.values())

    def kind(self, p: Param) -> str:
        """What parameter p is on the wire, the same for both sides' code: "count" (a list's
        count, a text's length or a buffer's size: taken with its buffer), "items" (a list's
        first array), "more_items" (another array of the same count), "text", "raw", "chars",
        "struct_in", "out" or "in"."""
        if p.name in self.counts():
            return "count"
        if p.name in self.arrays:
            count = self.arrays[p.name]
            return "items" if [i for i, c in self.arrays.items() if c == count][0] == p.name else "more_items"
        for kind, table in (("text", self.strings), ("raw", self.raw), ("chars", self.chars),
                            ("struct_in", self.struct_in)):
            if p.name in table:
                return kind
        return "out" if p.pointer else "in"


def read_passthrough(path: Path, params: dict[str, str], decls: dict[str, str]) -> list[Row]:
    rows, number = [], 0
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or (line.startswith("#") and not line.startswith("#-")):
            continue
        retired = line.startswith("#-")
        words = line.lstrip("#-").split()
        if not retired:
            if words[0] not in params:
                raise GenError(f"{path.name}: {words[0]} is not declared in nvml.h")
            if decls[words[0]] != NVML_SUCCESS_TYPE:
                raise GenError(f"{path.name}: {words[0]} does not return nvmlReturn_t")
            rows.append(Row(number, words[0], words[1:], params[words[0]]))
        number += 1
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise GenError(f"{path.name} names a function twice")
    return rows


def emit_guest_passthrough(rows: list[Row]) -> str:
    out = [HEADER, '#include "guest/nvml/passthrough.h"', "", 'extern "C" {', ""]
    for r in rows:
        out.append(f"nvmlReturn_t {r.name}({', '.join(p.text for p in r.params)}) {{")
        out.append(f'  ivcuda::nvml::Passthrough q({r.number}, "{r.name}");')
        if not r.system:
            out.append(f"  q.device({r.params[0].name});")
        for p in r.body:
            k = r.kind(p)
            if k == "count":
                continue
            if k == "items":
                count = r.arrays[p.name]
                call = "items" if r.names[count].pointer else "items_sized"
                out.append(f"  q.{call}({p.name}, {count});")
            elif k == "more_items":
                out.append(f"  q.more_items({p.name});")
            elif k in ("text", "raw", "chars", "struct_in"):
                extra = {"text": r.strings, "raw": r.raw, "chars": r.chars, "struct_in": r.struct_in}[k][p.name]
                out.append(f"  q.{'out' if k == 'struct_in' else k}({p.name}, {extra});")
            else:
                out.append(f"  q.{k}({p.name});")
        out.append("  return q.run();")
        out.append("}")
        out.append("")
    out.append('}  // extern "C"')
    return "\n".join(out) + "\n"


def emit_host_passthrough(rows: list[Row]) -> str:
    out = [HEADER,
           "// Included twice: by nvml_api.h for the declarations, by nvml_passthrough.cc for the calls.",
           "#ifndef IVCUDA_NVML_PASSTHROUGH_DECLS", "#define IVCUDA_NVML_PASSTHROUGH_DECLS",
           "// The host's NVML functions the pass-through rows call (NvmlApi members, nvml_api.h).",
           "#define IVCUDA_NVML_PASSTHROUGH(X) \\"]
    out += [f"  X({r.name}) \\" for r in rows]
    out += ["", f"inline constexpr std::uint32_t kPassthroughRows = {max((r.number for r in rows), default=-1) + 1};",
            "#endif", "", "#ifdef IVCUDA_NVML_PASSTHROUGH_CALLS",
            "// Row `row` of tools/nvml_passthrough.txt: -1 where that row is retired or unknown, else",
            "// 1 for a system query, 0 for a device query.",
            "inline int passthrough_kind(std::uint32_t row) {", "  switch (row) {"]
    out += [f"    case {r.number}: return {1 if r.system else 0};" for r in rows]
    out += ["    default: return -1;", "  }", "}", "",
            "// The call of row `row` with the guest's arguments (p) on device `h` (null for a system query).",
            "inline int passthrough_call(const NvmlApi& a, std::uint32_t row, nvmlDevice_t h, PassthroughCall& p) {",
            "  (void)h;", "  switch (row) {"]
    for r in rows:
        out.append(f"    case {r.number}: {{  // {r.name}")
        out.append(f"      if (a.{r.name} == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;")
        for p in r.body:
            k = r.kind(p)
            if k == "count":
                continue  # a list's count, a text's length, a buffer's size: taken where its buffer is
            if k in ("items", "more_items"):
                count = r.arrays[p.name]
                if k == "items":
                    cp = r.names[count]
                    out.append(f"      {cp.base} v_{count} = static_cast<{cp.base}>(p.capacity());")
                out.append(f"      {p.base}* v_{p.name} = p.items<{p.base}>(v_{count}, {'true' if k == 'items' else 'false'});")
            elif k in ("text", "raw"):
                lp = r.names[(r.strings if k == "text" else r.raw)[p.name]]
                length = "text_length" if k == "text" else "raw_length"
                out.append(f"      {lp.base} v_{lp.name} = static_cast<{lp.base}>(p.{length}());")
                out.append(f"      {p.base}* v_{p.name} = reinterpret_cast<{p.base}*>(p.text(v_{lp.name}));")
            elif k == "chars":
                out.append(f"      char* v_{p.name} = p.text({r.chars[p.name]});")
            elif k == "struct_in":
                out.append(f"      {p.base}* v_{p.name} = p.out<{p.base}>({r.struct_in[p.name]});")
            elif k == "out":
                out.append(f"      {p.base}* v_{p.name} = p.out<{p.base}>();")
            else:
                out.append(f"      const auto v_{p.name} = p.in<{p.base}>();")
        # The call, in the prototype's order; a list's count passed by pointer is its local's address.
        args = [] if r.system else ["h"]
        for p in r.body:
            args.append(f"&v_{p.name}" if p.name in r.arrays.values() and p.pointer else f"v_{p.name}")
        out.append("      if (const int e = p.error(); e != NVML_SUCCESS) return e;")
        out.append(f"      const nvmlReturn_t st = a.{r.name}({', '.join(args)});")
        counts_by_ptr = [c for c in set(r.arrays.values()) if r.names[c].pointer]
        for c in counts_by_ptr:
            out.append(f"      p.set_count(v_{c});")
        out.append("      return st;")
        out.append("    }")
    out += ["    default: return NVML_ERROR_INVALID_ARGUMENT;", "  }", "}", "#endif"]
    return "\n".join(out) + "\n"



def emit_table(rows: dict[str, str]) -> str:
    return HEADER + "".join(f"IVCUDA_NVML_ROW({n}, {d})\n" for n, d in rows.items())


def emit_stubs(rows: dict[str, str]) -> str:
    out = [HEADER,
           "// The default answer of every NVML function nothing in guest/nvml/ defines. `int f(void)`",
           "// is correct on x86-64 and aarch64 whatever the real prototype: the callee ignores its",
           "// arguments and returns nvmlReturn_t (an int) in the integer register.",
           "namespace ivcuda::nvml {",
           "int default_answer(int code, const char* name) noexcept;",
           "}  // namespace ivcuda::nvml",
           "",
           "#define IVCUDA_NVML_STUB(name, code) \\",
           '  extern "C" __attribute__((weak)) int name(void) { return ivcuda::nvml::default_answer(code, #name); }',
           "",
           "// NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NO_PERMISSION = 4 (nvml.h).",
           ]
    codes = {"NotSupported": 3, "NoPermission": 4}
    for n, d in rows.items():
        if d in codes:
            out.append(f"IVCUDA_NVML_STUB({n}, {codes[d]})")
    return "\n".join(out) + "\n"


def emit_map(rows: dict[str, str]) -> str:
    return version_script("gen_nvml_api.py", "libnvidia-ml.so.1", "NVML", rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvml-h", required=True, type=Path)
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    ap.add_argument("--list", action="store_true", help="print name and default, one a line")
    ap.add_argument("--passthrough", type=Path, help="tools/nvml_passthrough.txt")
    ap.add_argument("--host", action="store_true", help="only the worker's side of --passthrough")
    args = ap.parse_args(argv)
    try:
        if not args.nvml_h.is_file():
            raise GenError(f"{args.nvml_h} not found (tools/fetch-nvml-header.sh)")
        params: dict[str, str] = {}
        rows = build(args.nvml_h, args.cc, params)
        passthrough = read_passthrough(args.passthrough, params, {n: "nvmlReturn_t" for n in rows}) \
            if args.passthrough else []
        if args.host:
            write_outputs(args.out_dir, {"nvml_passthrough_host.inc": emit_host_passthrough(passthrough)})
            return 0
        if args.list:
            for n, d in rows.items():
                print(n, d)
            return 0
        outputs = {"nvml_api_table.inc": emit_table(rows), "nvml_stubs.cc": emit_stubs(rows),
                   "nvml_exports.map": emit_map(rows)}
        if args.passthrough:
            outputs["nvml_passthrough.cc"] = emit_guest_passthrough(passthrough)
        write_outputs(args.out_dir, outputs)
    except (GenError, OSError) as e:
        print(f"gen_nvml_api.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
