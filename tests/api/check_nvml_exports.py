#!/usr/bin/env python3
"""The guest's libnvidia-ml.so.1 exports exactly the functions of nvml.h, both ABI generations.

usage: check_nvml_exports.py libnvidia-ml.so.1 nvml.h

The header is read here by text, apart from tools/gen_nvml_api.py (which preprocesses it):
every `nvmlX(` on a line with DECLDIR is a function NVIDIA's library exports, the legacy
names of the NVML_NO_UNVERSIONED_FUNC_DEFS block included. Then the functions guest/nvml/
answers itself (forwarded to ivcudad or answered in the guest) must be real definitions (nm
type T), not the generated weak defaults (W), and the defaults must be weak.
"""
import re
import shutil
import subprocess
import sys

# Forwarded (one per nvml_wire::NvmlFn) and answered in the guest: a default stub in their
# place would answer NOT_SUPPORTED where the issue promises an answer.
IMPLEMENTED = """
nvmlInit nvmlInit_v2 nvmlInitWithFlags nvmlShutdown nvmlErrorString
nvmlSystemGetDriverVersion nvmlSystemGetNVMLVersion nvmlSystemGetCudaDriverVersion
nvmlSystemGetCudaDriverVersion_v2 nvmlUnitGetCount
nvmlDeviceGetCount nvmlDeviceGetCount_v2 nvmlDeviceGetHandleByIndex nvmlDeviceGetHandleByIndex_v2
nvmlDeviceGetHandleByUUID nvmlDeviceGetHandleBySerial nvmlDeviceGetHandleByPciBusId
nvmlDeviceGetHandleByPciBusId_v2 nvmlDeviceGetIndex nvmlDeviceIsMigDeviceHandle
nvmlDeviceGetName nvmlDeviceGetUUID nvmlDeviceGetSerial nvmlDeviceGetBoardPartNumber
nvmlDeviceGetVbiosVersion nvmlDeviceGetInforomImageVersion
nvmlDeviceGetPciInfo nvmlDeviceGetPciInfo_v2 nvmlDeviceGetPciInfo_v3 nvmlDeviceGetMinorNumber
nvmlDeviceGetArchitecture nvmlDeviceGetCudaComputeCapability nvmlDeviceGetBrand nvmlDeviceGetBoardId
nvmlDeviceGetMultiGpuBoard nvmlDeviceGetMemoryInfo nvmlDeviceGetMemoryInfo_v2 nvmlDeviceGetBAR1MemoryInfo
nvmlDeviceGetUtilizationRates nvmlDeviceGetEncoderUtilization nvmlDeviceGetDecoderUtilization
nvmlDeviceGetTemperature nvmlDeviceGetTemperatureThreshold nvmlDeviceGetPowerUsage
nvmlDeviceGetPowerManagementLimit nvmlDeviceGetPowerManagementDefaultLimit
nvmlDeviceGetPowerManagementLimitConstraints nvmlDeviceGetEnforcedPowerLimit
nvmlDeviceGetTotalEnergyConsumption nvmlDeviceGetClockInfo nvmlDeviceGetMaxClockInfo nvmlDeviceGetClock
nvmlDeviceGetApplicationsClock nvmlDeviceGetDefaultApplicationsClock nvmlDeviceGetPerformanceState
nvmlDeviceGetPowerState nvmlDeviceGetFanSpeed nvmlDeviceGetFanSpeed_v2 nvmlDeviceGetNumFans
nvmlDeviceGetEccMode nvmlDeviceGetComputeMode nvmlDeviceGetMigMode nvmlDeviceGetPersistenceMode
nvmlDeviceGetDisplayMode nvmlDeviceGetDisplayActive nvmlDeviceGetCurrPcieLinkGeneration
nvmlDeviceGetCurrPcieLinkWidth nvmlDeviceGetMaxPcieLinkGeneration nvmlDeviceGetMaxPcieLinkWidth
nvmlDeviceGetPcieThroughput nvmlDeviceGetCurrentClocksEventReasons nvmlDeviceGetCurrentClocksThrottleReasons
nvmlDeviceGetComputeRunningProcesses nvmlDeviceGetComputeRunningProcesses_v2
nvmlDeviceGetComputeRunningProcesses_v3 nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses_v2 nvmlDeviceGetGraphicsRunningProcesses_v3
nvmlDeviceGetNvLinkState nvmlDeviceGetTopologyCommonAncestor nvmlDeviceGetP2PStatus
nvmlDeviceGetTotalEccErrors
nvmlEventSetCreate nvmlEventSetFree nvmlDeviceGetSupportedEventTypes nvmlDeviceRegisterEvents
nvmlEventSetWait nvmlEventSetWait_v2
""".split()


def header_functions(path):
    names = set()
    with open(path, errors="replace") as f:
        for line in f:
            if "DECLDIR" in line and not line.lstrip().startswith(("#", "*", "//")):
                names.update(re.findall(r"\b(nvml\w+)\s*\(", line))
    return names


def main():
    lib, header = sys.argv[1:3]
    if shutil.which("nm") is None:
        print("SKIPPED: nm (binutils) is not installed")
        return 0
    res = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"check_nvml_exports: nm failed on {lib}: {res.stderr}")
    kinds = {f[2]: f[1] for f in (l.split() for l in res.stdout.splitlines()) if len(f) >= 3}
    want = header_functions(header)
    bad = 0
    print(f"{lib}: {len(kinds)} exported, nvml.h declares {len(want)}")
    for name in sorted(set(kinds) - want):
        print(f"EXTRA   {name}")
        bad += 1
    for name in sorted(want - set(kinds)):
        print(f"MISSING {name}")
        bad += 1
    for name in IMPLEMENTED:
        if name not in want:
            print(f"STALE   {name}: listed as implemented, not in nvml.h")
            bad += 1
        elif kinds.get(name) != "T":
            print(f"DEFAULT {name}: should be implemented in guest/nvml/, is nm type {kinds.get(name)}")
            bad += 1
    strong = sorted(n for n, k in kinds.items() if k == "T")
    print(f"implemented: {len(strong)}, generated defaults: {sum(1 for k in kinds.values() if k == 'W')}")
    for name in strong:
        if name not in IMPLEMENTED:
            print(f"note: {name} is implemented but not listed here")
    return 1 if bad or not want else 0


if __name__ == "__main__":
    sys.exit(main())
