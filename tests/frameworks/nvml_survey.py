"""NVML's long tail: every device query pynvml offers, natively and through ivcuda.

  nvml_survey.py dump OUT.json       asks the NVML this process loads (natively: the host's;
                                     with ivcuda's lib/ on LD_LIBRARY_PATH: the guest's)
  nvml_survey.py compare NATIVE1.json NATIVE2.json GUEST.json
                                     one line per query that differs; exit status 1 if any does

What is asked: every pynvml function nvmlDeviceGet* that takes the device handle alone (found by
its signature, so a newer nvidia-ml-py brings its new getters in), the system queries, and the
queries with arguments that nvitop, gpustat, a DCGM-style exporter, PyTorch and XLA make (clocks
by type, temperatures and thresholds, PCIe counters, NVLink links, ECC counters by type, field
values, samples, affinity within a scope).

How it is judged, per query:
  - the return code through ivcuda must be the host's (success where the host succeeds, the same
    error where it fails), except where NVML answers for a privilege a guest never has
    (setters are not asked here at all);
  - the value must be the host's where it is stable (the same in two native runs a moment
    apart) and does not describe a tenant (memory figures and process lists are the guest's own
    view by design: docs/design.md, "NVML for guests").
"""
import ctypes
import inspect
import json
import sys

# Queries whose value is the tenant's view, not the GPU's: compared by return code only.
TENANT_VIEW = {
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetAccountingPids",
    "nvmlDeviceGetRunningProcessDetailList",
}
# Where ivcuda answers differently by design, and why (printed, not counted).
KNOWN = {
    "nvmlDeviceGetSupportedEventTypes": "events are answered in the guest: a device with no event types",
    "nvmlDeviceGetUnrepairableMemoryFlag_v1": "newer than CUDA 13.0's nvml.h, which the guest's library is built from",
    "nvmlDeviceGetGridLicensableFeatures": "vGPU licensing, meaningless in a guest: NOT_SUPPORTED (tools/nvml_passthrough.txt)",
    "nvmlDeviceGetGridLicensableFeatures_v4": "vGPU licensing, meaningless in a guest: NOT_SUPPORTED (tools/nvml_passthrough.txt)",
}
# One-argument getters not asked: they act (clear, reset) or never return on a quiet GPU.
SKIP = {"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleBySerial",
        "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByUUIDV"}


def plain(v, depth=0):
    """A pynvml answer as JSON: structures by field, arrays as lists, bytes as text."""
    if depth > 6:
        return "..."
    if isinstance(v, bytes):
        return v.decode(errors="replace").rstrip("\0")
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x, depth + 1) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x, depth + 1) for k, x in v.items()}
    if isinstance(v, ctypes.Array):
        return [plain(x, depth + 1) for x in v]
    if isinstance(v, (ctypes.Structure, ctypes.Union)):
        out = {}
        for f in v._fields_:
            name = f[0]
            try:
                out[name] = plain(getattr(v, name), depth + 1)
            except Exception as e:  # a union member that cannot be read as itself
                out[name] = f"<{type(e).__name__}>"
        return out
    if isinstance(v, ctypes._SimpleCData):
        return plain(v.value, depth + 1)
    if hasattr(v, "__dict__"):
        return {k: plain(x, depth + 1) for k, x in vars(v).items() if not k.startswith("_")}
    return repr(v)


def ask(pynvml, fn, *args):
    try:
        return {"ret": 0, "value": plain(fn(*args))}
    except pynvml.NVMLError as e:
        return {"ret": int(e.value)}
    except Exception as e:  # a pynvml wrapper that fails in Python (e.g. a missing symbol)
        return {"ret": f"python:{type(e).__name__}"}


def argument_queries(pynvml):
    """(label, function name, args after the handle) for the queries that take arguments."""
    c = pynvml
    q = []
    def add(fn, *args, label=None):
        q.append((label or f"{fn}{list(args)}", fn, args))
    for t in ("NVML_CLOCK_GRAPHICS", "NVML_CLOCK_SM", "NVML_CLOCK_MEM", "NVML_CLOCK_VIDEO"):
        v = getattr(c, t)
        for fn in ("nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetApplicationsClock",
                   "nvmlDeviceGetDefaultApplicationsClock", "nvmlDeviceGetMaxCustomerBoostClock"):
            add(fn, v, label=f"{fn}({t})")
        for cid in ("NVML_CLOCK_ID_CURRENT", "NVML_CLOCK_ID_APP_CLOCK_TARGET", "NVML_CLOCK_ID_APP_CLOCK_DEFAULT",
                    "NVML_CLOCK_ID_CUSTOMER_BOOST_MAX"):
            add("nvmlDeviceGetClock", v, getattr(c, cid), label=f"nvmlDeviceGetClock({t},{cid})")
    for s in ("NVML_TEMPERATURE_GPU",):
        add("nvmlDeviceGetTemperature", getattr(c, s), label=f"nvmlDeviceGetTemperature({s})")
    for name in dir(c):
        if name.startswith("NVML_TEMPERATURE_THRESHOLD_") and name != "NVML_TEMPERATURE_THRESHOLD_COUNT":
            add("nvmlDeviceGetTemperatureThreshold", getattr(c, name),
                label=f"nvmlDeviceGetTemperatureThreshold({name})")
    for name in ("NVML_PCIE_UTIL_TX_BYTES", "NVML_PCIE_UTIL_RX_BYTES"):
        add("nvmlDeviceGetPcieThroughput", getattr(c, name), label=f"nvmlDeviceGetPcieThroughput({name})")
    for link in range(0, 19):
        for fn in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkVersion", "nvmlDeviceGetNvLinkRemotePciInfo",
                   "nvmlDeviceGetNvLinkRemoteDeviceType"):
            add(fn, link)
        add("nvmlDeviceGetNvLinkCapability", link, 0)
    for et in ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"):
        for ct in ("NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"):
            add("nvmlDeviceGetTotalEccErrors", getattr(c, et), getattr(c, ct),
                label=f"nvmlDeviceGetTotalEccErrors({et},{ct})")
            for loc in ("NVML_MEMORY_LOCATION_DRAM", "NVML_MEMORY_LOCATION_L1_CACHE", "NVML_MEMORY_LOCATION_L2_CACHE",
                        "NVML_MEMORY_LOCATION_DEVICE_MEMORY", "NVML_MEMORY_LOCATION_REGISTER_FILE",
                        "NVML_MEMORY_LOCATION_SRAM"):
                if hasattr(c, loc):
                    add("nvmlDeviceGetMemoryErrorCounter", getattr(c, et), getattr(c, ct), getattr(c, loc),
                        label=f"nvmlDeviceGetMemoryErrorCounter({et},{ct},{loc})")
    for cause in ("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
                  "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"):
        add("nvmlDeviceGetRetiredPages", getattr(c, cause), label=f"nvmlDeviceGetRetiredPages({cause})")
    for p in ("NVML_PERF_POLICY_POWER", "NVML_PERF_POLICY_THERMAL", "NVML_PERF_POLICY_SYNC_BOOST"):
        add("nvmlDeviceGetViolationStatus", getattr(c, p), label=f"nvmlDeviceGetViolationStatus({p})")
    add("nvmlDeviceGetCpuAffinity", 4)
    add("nvmlDeviceGetCpuAffinityWithinScope", 4, c.NVML_AFFINITY_SCOPE_NODE, label="CpuAffinityWithinScope(NODE)")
    add("nvmlDeviceGetCpuAffinityWithinScope", 4, c.NVML_AFFINITY_SCOPE_SOCKET, label="CpuAffinityWithinScope(SOCKET)")
    add("nvmlDeviceGetMemoryAffinity", 4, c.NVML_AFFINITY_SCOPE_NODE, label="MemoryAffinity(NODE)")
    add("nvmlDeviceGetSamples", c.NVML_GPU_UTILIZATION_SAMPLES, 0, label="Samples(GPU_UTILIZATION)")
    add("nvmlDeviceGetSamples", c.NVML_TOTAL_POWER_SAMPLES, 0, label="Samples(TOTAL_POWER)")
    add("nvmlDeviceGetProcessUtilization", 0)
    add("nvmlDeviceGetEncoderCapacity", c.NVML_ENCODER_QUERY_H264, label="EncoderCapacity(H264)")
    add("nvmlDeviceGetFanSpeed_v2", 0)
    add("nvmlDeviceGetTargetFanSpeed", 0)
    add("nvmlDeviceGetInforomVersion", c.NVML_INFOROM_OEM, label="InforomVersion(OEM)")
    add("nvmlDeviceGetInforomVersion", c.NVML_INFOROM_ECC, label="InforomVersion(ECC)")
    add("nvmlDeviceGetInforomVersion", c.NVML_INFOROM_POWER, label="InforomVersion(POWER)")
    add("nvmlDeviceGetMinMaxClockOfPState", c.NVML_CLOCK_GRAPHICS, 0, label="MinMaxClockOfPState(GRAPHICS,P0)")
    add("nvmlDeviceGetSupportedGraphicsClocks", 0, label="SupportedGraphicsClocks(first memory clock)")
    add("nvmlDeviceGetGpuInstanceProfileInfo", 0)
    add("nvmlDeviceGetEncoderSessions")
    add("nvmlDeviceGetFBCSessions")
    # Field values as a DCGM-style exporter asks them (what exists in this nvidia-ml-py).
    fields = [getattr(c, n) for n in (
        "NVML_FI_DEV_ECC_CURRENT", "NVML_FI_DEV_ECC_PENDING", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
        "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "NVML_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "NVML_FI_DEV_PCIE_REPLAY_COUNTER", "NVML_FI_DEV_NVLINK_LINK_COUNT", "NVML_FI_DEV_RETIRED_SBE",
        "NVML_FI_DEV_RETIRED_DBE", "NVML_FI_DEV_RETIRED_PENDING", "NVML_FI_DEV_REMAPPED_COR",
        "NVML_FI_DEV_REMAPPED_UNC", "NVML_FI_DEV_REMAPPED_PENDING", "NVML_FI_DEV_REMAPPED_FAILURE",
        "NVML_FI_DEV_PCIE_LINK_GEN_CURRENT" if hasattr(c, "NVML_FI_DEV_PCIE_LINK_GEN_CURRENT") else "NVML_FI_DEV_ECC_CURRENT",
        "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
        "NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_POWER_AVERAGE") if hasattr(c, n)]
    q.append(("nvmlDeviceGetFieldValues(DCGM-style set)", "nvmlDeviceGetFieldValues", (fields,)))
    return q


def dump(path):
    import pynvml

    pynvml.nvmlInit()
    out = {"system": {}, "devices": []}
    for fn in ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion",
               "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetHicVersion", "nvmlUnitGetCount",
               "nvmlSystemGetConfComputeState", "nvmlSystemGetConfComputeCapabilities",
               "nvmlSystemGetNvlinkBwMode", "nvmlSystemGetConfComputeSettings"):
        if hasattr(pynvml, fn):
            out["system"][fn] = ask(pynvml, getattr(pynvml, fn))
    if hasattr(pynvml, "nvmlSystemGetTopologyGpuSet"):
        out["system"]["nvmlSystemGetTopologyGpuSet(0)"] = ask(pynvml, pynvml.nvmlSystemGetTopologyGpuSet, 0)
    one_arg = []
    for name in sorted(dir(pynvml)):
        if not name.startswith("nvmlDeviceGet") or name in SKIP:
            continue
        fn = getattr(pynvml, name)
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            continue
        required = [p for p in params if p.default is inspect.Parameter.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(required) == 1:
            one_arg.append(name)
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        d = {}
        for name in one_arg:
            d[name] = ask(pynvml, getattr(pynvml, name), h)
        for label, fn, args in argument_queries(pynvml):
            if hasattr(pynvml, fn):
                d[label] = ask(pynvml, getattr(pynvml, fn), h, *args)
        d["nvmlDeviceGetP2PStatus(self,READ)"] = ask(pynvml, pynvml.nvmlDeviceGetP2PStatus, h, h,
                                                     pynvml.NVML_P2P_CAPS_INDEX_READ)
        d["nvmlDeviceGetTopologyCommonAncestor(self)"] = ask(pynvml, pynvml.nvmlDeviceGetTopologyCommonAncestor, h, h)
        out["devices"].append(d)
    pynvml.nvmlShutdown()
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    answered = sum(1 for d in out["devices"] for a in d.values() if a["ret"] == 0)
    print(f"nvml_survey: {sum(len(d) for d in out['devices'])} device queries, {answered} answered, "
          f"{len(out['system'])} system queries")


def items(doc):
    for k, v in doc["system"].items():
        yield f"system {k}", k, v
    for i, d in enumerate(doc["devices"]):
        for k, v in d.items():
            yield f"gpu{i} {k}", k.split("(")[0].split("[")[0], v


def compare(native1, native2, guest):
    a, b, g = (json.load(open(p)) for p in (native1, native2, guest))
    second = {key: v for key, _, v in items(b)}
    mine = {key: v for key, _, v in items(g)}
    bad = checked = values = 0
    for key, fn, v in items(a):
        checked += 1
        got = mine.get(key)
        if got is None:
            print(f"DIFF {key}: not asked through ivcuda")
            bad += 1
            continue
        if fn in KNOWN and got != v:
            print(f"KNOWN {key}: host {v['ret']}, ivcuda {got['ret']}: {KNOWN[fn]}")
            continue
        if got["ret"] != v["ret"]:
            print(f"DIFF {key}: host answers {v['ret']}, ivcuda {got['ret']}")
            bad += 1
            continue
        stable = key in second and second[key] == v
        if v["ret"] == 0 and stable and fn not in TENANT_VIEW:
            values += 1
            if got.get("value") != v.get("value"):
                print(f"DIFF {key}: host {json.dumps(v.get('value'))[:300]}, ivcuda {json.dumps(got.get('value'))[:300]}")
                bad += 1
    print(f"nvml_survey: {checked} queries compared ({values} by value), {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "compare":
        sys.exit(compare(*sys.argv[2:5]))
    else:
        sys.exit(__doc__)
