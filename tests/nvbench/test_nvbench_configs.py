#!/usr/bin/env python3
"""Tests for nvbench-configs/: compare.py and its plot on hand-written files in NVBench's --json
layout (data/); run.sh's argument handling, failure messages and orchestration with stand-ins
for NVBench, ivcudad, nvidia-smi and ssh; the Python set's benchmarks against the C++ set's."""

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

# Importing compare.py must not leave a __pycache__ in the source tree.
sys.dont_write_bytecode = True

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIGS = os.path.join(ROOT, "nvbench-configs")
COMPARE = os.path.join(CONFIGS, "compare.py")
RUN_SH = os.path.join(CONFIGS, "run.sh")
FAKE = os.path.join(HERE, "fake_nvbench.py")
DATA = os.path.join(HERE, "data")
NATIVE = os.path.join(DATA, "native.json")
GUEST = os.path.join(DATA, "guest.json")
PROCESS = os.path.join(DATA, "process.json")
VFIO = os.path.join(DATA, "vfio.json")
FAKE_DAEMON = os.path.join(HERE, "fake_ivcudad.py")
# A python3 with matplotlib (CMake's IVCUDA_PLOT_PYTHON), for the plot tests.
PLOT_PYTHON = os.environ.get("IVCUDA_PLOT_PYTHON", "")

_spec = importlib.util.spec_from_file_location("nvbench_compare", COMPARE)
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


# compare.py's exit status when a state native measured is missing or skipped elsewhere, or
# nothing was measured by both: the hand-written files here are incomplete on purpose.
INCOMPLETE = 3


def run_compare(*args, python=sys.executable, env=None):
    return subprocess.run([python, COMPARE, *args], capture_output=True, text=True,
                          timeout=120, env=env)


def guest_view(row, label="guest"):
    """A row's metrics as {key: {"native", "guest", "ratio"}} for one run."""
    return {key: {"native": m["native"], "guest": m["runs"][label]["value"],
                  "ratio": m["runs"][label]["ratio"]} for key, m in row["metrics"].items()}


def by_state(result):
    return {(r["benchmark"], r["state"], r["occurrence"]): r for r in result["states"]}


class CompareMatching(unittest.TestCase):
    def setUp(self):
        self.result = compare.compare(compare.load(NATIVE), [("guest", compare.load(GUEST))])
        self.rows = by_state(self.result)

    def test_states_in_both_files_are_matched_by_benchmark_and_state_name(self):
        self.assertEqual(set(self.rows), {
            ("simple", "Device=0", 0),
            ("single_float64_axis", "Device=0 Duration=0", 0),
            ("single_float64_axis", "Device=0 Duration=0.0001", 0),
            ("copy_sweep_grid_shape", "Device=0 T=I32", 0),
        })

    def test_states_in_one_file_only_are_listed_per_side(self):
        self.assertEqual(self.result["native_only"], [
            {"benchmark": "single_float64_axis", "state": "Device=0 Duration=0.0002",
             "occurrence": 0}])
        self.assertEqual(self.result["only"]["guest"], [
            {"benchmark": "single_float64_axis", "state": "Device=0 Duration=0.0003",
             "occurrence": 0}])

    def test_values_are_read_from_string_encoded_float64(self):
        m = guest_view(self.rows[("simple", "Device=0", 0)])
        self.assertAlmostEqual(m["cold_gpu"]["native"], 0.001, delta=1e-15)
        self.assertAlmostEqual(m["cold_gpu"]["guest"], 0.001002, delta=1e-15)
        self.assertAlmostEqual(m["cold_cpu"]["native"], 0.00101, delta=1e-15)
        self.assertAlmostEqual(m["cold_cpu"]["guest"], 0.001035, delta=1e-15)
        self.assertAlmostEqual(m["batch_gpu"]["native"], 0.001, delta=1e-15)
        self.assertAlmostEqual(m["batch_gpu"]["guest"], 0.00125, delta=1e-15)

    def test_ratios_are_guest_over_native(self):
        m = guest_view(self.rows[("simple", "Device=0", 0)])
        self.assertAlmostEqual(m["cold_gpu"]["ratio"], 1.002, places=12)
        self.assertAlmostEqual(m["cold_cpu"]["ratio"], 1.035 / 1.01, places=12)
        self.assertAlmostEqual(m["batch_gpu"]["ratio"], 1.25, places=12)

    def test_overhead_per_task_is_guest_minus_native_cold_cpu_mean(self):
        self.assertAlmostEqual(self.rows[("simple", "Device=0", 0)]["overhead_per_task_s"]["guest"],
                               25e-6, places=12)
        self.assertAlmostEqual(
            self.rows[("single_float64_axis", "Device=0 Duration=0", 0)]["overhead_per_task_s"]["guest"],
            30e-6, places=12)

    def test_missing_and_non_finite_summaries_give_no_value_and_no_ratio(self):
        # Duration=0: no batch summary on either side.
        m0 = guest_view(self.rows[("single_float64_axis", "Device=0 Duration=0", 0)])
        self.assertEqual(m0["batch_gpu"], {"native": None, "guest": None, "ratio": None})
        # Duration=0.0001: guest batch summary missing, guest cold GPU mean is "nan".
        m1 = guest_view(self.rows[("single_float64_axis", "Device=0 Duration=0.0001", 0)])
        self.assertAlmostEqual(m1["batch_gpu"]["native"], 0.000102, delta=1e-15)
        self.assertIsNone(m1["batch_gpu"]["guest"])
        self.assertIsNone(m1["batch_gpu"]["ratio"])
        self.assertIsNone(m1["cold_gpu"]["guest"])
        self.assertIsNone(m1["cold_gpu"]["ratio"])
        self.assertAlmostEqual(m1["cold_cpu"]["ratio"], 158 / 108, places=12)

    def test_skipped_state_is_reported_with_its_reason_and_no_overhead(self):
        row = self.rows[("copy_sweep_grid_shape", "Device=0 T=I32", 0)]
        self.assertIsNone(row["native_skipped"])
        self.assertIn("skip_time", row["skipped"]["guest"])
        self.assertIsNone(row["overhead_per_task_s"]["guest"])
        self.assertIsNone(row["metrics"]["cold_cpu"]["runs"]["guest"]["value"])

    def test_bandwidth_is_read_and_compared(self):
        rows = by_state(compare.compare(compare.load(NATIVE), [("process", compare.load(PROCESS))]))
        bw = rows[("copy_sweep_grid_shape", "Device=0 T=I32", 0)]["metrics"]["bandwidth"]
        self.assertAlmostEqual(bw["native"], 2236962133333.3333, delta=1e-3)
        self.assertAlmostEqual(bw["runs"]["process"]["ratio"], 2.2e12 / 2236962133333.3333,
                               places=12)

    def test_several_runs_are_compared_with_native_each(self):
        result = compare.compare(compare.load(NATIVE), [("process", compare.load(PROCESS)),
                                                        ("guest", compare.load(GUEST)),
                                                        ("vfio", compare.load(VFIO))])
        self.assertEqual(result["labels"], ["process", "guest", "vfio"])
        rows = by_state(result)
        simple = rows[("simple", "Device=0", 0)]
        self.assertEqual(set(simple["metrics"]["cold_gpu"]["runs"]), {"process", "guest", "vfio"})
        self.assertAlmostEqual(simple["overhead_per_task_s"]["process"], 2e-6, places=12)
        self.assertAlmostEqual(simple["overhead_per_task_s"]["vfio"], 1e-6, places=12)
        # A state that a run lacks has no entry for that run, and is not "only in native".
        d1 = rows[("single_float64_axis", "Device=0 Duration=0.0001", 0)]
        self.assertEqual(set(d1["metrics"]["cold_cpu"]["runs"]), {"guest"})
        self.assertEqual(result["native_only"], [
            {"benchmark": "single_float64_axis", "state": "Device=0 Duration=0.0002",
             "occurrence": 0}])
        self.assertEqual(result["only"]["process"], [])

    def test_repeated_benchmark_runs_are_matched_in_order(self):
        records = compare.load(os.path.join(DATA, "repeated.json"))
        self.assertEqual([(r["state"], r["occurrence"]) for r in records],
                         [("Device=0", 0), ("Device=0", 1)])
        rows = by_state(compare.compare(records, [("guest", records)]))
        self.assertAlmostEqual(rows[("simple", "Device=0", 1)]["metrics"]["cold_cpu"]["native"],
                               0.003, delta=1e-15)

    def test_a_state_without_summaries_written_as_null_is_accepted(self):
        records = compare.load(GUEST)
        copy = [r for r in records if r["benchmark"] == "copy_sweep_grid_shape"]
        self.assertEqual(len(copy), 1)
        self.assertEqual(copy[0]["values"], {})


class CompareCommandLine(unittest.TestCase):
    def test_prints_every_metric_ratio_and_overhead(self):
        p = run_compare(NATIVE, GUEST)
        self.assertEqual(p.returncode, INCOMPLETE, p.stderr)  # data/guest.json lacks a state
        out = p.stdout
        self.assertIn("simple [Device=0]", out)
        lines = out.splitlines()
        start = lines.index("simple [Device=0]")
        block = "\n".join(lines[start:start + 6])
        self.assertRegex(block, r"cold GPU time\s+1000\.000 us\s+1002\.000 us\s+1\.002")
        self.assertRegex(block, r"cold CPU time\s+1010\.000 us\s+1035\.000 us\s+1\.025")
        self.assertRegex(block, r"batch GPU time\s+1000\.000 us\s+1250\.000 us\s+1\.250")
        self.assertIn("overhead per task (guest - native cold CPU mean): +25.000 us", block)

    def test_missing_values_print_a_dash(self):
        out = run_compare(NATIVE, GUEST).stdout
        lines = out.splitlines()
        start = lines.index("single_float64_axis [Device=0 Duration=0.0001]")
        block = lines[start:start + 6]
        self.assertRegex(block[2], r"cold GPU time\s+104\.000 us\s+-\s+-$")
        self.assertRegex(block[4], r"batch GPU time\s+102\.000 us\s+-\s+-$")

    def test_one_sided_states_and_skips_are_listed(self):
        out = run_compare(NATIVE, GUEST).stdout
        self.assertRegex(out, r"only in the native run \(1\):\n  single_float64_axis "
                              r"\[Device=0 Duration=0\.0002\]")
        self.assertRegex(out, r"only in the guest run \(1\):\n  single_float64_axis "
                              r"\[Device=0 Duration=0\.0003\]")
        self.assertIn("guest run skipped this state: Warmup time did not meet", out)

    def test_json_output_holds_the_comparison_in_seconds(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "cmp.json")
            p = run_compare("--json", out, NATIVE, GUEST)
            self.assertEqual(p.returncode, INCOMPLETE, p.stderr)
            with open(out, encoding="utf-8") as f:
                doc = json.load(f)
        self.assertEqual(doc["native"], NATIVE)
        self.assertEqual(doc["runs"], {"guest": GUEST})
        rows = by_state(doc)
        self.assertAlmostEqual(rows[("simple", "Device=0", 0)]["overhead_per_task_s"]["guest"],
                               25e-6, places=12)
        self.assertIsNone(rows[("single_float64_axis", "Device=0 Duration=0", 0)]
                          ["metrics"]["batch_gpu"]["runs"]["guest"]["ratio"])
        self.assertEqual(len(doc["native_only"]), 1)
        self.assertEqual(len(doc["only"]["guest"]), 1)

    def test_unwritable_json_output_exits_one(self):
        p = run_compare("--json", os.path.join(DATA, "no-such-dir", "x.json"), NATIVE, GUEST)
        self.assertEqual(p.returncode, 1)
        self.assertIn("cannot write", p.stderr)

    def test_malformed_files_are_rejected_with_exit_status_two(self):
        cases = {
            "malformed_truncated.json": "not valid JSON",
            "malformed_no_benchmarks.json": "no 'benchmarks' list",
            "malformed_bad_value.json": "value 'fast' is not a number",
            "malformed_string_type.json": "value has type 'string'",
            "malformed_state_summaries.json": "'summaries' is not a list",
            "malformed_old_layout.json": "before 1.0",
            "malformed_json_v2.json": "format 2.x is not supported",
        }
        for name, message in cases.items():
            for args in ((NATIVE, os.path.join(DATA, name)), (os.path.join(DATA, name), GUEST)):
                with self.subTest(file=name, args=args):
                    p = run_compare(*args)
                    self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                    self.assertIn(name, p.stderr)
                    self.assertIn(message, p.stderr)
                    self.assertEqual(p.stdout, "")

    def test_unreadable_file_exits_two(self):
        p = run_compare(NATIVE, os.path.join(DATA, "does-not-exist.json"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("cannot read", p.stderr)

    def test_wrong_argument_count_exits_two_with_usage(self):
        p = run_compare(NATIVE)
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage:", p.stderr)

    def test_labelled_runs_get_a_column_each(self):
        p = run_compare(NATIVE, "process=" + PROCESS, "guest=" + GUEST, "vfio=" + VFIO)
        self.assertEqual(p.returncode, INCOMPLETE, p.stderr)
        lines = p.stdout.splitlines()
        start = lines.index("simple [Device=0]")
        self.assertRegex(lines[start + 1], r"native\s+process\s+process/native\s+guest\s+"
                                           r"guest/native\s+vfio\s+vfio/native$")
        self.assertRegex(lines[start + 2], r"cold GPU time\s+1000\.000 us\s+1001\.000 us\s+1\.001\s+"
                                           r"1002\.000 us\s+1\.002\s+1000\.000 us\s+1\.000$")
        self.assertIn("overhead per task (process - native cold CPU mean): +2.000 us", p.stdout)
        self.assertIn("overhead per task (vfio - native cold CPU mean): +1.000 us", p.stdout)
        copy = lines.index("copy_sweep_grid_shape [Device=0 T=I32]")
        self.assertRegex("\n".join(lines[copy:copy + 8]),
                         r"bandwidth\s+2236\.962 GB/s\s+2200\.000 GB/s\s+0\.983")

    def test_unlabelled_runs_are_named_by_their_files(self):
        p = run_compare(NATIVE, PROCESS, VFIO)
        self.assertEqual(p.returncode, INCOMPLETE, p.stderr)
        self.assertIn("overhead per task (process - native cold CPU mean)", p.stdout)
        self.assertIn("overhead per task (vfio - native cold CPU mean)", p.stdout)

    def test_a_label_twice_or_native_is_bad_usage(self):
        for args in (("guest=" + GUEST, "guest=" + PROCESS), ("native=" + GUEST,)):
            with self.subTest(args=args):
                p = run_compare(NATIVE, *args)
                self.assertEqual(p.returncode, 2)
                self.assertIn("its own label", p.stderr)


class CompareCompleteness(unittest.TestCase):
    """A comparison passes only when every state native measured was measured by every run."""

    def write(self, tmp, name, benchmarks):
        path = os.path.join(tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"benchmarks": benchmarks}, f)
        return path

    @staticmethod
    def state(name, skipped=False, mean="0.001"):
        summaries = [{"tag": "nv/cold/time/gpu/mean",
                      "data": [{"name": "value", "type": "float64", "value": mean}]}]
        return {"name": name, "is_skipped": skipped,
                "skip_reason": "skipped on purpose" if skipped else "", "summaries": summaries}

    def test_a_run_that_measured_every_state_exits_zero(self):
        p = run_compare(NATIVE, "again=" + NATIVE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertNotIn("comparison incomplete", p.stdout)

    def test_a_state_missing_from_a_run_exits_three_naming_it(self):
        p = run_compare(NATIVE, GUEST)
        self.assertEqual(p.returncode, INCOMPLETE)
        self.assertIn("single_float64_axis [Device=0 Duration=0.0002]: measured natively, missing from "
                      "the guest run", p.stdout)
        self.assertIn("the comparison is incomplete", p.stderr)

    def test_a_state_skipped_by_a_run_exits_three(self):
        p = run_compare(NATIVE, GUEST)
        self.assertIn("copy_sweep_grid_shape [Device=0 T=I32]: measured natively, skipped by the guest "
                      "run (Warmup time did not meet", p.stdout)

    def test_a_state_native_skipped_too_is_no_fault_of_the_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            both = [{"name": "b", "states": [self.state("Device=0 N=1"), self.state("Device=0 N=2", True)]}]
            nat = self.write(tmp, "native.json", both)
            run = self.write(tmp, "run.json", both)
            p = run_compare(nat, "process=" + run)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_a_run_without_benchmarks_or_with_every_state_skipped_exits_three(self):
        # The audit's E3: both exited 0 before.
        with tempfile.TemporaryDirectory() as tmp:
            nat = self.write(tmp, "native.json", [{"name": "b", "states": [self.state("Device=0 N=1")]}])
            empty = self.write(tmp, "empty.json", [])
            skipped = self.write(tmp, "skipped.json", [{"name": "b", "states": [self.state("Device=0 N=1", True)]}])
            for run in (empty, skipped):
                with self.subTest(run=os.path.basename(run)):
                    p = run_compare(nat, "process=" + run)
                    self.assertEqual(p.returncode, INCOMPLETE, p.stdout + p.stderr)
                    self.assertIn("no state was measured by the native run and another", p.stdout)

    def test_nothing_measured_natively_exits_three(self):
        with tempfile.TemporaryDirectory() as tmp:
            states = [{"name": "b", "states": [self.state("Device=0 N=1", True)]}]
            p = run_compare(self.write(tmp, "native.json", states), "process=" + self.write(tmp, "r.json", states))
        self.assertEqual(p.returncode, INCOMPLETE, p.stdout + p.stderr)

    def test_the_json_output_lists_what_is_missing(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "cmp.json")
            run_compare("--json", out, NATIVE, GUEST)
            with open(out, encoding="utf-8") as f:
                doc = json.load(f)
        self.assertEqual(len(doc["incomplete"]), 2)


class ComparePlot(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not PLOT_PYTHON:
            why = "IVCUDA_PLOT_PYTHON (a python3 with matplotlib, which CMake looks for) not given"
            if os.environ.get("IVCUDA_ALLOW_SKIPS") != "1":
                raise AssertionError(f"cannot run here: {why} (IVCUDA_ALLOW_SKIPS=1 lets it skip)")
            raise unittest.SkipTest(why)

    def test_plot_is_a_png_of_every_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            png = os.path.join(tmp, "cmp.png")
            p = run_compare("--plot", png, NATIVE, "process=" + PROCESS, "guest=" + GUEST,
                            python=PLOT_PYTHON)
            self.assertEqual(p.returncode, INCOMPLETE, p.stderr)
            self.assertIn("plot: " + png, p.stdout)
            with open(png, "rb") as f:
                head = f.read(24)
        self.assertEqual(head[:8], b"\x89PNG\r\n\x1a\n")
        width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        self.assertGreater(width, 500)
        self.assertGreater(height, 500)

    def test_unwritable_plot_exits_one(self):
        p = run_compare("--plot", os.path.join(DATA, "no-such-dir", "x.png"), NATIVE, GUEST,
                        python=PLOT_PYTHON)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("cannot write", p.stderr)


class ComparePlotWithoutMatplotlib(unittest.TestCase):
    def test_no_matplotlib_leaves_the_plot_out_saying_so(self):
        with tempfile.TemporaryDirectory() as tmp:
            # A matplotlib that cannot be imported shadows any installed one.
            os.mkdir(os.path.join(tmp, "matplotlib"))
            with open(os.path.join(tmp, "matplotlib", "__init__.py"), "w") as f:
                f.write("raise ImportError('no matplotlib here')\n")
            env = dict(os.environ, PYTHONPATH=tmp)
            png = os.path.join(tmp, "cmp.png")
            p = run_compare("--plot", png, NATIVE, GUEST, env=env)
            self.assertEqual(p.returncode, INCOMPLETE, p.stderr)
            self.assertFalse(os.path.exists(png))
        self.assertIn("matplotlib is not installed: no plot written", p.stderr)
        self.assertIn("simple [Device=0]", p.stdout)  # the table is there all the same




def complete_data(dst):
    """data/ with every run's file made complete: the states native measured that a run lacks or
    skipped, taken from native.json (run.sh fails on an incomplete comparison)."""
    os.makedirs(dst)
    with open(NATIVE, encoding="utf-8") as f:
        native = json.load(f)
    shutil.copyfile(NATIVE, os.path.join(dst, "native.json"))
    for side in ("process", "guest", "vfio"):
        with open(os.path.join(DATA, side + ".json"), encoding="utf-8") as f:
            doc = json.load(f)
        benches = {b["name"]: b for b in doc["benchmarks"]}
        for nb in native["benchmarks"]:
            b = benches.setdefault(nb["name"], {"name": nb["name"], "states": []})
            if b not in doc["benchmarks"]:
                doc["benchmarks"].append(b)
            states = {st["name"]: st for st in b["states"] or []}
            for ns in nb["states"] or []:
                if ns["name"] not in states or states[ns["name"]].get("is_skipped"):
                    b["states"] = [st for st in b["states"] or [] if st["name"] != ns["name"]] + [ns]
        with open(os.path.join(dst, side + ".json"), "w", encoding="utf-8") as f:
            json.dump(doc, f)


def write_script(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o755)


class RunScript(unittest.TestCase):
    """run.sh with stand-ins: NVBench (fake_nvbench.py as --exe), ivcudad (fake_ivcudad.py in a
    fake ivcuda build), nvidia-smi, ssh and scp (on PATH)."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name
        self.build = os.path.join(self.tmp, "ivcuda-build")
        self.libdir = os.path.join(self.build, "lib")
        os.makedirs(self.libdir)
        os.makedirs(os.path.join(self.build, "host-daemon"))
        # Only its presence is checked; the stand-in executable never loads it.
        open(os.path.join(self.libdir, "libcuda.so.1"), "w").close()
        write_script(os.path.join(self.build, "host-daemon", "ivcudad"),
                     f"#!/bin/sh\nexec {sys.executable} {FAKE_DAEMON} \"$@\"\n")
        self.bin = os.path.join(self.tmp, "bin")
        os.mkdir(self.bin)
        self.gpu(True)
        self.out = os.path.join(self.tmp, "out")
        self.record = os.path.join(self.tmp, "record.jsonl")
        # The runs' results, complete (the incomplete files of data/ have tests of their own).
        self.data = os.path.join(self.tmp, "data")
        complete_data(self.data)

    def tearDown(self):
        self._tmp.cleanup()

    def gpu(self, present):
        """An nvidia-smi on PATH that lists one GPU, or none."""
        listing = "GPU 0: NVIDIA H200 (UUID: GPU-0)" if present else "No devices were found"
        write_script(os.path.join(self.bin, "nvidia-smi"),
                     f"#!/bin/sh\necho '{listing}'\n" + ("" if present else "exit 6\n"))

    def run_sh(self, *args, env_extra=None, base=True):
        env = dict(os.environ)
        for k in ("LD_PRELOAD", "IVCUDA_SOCKET", "CUDA_MODULE_LOADING", "FAKE_FAIL"):
            env.pop(k, None)
        env.update(FAKE_LIBDIR=self.libdir, FAKE_RECORD=self.record, FAKE_DATA=self.data,
                   PATH=self.bin + os.pathsep + env["PATH"])
        env.update(env_extra or {})
        head = ["--exe", FAKE, "--out", self.out, "--ivcuda-build", self.build] if base else []
        return subprocess.run(["bash", RUN_SH, *head, *args], capture_output=True, text=True,
                              env=env, timeout=120)

    def records(self):
        if not os.path.exists(self.record):
            return []
        with open(self.record, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def runs(self):
        return [r for r in self.records() if "side" in r]

    def test_help_prints_usage_and_exits_zero(self):
        p = self.run_sh("--help", base=False)
        self.assertEqual(p.returncode, 0)
        self.assertIn("usage: run.sh", p.stdout)
        for word in ("--target-samples", "--guest-ssh", "--vfio", "--python", "--build-only"):
            self.assertIn(word, p.stdout)

    def test_bad_usage_exits_two_with_usage_and_runs_nothing(self):
        for args in (("--bogus",), ("--samples", "0"), ("--samples", "1x"), ("--samples",),
                     ("--modes", "native,vm"), ("--modes", ""), ("--exe", DATA),
                     ("--exe", os.path.join(DATA, "native.json")),
                     ("--vfio", os.path.join(self.tmp, "missing.json")),
                     ("--native-json", os.path.join(self.tmp, "missing.json"),
                      "--modes", "process"),
                     ("--native-json", NATIVE),  # native is among the default modes
                     ("--modes", "process"),  # nothing to compare with
                     ("--modes", "native,process", "--guest-ssh", "vm"),
                     ("--guest-ssh", "vm", "--guest-bundle", self.tmp),
                     ("--guest-timeout", "0"),
                     ("--sets", "go"), ("--sets", ""),
                     ("--sets", "python"),  # the test guest (a default mode) has no Python
                     ("stray",)):
            with self.subTest(args=args):
                p = self.run_sh(*args)
                self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                self.assertIn("usage: run.sh", p.stderr)
        self.assertEqual(self.records(), [], "a bad invocation ran something")

    def test_no_gpu_exits_three_saying_so(self):
        self.gpu(False)
        for modes in ("native,process", "native", "process,guest"):
            with self.subTest(modes=modes):
                args = ["--modes", modes]
                if "native" not in modes:
                    args += ["--native-json", NATIVE]
                p = self.run_sh(*args)
                self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
                self.assertIn("no GPU", p.stderr)
        self.assertEqual(self.records(), [])

    def test_no_wheel_exits_three_naming_the_setup_script(self):
        empty = os.path.join(self.tmp, "wheels")
        os.mkdir(empty)
        # The build needs the wheel; so does the Python set with a given executable.
        for args in (("--build-only", "--build-dir", os.path.join(self.tmp, "b")),
                     ("--exe", FAKE, "--python", "--modes", "native")):
            with self.subTest(args=args):
                p = self.run_sh("--wheels", empty, *args, base=False)
                self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
                self.assertIn("no cuda-bench wheel", p.stderr)
                self.assertIn("nvbench-configs/setup.sh", p.stderr)
                self.assertIn("cuda-bench[cu13]==0.3.0", p.stderr)

    def test_no_ivcuda_build_exits_three(self):
        p = self.run_sh("--modes", "native,process", "--ivcuda-build", self.tmp)
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        self.assertIn("ivcuda is not built in " + self.tmp, p.stderr)

    def test_no_guest_exits_three(self):
        bundle = os.path.join(self.tmp, "no-bundle")
        os.mkdir(bundle)
        p = self.run_sh("--modes", "native,guest", "--guest-bundle", bundle)
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        self.assertIn("no guest: " + bundle + " holds no test-guest bundle", p.stderr)
        # An ssh that cannot reach the VM.
        write_script(os.path.join(self.bin, "ssh"),
                     "#!/bin/sh\necho 'ssh: connect to host vm port 22: Connection refused' >&2\n"
                     "exit 255\n")
        p = self.run_sh("--modes", "native,guest", "--guest-ssh", "vm")
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        self.assertIn("no guest: ssh vm does not answer", p.stderr)
        self.assertIn("Connection refused", p.stderr)

    def test_native_and_process_runs_with_the_same_fixed_samples_then_the_comparison(self):
        p = self.run_sh("--modes", "native,process", "--samples", "25", "--", "-b", "simple")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        runs = self.runs()
        self.assertEqual([r["side"] for r in runs], ["native", "process"])
        for rec in runs:
            self.assertEqual(rec["args"], ["--stopping-criterion", "sample-count",
                                           "--target-samples", "25",
                                           "--json", os.path.join(self.out, rec["side"] + ".json"),
                                           "-b", "simple"])
            self.assertEqual(rec["env"]["CUDA_MODULE_LOADING"], "EAGER")
        native, process = runs
        self.assertIsNone(native["env"]["IVCUDA_SOCKET"])
        self.assertNotIn(self.libdir, (native["env"]["LD_LIBRARY_PATH"] or "").split(":"))
        self.assertEqual(process["env"]["LD_LIBRARY_PATH"].split(":")[0], self.libdir)
        self.assertTrue(process["env"]["IVCUDA_SOCKET"].endswith("process.sock"))
        daemon = [r["daemon"] for r in self.records() if "daemon" in r]
        self.assertEqual(len(daemon), 1)
        self.assertIn("--shm-size", daemon[0])
        self.assertEqual(daemon[0][daemon[0].index("--driver") + 1], "libcuda.so.1")
        self.assertIn("overhead per task (process - native cold CPU mean): +2.000 us", p.stdout)
        with open(os.path.join(self.out, "comparison.json"), encoding="utf-8") as f:
            self.assertEqual(json.load(f)["labels"], ["process"])
        with open(os.path.join(self.out, "comparison.txt"), encoding="utf-8") as f:
            self.assertIn("simple [Device=0]", f.read())
        self.assertIn("results in " + os.path.realpath(self.out), p.stdout)

    def test_a_process_run_that_never_reached_ivcudad_fails(self):
        p = self.run_sh("--modes", "native,process", env_extra={"FAKE_NO_HELLO": "1"})
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("never reached ivcudad", p.stderr)

    def test_a_process_run_that_lacks_or_skipped_native_states_fails(self):
        # data/process.json lacks two states native measured; data/guest.json skipped one.
        for side, file in (("process", PROCESS), ("process", GUEST)):
            with self.subTest(file=os.path.basename(file)):
                shutil.copyfile(file, os.path.join(self.data, "process.json"))
                p = self.run_sh("--modes", "native,process")
                self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
                self.assertIn("comparison incomplete", p.stdout)
                self.assertIn(f"the {side} run", p.stdout)

    def test_a_process_run_that_skipped_everything_fails(self):
        with open(os.path.join(self.data, "process.json"), "w", encoding="utf-8") as f:
            json.dump({"benchmarks": []}, f)
        p = self.run_sh("--modes", "native,process")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("no state was measured by the native run and another", p.stdout)

    def test_vfio_results_are_a_third_column(self):
        p = self.run_sh("--modes", "native,process", "--vfio", os.path.join(self.data, "vfio.json"))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("overhead per task (vfio - native cold CPU mean): +1.000 us", p.stdout)
        self.assertRegex(p.stdout, r"native\s+process\s+process/native\s+vfio\s+vfio/native")

    def test_native_json_replaces_the_native_run(self):
        p = self.run_sh("--modes", "process", "--native-json", NATIVE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual([r["side"] for r in self.runs()], ["process"])
        self.assertIn("native: " + NATIVE, p.stdout)

    def test_a_failing_run_exits_one_and_shows_its_log(self):
        p = self.run_sh("--modes", "native,process", env_extra={"FAKE_FAIL": "process"})
        self.assertEqual(p.returncode, 1)
        self.assertIn("the process run failed", p.stderr)
        self.assertIn("failing on purpose", p.stderr)

    def test_guest_over_ssh_copies_the_benchmark_runs_it_and_fetches_its_json(self):
        # The "VM" is this machine: ssh runs the command here, scp copies here.
        vm_lib = os.path.join(self.tmp, "vm-lib")
        os.mkdir(vm_lib)
        open(os.path.join(vm_lib, "libcuda.so.1"), "w").close()
        write_script(os.path.join(self.bin, "ssh"),
                     "#!/bin/bash\n"
                     "while [[ $1 == -o ]]; do shift 2; done\n"
                     "echo \"$1\" >>\"$FAKE_RECORD.ssh\"; shift\n"
                     "exec bash -c \"$*\"\n")
        write_script(os.path.join(self.bin, "scp"),
                     "#!/bin/bash\n"
                     "args=(); while (($#)); do case $1 in -q) shift ;; -o) shift 2 ;;\n"
                     "  *) args+=(\"${1#vm:}\"); shift ;; esac; done\n"
                     "cp \"${args[@]}\"\n")
        # NVBench arguments reach the VM's shell as they were given, one word each.
        p = self.run_sh("--modes", "native,guest", "--guest-ssh", "vm", "--guest-lib", vm_lib,
                        "--", "-a", "Duration=[0:1e-4:5e-5]", "-b", "it's",
                        env_extra={"FAKE_GUEST_LIB": vm_lib})
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        native, guest = self.runs()
        self.assertEqual((native["side"], guest["side"]), ("native", "guest"))
        self.assertEqual(guest["env"]["LD_LIBRARY_PATH"].split(":")[0], vm_lib)
        self.assertIn("--target-samples", guest["args"])
        self.assertEqual(guest["args"][-4:], ["-a", "Duration=[0:1e-4:5e-5]", "-b", "it's"])
        self.assertEqual(native["args"][-4:], guest["args"][-4:])
        self.assertTrue(os.path.exists(os.path.join(self.out, "guest.json")))
        self.assertIn("overhead per task (guest - native cold CPU mean): +25.000 us", p.stdout)
        with open(self.record + ".ssh", encoding="utf-8") as f:
            self.assertEqual(set(f.read().split()), {"vm"})
        # The guest library missing in the VM is "no guest".
        p = self.run_sh("--modes", "native,guest", "--guest-ssh", "vm", "--guest-lib", self.tmp)
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        self.assertIn("no guest: vm has no " + self.tmp + "/libcuda.so.1", p.stderr)


class PythonSet(unittest.TestCase):
    """python/ivcuda_nvbench.py registers the C++ set's benchmarks, with the same axes; checked
    with stand-ins for cuda.bench and CuPy (neither runs without a GPU)."""

    def test_same_benchmarks_and_axes_as_the_cpp_set(self):
        cpp = {}
        for name in sorted(os.listdir(os.path.join(CONFIGS, "benchmarks"))):
            if name.endswith(".cu"):
                with open(os.path.join(CONFIGS, "benchmarks", name), encoding="utf-8") as f:
                    text = f.read()
                for m in re.finditer(r"NVBENCH_BENCH\((\w+)\)((?:\s*\.add_\w+\([^;]*?\))*);",
                                     text):
                    cpp[m.group(1)] = sorted(re.findall(r'\.add_\w+axis\("(\w+)"', m.group(2)))
        self.assertEqual(set(cpp), {"sleep_1ms", "sleep_sweep", "launch_empty",
                                    "copy_d2d_kernel", "copy_h2d", "copy_d2h"})
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "cuda", "bench"))
            for stub in ("cupy", "numpy"):
                os.mkdir(os.path.join(tmp, stub))
                write_script(os.path.join(tmp, stub, "__init__.py"), "")
            write_script(os.path.join(tmp, "cuda", "bench", "__init__.py"), """
registered = {}
class _Bench:
    def __init__(self, name):
        self.name = name
        registered[name] = {}
    def __getattr__(self, attr):
        def add(axis, values):
            registered[self.name][axis] = (attr, list(values))
            return self
        return add
def register(fn):
    return _Bench(fn.__name__)
def run_all_benchmarks(argv):
    import json, sys
    json.dump({"argv": argv[1:], "registered": registered}, sys.stdout)
""")
            env = dict(os.environ, PYTHONPATH=tmp)
            script = os.path.join(CONFIGS, "python", "ivcuda_nvbench.py")
            p = subprocess.run([sys.executable, script, "--json", "x.json"], capture_output=True,
                               text=True, env=env, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        doc = json.loads(p.stdout)
        self.assertEqual(doc["argv"], ["--json", "x.json"])
        py = {name: sorted(axes) for name, axes in doc["registered"].items()}
        self.assertEqual(py, cpp)
        self.assertEqual(doc["registered"]["sleep_sweep"]["Duration"],
                         ["add_float64_axis", [i / 1e4 for i in range(11)]])
        self.assertEqual(doc["registered"]["copy_h2d"]["Memory"],
                         ["add_string_axis", ["pinned", "pageable"]])
        self.assertEqual(doc["registered"]["copy_d2h"]["Bytes"],
                         ["add_int64_power_of_two_axis", [26]])


if __name__ == "__main__":
    unittest.main()
