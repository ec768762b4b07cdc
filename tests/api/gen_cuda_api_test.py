#!/usr/bin/env python3
"""tools/gen_cuda_api.py on small synthetic headers: what it emits, and what it refuses.

usage: gen_cuda_api_test.py GENERATOR CC
"""
import subprocess
import sys
import tempfile
from pathlib import Path

GEN, CC = sys.argv[1], sys.argv[2]

CUDA_H = """\
#ifndef CUDA_H
#define CUDA_H
#define CUDA_VERSION 13000
typedef enum cudaError_enum { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_SUPPORTED = 801 } CUresult;
#if defined(__CUDA_API_VERSION_INTERNAL)
#define __CUDA_API_PTDS(api) api ## _ptds
#else
#define __CUDA_API_PTDS(api) api
#endif
#define cuMemAlloc cuMemAlloc_v2
#define cuMemcpy __CUDA_API_PTDS(cuMemcpy)
CUresult cuInit(unsigned int flags);
CUresult cuMemAlloc(unsigned long long *p, unsigned long long n);
CUresult cuMemcpy(unsigned long long d, unsigned long long s, unsigned long long n);
#if defined(__CUDA_API_VERSION_INTERNAL)
#undef cuMemAlloc
#undef cuMemcpy
CUresult cuMemAlloc(unsigned int *p, unsigned int n);
CUresult cuMemcpy(unsigned long long d, unsigned long long s, unsigned long long n);
#endif
@EXTRA@
#endif
"""
TYPEDEFS_H = """\
typedef CUresult (*PFN_cuInit_v2000)(unsigned int);
typedef CUresult (*PFN_cuMemAlloc_v3020)(unsigned long long *, unsigned long long);
typedef CUresult (*PFN_cuMemcpy_v4000)(unsigned long long, unsigned long long, unsigned long long);
typedef CUresult (*PFN_cuMemcpy_v7000_ptds)(unsigned long long, unsigned long long, unsigned long long);
#if defined(__CUDA_API_VERSION_INTERNAL)
typedef CUresult (*PFN_cuMemAlloc_v2000)(unsigned int *, unsigned int);
#endif
@EXTRA@
"""
PROFILER_H = "#include <cuda.h>\nCUresult cuProfilerStart(void);\n"
PROFILER_TYPEDEFS_H = "typedef CUresult (*PFN_cuProfilerStart_v4000)(void);\n"

failures = 0


def run(extra_h="", extra_td=""):
    tmp = Path(tempfile.mkdtemp())
    inc, out = tmp / "include", tmp / "out"
    inc.mkdir()
    (inc / "cuda.h").write_text(CUDA_H.replace("@EXTRA@", extra_h))
    (inc / "cudaTypedefs.h").write_text(TYPEDEFS_H.replace("@EXTRA@", extra_td))
    (inc / "cudaProfiler.h").write_text(PROFILER_H)
    (inc / "cudaProfilerTypedefs.h").write_text(PROFILER_TYPEDEFS_H)
    res = subprocess.run([sys.executable, GEN, "--cuda-include", str(inc), "--out-dir", str(out),
                          "--cc", CC], capture_output=True, text=True)
    return res, out


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    failures += not cond


res, out = run()
check(res.returncode == 0, f"well-formed headers are accepted ({res.stderr.strip()})")
if res.returncode == 0:
    table = (out / "cuda_api_table.inc").read_text()
    for row in ("IVCUDA_API_ROW(cuInit, cuInit, 2000, 0)",
                "IVCUDA_API_ROW(cuMemAlloc, cuMemAlloc, 2000, 0)",
                "IVCUDA_API_ROW(cuMemAlloc_v2, cuMemAlloc, 3020, 0)",
                "IVCUDA_API_ROW(cuMemcpy_ptds, cuMemcpy, 7000, 1)",
                "IVCUDA_API_ROW(cuProfilerStart, cuProfilerStart, 4000, 0)"):
        check(row in table, f"table has {row}")
    check(table.count("IVCUDA_API_ROW(cu") == 6, "table has exactly 6 rows")
    emap = (out / "cuda_exports.map").read_text()
    check("cuMemcpy_ptds;" in emap and "local:" in emap, "version script lists the symbols")
    stubs = (out / "cuda_stubs.cc").read_text()
    check("IVCUDA_STUB(5, cuProfilerStart)" in stubs and "return 801;" in stubs,
          "stubs return CUDA_ERROR_NOT_SUPPORTED")
    check("cuda.h" not in stubs.split("*/")[-1].replace("must not\n// include cuda.h", ""),
          "stubs do not include cuda.h")
    proc = (out / "cuda_procaddress.inc").read_text()
    check('{"cuMemcpy", 0, 4000, 3},' in proc and '{"cuMemcpy", 1, 7000, 4},' in proc,
          "cuMemcpy has a default row and a per-thread row")

res, _ = run(extra_h="int cuBad(void);", extra_td="typedef CUresult (*PFN_cuBad_v13000)(void);")
check(res.returncode != 0 and "cuBad" in res.stderr, "a function not returning CUresult is refused")

res, _ = run(extra_h="CUresult cuNoTypedef(void);")
check(res.returncode != 0 and "cuNoTypedef" in res.stderr, "a function without a version is refused")

res, _ = run(extra_td="typedef CUresult (*PFN_cuInit_v13000)(unsigned int);")
check(res.returncode != 0 and "cuInit" in res.stderr,
      "typedef versions that do not pair with symbols are refused")

sys.exit(1 if failures else 0)
