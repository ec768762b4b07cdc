#!/usr/bin/env python3
"""Generate the guest libnvidia-ml.so.1's export table from NVIDIA's nvml.h.

usage: gen_nvml_api.py --nvml-h PATH --out-dir DIR [--cc CC]

Outputs (build tree only):
  nvml_api_table.inc  IVCUDA_NVML_ROW(name, default), one row per export, sorted by name;
                      default is NotSupported, NoPermission or None (nvmlErrorString, which
                      returns a string and must be written by hand)
  nvml_stubs.cc       a weak `extern "C" int name(void)` per nvmlReturn_t function answering its
                      default through ivcuda::nvml::default_answer() (UNINITIALIZED before nvmlInit)
  nvml_exports.map    linker version script: exactly the table global, everything else local

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
"""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

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


class GenError(Exception):
    pass


def preprocess(nvml_h: Path, cc: str) -> str:
    res = subprocess.run([cc, "-E", "-P", "-x", "c", "-DNVML_NO_UNVERSIONED_FUNC_DEFS", str(nvml_h)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise GenError(f"{cc} -E failed on {nvml_h}: {res.stderr.strip()}")
    return res.stdout


def top_level_statements(text: str) -> list[str]:
    """Statements outside braces (struct and union bodies are dropped)."""
    text = re.sub(r"\s+", " ", text)
    depth, out = 0, []
    for ch in text:
        if ch == "{":
            depth += 1
            out.append(";")
        elif ch == "}":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    if depth != 0:
        raise GenError("unbalanced braces in the preprocessed header")
    return [s.strip() for s in "".join(out).split(";")]


def declarations(text: str) -> dict[str, str]:
    """name -> return type of every function nvml.h declares."""
    decls = {}
    for st in top_level_statements(text):
        st = st.replace('extern "C"', "").strip()
        if not st or st.startswith("typedef"):
            continue
        m = re.fullmatch(r"((?:const )?\w+(?: ?\*)?) ?(nvml\w+) ?\((.*)\)", st)
        if m is None:
            if re.search(r"\bnvml\w+ ?\(", st):
                raise GenError(f"cannot parse a declaration: {st[:160]}")
            continue
        ret, name = m.group(1).replace(" ", ""), m.group(2)
        if name in decls:
            raise GenError(f"{name} declared twice")
        decls[name] = ret
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


def build(nvml_h: Path, cc: str) -> dict[str, str]:
    raw = nvml_h.read_text(errors="replace")
    decls = declarations(preprocess(nvml_h, cc))
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


def emit_table(rows: dict[str, str]) -> str:
    return HEADER + "".join(f"IVCUDA_NVML_ROW({n}, {d})\n" for n, d in rows.items())


def emit_stubs(rows: dict[str, str]) -> str:
    out = [HEADER,
           "// The default answer of every NVML function nothing in guest/nvml/ defines. `int f(void)`",
           "// is correct on x86-64 and aarch64 whatever the real prototype: the callee ignores its",
           "// arguments and returns nvmlReturn_t (an int) in the integer register.",
           "namespace ivcuda::nvml {",
           "int default_answer(int code) noexcept;",
           "}  // namespace ivcuda::nvml",
           "",
           "#define IVCUDA_NVML_STUB(name, code) \\",
           '  extern "C" __attribute__((weak)) int name(void) { return ivcuda::nvml::default_answer(code); }',
           "",
           "// NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NO_PERMISSION = 4 (nvml.h).",
           ]
    codes = {"NotSupported": 3, "NoPermission": 4}
    for n, d in rows.items():
        if d in codes:
            out.append(f"IVCUDA_NVML_STUB({n}, {codes[d]})")
    return "\n".join(out) + "\n"


def emit_map(rows: dict[str, str]) -> str:
    out = ["/* Generated by tools/gen_nvml_api.py. Do not edit. */",
           "/* Unversioned, as NVIDIA's libnvidia-ml.so.1: export NVML and nothing else. */",
           "{", "  global:"]
    out += [f"    {n};" for n in rows]
    out += ["  local:", "    *;", "};"]
    return "\n".join(out) + "\n"


def write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvml-h", required=True, type=Path)
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    ap.add_argument("--list", action="store_true", help="print name and default, one a line")
    args = ap.parse_args(argv)
    try:
        if not args.nvml_h.is_file():
            raise GenError(f"{args.nvml_h} not found (tools/fetch-nvml-header.sh)")
        rows = build(args.nvml_h, args.cc)
        if args.list:
            for n, d in rows.items():
                print(n, d)
            return 0
        args.out_dir.mkdir(parents=True, exist_ok=True)
        write_if_changed(args.out_dir / "nvml_api_table.inc", emit_table(rows))
        write_if_changed(args.out_dir / "nvml_stubs.cc", emit_stubs(rows))
        write_if_changed(args.out_dir / "nvml_exports.map", emit_map(rows))
    except (GenError, OSError) as e:
        print(f"gen_nvml_api.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
