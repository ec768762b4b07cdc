#!/usr/bin/env python3
"""Tests for nvbench-configs/: compare.py on hand-written files in NVBench's --json layout
(data/), and run.sh's argument handling and orchestration with a stand-in NVBench executable."""

import importlib.util
import json
import os
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

_spec = importlib.util.spec_from_file_location("nvbench_compare", COMPARE)
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def run_compare(*args):
    return subprocess.run([sys.executable, COMPARE, *args], capture_output=True, text=True,
                          timeout=60)


def by_state(result):
    return {(r["benchmark"], r["state"], r["occurrence"]): r for r in result["states"]}


class CompareMatching(unittest.TestCase):
    def setUp(self):
        self.result = compare.compare(compare.load(NATIVE), compare.load(GUEST))
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
        self.assertEqual(self.result["guest_only"], [
            {"benchmark": "single_float64_axis", "state": "Device=0 Duration=0.0003",
             "occurrence": 0}])

    def test_values_are_read_from_string_encoded_float64(self):
        m = self.rows[("simple", "Device=0", 0)]["metrics"]
        self.assertAlmostEqual(m["cold_gpu"]["native"], 0.001, delta=1e-15)
        self.assertAlmostEqual(m["cold_gpu"]["guest"], 0.001002, delta=1e-15)
        self.assertAlmostEqual(m["cold_cpu"]["native"], 0.00101, delta=1e-15)
        self.assertAlmostEqual(m["cold_cpu"]["guest"], 0.001035, delta=1e-15)
        self.assertAlmostEqual(m["batch_gpu"]["native"], 0.001, delta=1e-15)
        self.assertAlmostEqual(m["batch_gpu"]["guest"], 0.00125, delta=1e-15)

    def test_ratios_are_guest_over_native(self):
        m = self.rows[("simple", "Device=0", 0)]["metrics"]
        self.assertAlmostEqual(m["cold_gpu"]["ratio"], 1.002, places=12)
        self.assertAlmostEqual(m["cold_cpu"]["ratio"], 1.035 / 1.01, places=12)
        self.assertAlmostEqual(m["batch_gpu"]["ratio"], 1.25, places=12)

    def test_overhead_per_task_is_guest_minus_native_cold_cpu_mean(self):
        self.assertAlmostEqual(self.rows[("simple", "Device=0", 0)]["overhead_per_task_s"],
                               25e-6, places=12)
        self.assertAlmostEqual(
            self.rows[("single_float64_axis", "Device=0 Duration=0", 0)]["overhead_per_task_s"],
            30e-6, places=12)

    def test_missing_and_non_finite_summaries_give_no_value_and_no_ratio(self):
        # Duration=0: no batch summary on either side.
        m0 = self.rows[("single_float64_axis", "Device=0 Duration=0", 0)]["metrics"]
        self.assertEqual(m0["batch_gpu"], {"native": None, "guest": None, "ratio": None})
        # Duration=0.0001: guest batch summary missing, guest cold GPU mean is "nan".
        m1 = self.rows[("single_float64_axis", "Device=0 Duration=0.0001", 0)]["metrics"]
        self.assertAlmostEqual(m1["batch_gpu"]["native"], 0.000102, delta=1e-15)
        self.assertIsNone(m1["batch_gpu"]["guest"])
        self.assertIsNone(m1["batch_gpu"]["ratio"])
        self.assertIsNone(m1["cold_gpu"]["guest"])
        self.assertIsNone(m1["cold_gpu"]["ratio"])
        self.assertAlmostEqual(m1["cold_cpu"]["ratio"], 158 / 108, places=12)

    def test_skipped_state_is_reported_with_its_reason_and_no_overhead(self):
        row = self.rows[("copy_sweep_grid_shape", "Device=0 T=I32", 0)]
        self.assertIsNone(row["native_skipped"])
        self.assertIn("skip_time", row["guest_skipped"])
        self.assertIsNone(row["overhead_per_task_s"])
        self.assertIsNone(row["metrics"]["cold_cpu"]["guest"])

    def test_repeated_benchmark_runs_are_matched_in_order(self):
        records = compare.load(os.path.join(DATA, "repeated.json"))
        self.assertEqual([(r["state"], r["occurrence"]) for r in records],
                         [("Device=0", 0), ("Device=0", 1)])
        rows = by_state(compare.compare(records, records))
        self.assertAlmostEqual(rows[("simple", "Device=0", 1)]["metrics"]["cold_cpu"]["native"],
                               0.003, delta=1e-15)

    def test_a_state_without_summaries_written_as_null_is_accepted(self):
        records = compare.load(GUEST)
        copy = [r for r in records if r["benchmark"] == "copy_sweep_grid_shape"]
        self.assertEqual(len(copy), 1)
        self.assertEqual(copy[0]["values"], {})


class CompareCommandLine(unittest.TestCase):
    def test_prints_every_metric_ratio_and_overhead_and_exits_zero(self):
        p = run_compare(NATIVE, GUEST)
        self.assertEqual(p.returncode, 0, p.stderr)
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
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(out, encoding="utf-8") as f:
                doc = json.load(f)
        self.assertEqual(doc["native"], NATIVE)
        rows = by_state(doc)
        self.assertAlmostEqual(rows[("simple", "Device=0", 0)]["overhead_per_task_s"], 25e-6,
                               places=12)
        self.assertIsNone(
            rows[("single_float64_axis", "Device=0 Duration=0", 0)]["metrics"]["batch_gpu"]["ratio"])
        self.assertEqual(len(doc["native_only"]), 1)
        self.assertEqual(len(doc["guest_only"]), 1)

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


class RunScript(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name
        self.libdir = os.path.join(self.tmp, "lib")
        os.mkdir(self.libdir)
        # Only its presence is checked; the stand-in executable never loads it.
        open(os.path.join(self.libdir, "libcuda.so.1"), "w").close()
        self.out = os.path.join(self.tmp, "out")
        self.record = os.path.join(self.tmp, "record.jsonl")

    def tearDown(self):
        self._tmp.cleanup()

    def run_sh(self, *args, env_extra=None):
        env = dict(os.environ)
        for k in ("LD_PRELOAD", "IVCUDA_SOCKET", "CUDA_MODULE_LOADING"):
            env.pop(k, None)
        env.update(FAKE_LIBDIR=self.libdir, FAKE_RECORD=self.record)
        env.update(env_extra or {})
        return subprocess.run(["bash", RUN_SH, *args], capture_output=True, text=True,
                              env=env, timeout=120)

    def records(self):
        with open(self.record, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def test_help_prints_usage_and_exits_zero(self):
        p = self.run_sh("--help")
        self.assertEqual(p.returncode, 0)
        self.assertIn("usage: run.sh", p.stdout)
        self.assertIn("--target-samples", p.stdout)

    def test_bad_usage_exits_two_with_usage(self):
        for args in ((), (FAKE,), (FAKE, self.out), ("--bogus", FAKE, self.out, self.libdir),
                     ("--samples", "0", FAKE, self.out, self.libdir),
                     ("--samples", "1x", FAKE, self.out, self.libdir),
                     ("--samples",),
                     (FAKE, self.out, self.libdir, "sock", "extra"),
                     (os.path.join(DATA, "native.json"), self.out, self.libdir),
                     (FAKE, self.out, self.tmp),
                     (FAKE, self.out, self.libdir, os.path.join(self.tmp, "no-socket"))):
            with self.subTest(args=args):
                p = self.run_sh(*args)
                self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                self.assertIn("usage: run.sh", p.stderr)
        self.assertFalse(os.path.exists(self.record), "a bad invocation ran the benchmark")

    def test_both_runs_get_the_same_fixed_samples_and_the_guest_gets_ivcuda(self):
        p = self.run_sh("--samples", "25", FAKE, self.out, self.libdir, "--", "-b", "simple")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        native, guest = self.records()
        self.assertEqual(native["side"], "native")
        self.assertEqual(guest["side"], "guest")
        for rec, name in ((native, "native"), (guest, "guest")):
            self.assertEqual(rec["args"], ["--stopping-criterion", "sample-count",
                                           "--target-samples", "25",
                                           "--json", os.path.join(self.out, name + ".json"),
                                           "-b", "simple"])
            self.assertEqual(rec["env"]["CUDA_MODULE_LOADING"], "EAGER")
        self.assertEqual(guest["env"]["LD_LIBRARY_PATH"].split(":")[0], self.libdir)
        self.assertIsNone(guest["env"]["IVCUDA_SOCKET"])
        self.assertIsNone(native["env"]["IVCUDA_SOCKET"])
        # Where the results are, then compare.py's report on them.
        self.assertIn("native results: " + os.path.join(self.out, "native.json"), p.stdout)
        self.assertIn("guest results:  " + os.path.join(self.out, "guest.json"), p.stdout)
        self.assertIn("overhead per task (guest - native cold CPU mean): +25.000 us", p.stdout)
        with open(os.path.join(self.out, "comparison.json"), encoding="utf-8") as f:
            self.assertEqual(len(json.load(f)["states"]), 4)

    def test_socket_and_preload_reach_the_guest_run_only(self):
        sock_path = os.path.join(self.tmp, "ivcudad.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(sock_path)
            p = self.run_sh("--preload", FAKE, self.out, self.libdir, sock_path,
                            env_extra={"IVCUDA_SOCKET": "/stale", "LD_PRELOAD": ""})
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        native, guest = self.records()
        self.assertIsNone(native["env"]["IVCUDA_SOCKET"])
        self.assertIsNone(native["env"]["LD_PRELOAD"])
        self.assertEqual(guest["env"]["IVCUDA_SOCKET"], sock_path)
        self.assertEqual(guest["env"]["LD_PRELOAD"], os.path.join(self.libdir, "libcuda.so.1"))

    def test_native_json_option_skips_the_native_run(self):
        p = self.run_sh("--native-json", NATIVE, FAKE, self.out, self.libdir)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual([r["side"] for r in self.records()], ["guest"])
        self.assertIn("native results: " + NATIVE, p.stdout)

    def test_a_failing_run_exits_one_and_shows_its_log(self):
        p = self.run_sh(FAKE, self.out, self.libdir, env_extra={"FAKE_FAIL": "guest"})
        self.assertEqual(p.returncode, 1)
        self.assertIn("the guest run failed", p.stderr)
        self.assertIn("failing on purpose", p.stderr)


if __name__ == "__main__":
    unittest.main()
