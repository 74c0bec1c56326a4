#!/usr/bin/python3
"""Tests of bench/gpu/report.py (stdlib only; CTest runs it as bench_gpu_report_test).

Each test writes a results folder shaped as `bench/gpu/run.sh device` writes it, with figures
chosen so that every ratio the report computes has one known answer, runs the report as a
user does, and checks the figures and verdicts it prints. The figures are made up here and
say nothing about any device.
"""
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "report.py")

GPU_TXT = """# shoal GPU checks, 2026-12-07 12:00 UTC, commit abc1234
name, driver_version, memory.total [MiB], clocks.max.sm [MHz]
Test GPU, 999.1, 81559 MiB, 1980 MHz
LD_LIBRARY_PATH=/somewhere
cuDNN: /somewhere/libcudnn.so.9
## engine_cuda_device_test
exit 1
"""

GTEST_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="3" failures="1" disabled="0" errors="0" name="AllTests">
  <testsuite name="GpuPlanTest" tests="3" failures="1" skipped="1">
    <testcase name="Passes" status="run" result="completed" classname="GpuPlanTest" />
    <testcase name="Fails" status="run" result="completed" classname="GpuPlanTest">
      <failure message="expected 1, got 2"><![CDATA[expected 1, got 2]]></failure>
    </testcase>
    <testcase name="Skips" status="run" result="skipped" classname="GpuPlanTest">
      <skipped message="no device"/>
    </testcase>
  </testsuite>
</testsuites>
"""


def plan_row(batch, gemm_flops, ms, pipelined_ms=1.0, hidden=0.5, diffs=None):
    """A gpu_plan_bench row: `ms` maps each variant to its time per batch."""
    row = {"batch": batch, "cpu_ms": 2.0, "gemm_flops": gemm_flops, "fp32_copy_in_ms": 0.25,
           "fp32_steps_ms": 1.0, "fp32_copy_out_ms": 0.25, "fp32_sequential_ms": 1.5,
           "fp32_pipelined_ms": pipelined_ms, "copy_hidden": hidden}
    for v, t in ms.items():
        row[f"gpu_{v}_ms"] = t
        if v != "fp32_steps":
            row[f"{v}_max_abs_diff"] = (diffs or {}).get(v, 1e-6)
    return row


def bench_doc(inferences_per_s):
    return {"model": "rec", "batch_size": 16, "steps": [{
        "mode": "concurrency", "concurrency": 16, "requests_per_s": inferences_per_s / 16,
        "inferences_per_s": inferences_per_s, "latency_us": {"p50": 1500.0, "p99": 4000.0},
        "server": {"batch_size": 62.5, "queue_us": 300.0, "compute_infer_us": 450.0}}]}


def add_tar(path, files):
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def write_results(folder, skip=()):
    """A complete device run's results, less the files named in `skip`."""
    files = {}
    files["gpu.txt"] = GPU_TXT
    files["gemm_probe.json"] = json.dumps({"device": "Test GPU", "size": 8192, "runs": 20, "tflops": {
        "fp32": {"median": 50.0, "min": 49.0, "max": 51.0},
        "tf32": {"median": 200.0, "min": 190.0, "max": 210.0},
        "fp16": {"median": 400.0, "min": 390.0, "max": 410.0},
        "bf16": {"median": 400.0, "min": 390.0, "max": 410.0}}})
    # ResNet-50 at batch 64: 1 TFLOP per batch; fp16 on im2col 10 ms (100 TFLOP/s, 25% of the
    # fp16 peak), fp16 on cuDNN 4 ms (250 TFLOP/s, 62.5%).
    resnet = {"model": "/tmp/x/resnet50.onnx", "runs": 20, "cpu_runs": 0, "rows": [
        plan_row(1, 1e12 / 64, {"fp32": 2.0, "tf32": 1.0, "fp16": 1.0, "bf16": 1.0,
                                "fp32_steps": 3.0, "fp32_cudnn": 2.0, "tf32_cudnn": 1.0,
                                "fp16_cudnn": 0.5, "bf16_cudnn": 0.5}, hidden=0.2),
        plan_row(64, 1e12, {"fp32": 40.0, "tf32": 10.0, "fp16": 10.0, "bf16": 10.0,
                            "fp32_steps": 41.0, "fp32_cudnn": 30.0, "tf32_cudnn": 8.0,
                            "fp16_cudnn": 4.0, "bf16_cudnn": 4.0}, hidden=0.9)]}
    # The recommender at batch 64, two batches in flight: 0.5 ms a batch, 128,000 rows/s.
    recommender = {"model": "examples/models/recommender/1/model.onnx", "runs": 100,
                   "cpu_runs": 100, "rows": [
        plan_row(1, 1e6, {"fp32": 0.1, "tf32": 0.1, "fp16": 0.1, "bf16": 0.1, "fp32_steps": 0.2,
                          "fp16_tp2": 0.2}),
        plan_row(64, 64e6, {"fp32": 0.8, "tf32": 0.7, "fp16": 0.6, "bf16": 0.6, "fp32_steps": 0.9,
                            "fp16_tp2": 0.9}, pipelined_ms=0.5, hidden=0.6,
                 diffs={"fp16": None})]}
    files["plan_bench.tar"] = {"resnet50.json": json.dumps(resnet).encode(),
                               "recommender.json": json.dumps(recommender).encode()}
    files["gtest-xml.tar"] = {"engine_cuda_gpu_plan_test.xml": GTEST_XML.encode()}
    files["served.json"] = json.dumps(bench_doc(160000.0))
    files["served_1_instance.json"] = json.dumps(bench_doc(121600.0))
    files["served_1_instance_depth_1.json"] = json.dumps(bench_doc(64000.0))
    for name, content in files.items():
        if name in skip:
            continue
        path = os.path.join(folder, name)
        if isinstance(content, dict):
            add_tar(path, content)
        else:
            with open(path, "w") as f:
                f.write(content)


def run_report(folder, *args):
    return subprocess.run([sys.executable, REPORT, folder, *args], capture_output=True, text=True)


def line_with(text, *words):
    """The one line of `text` holding every word."""
    lines = [l for l in text.splitlines() if all(w in l for w in words)]
    if len(lines) != 1:
        raise AssertionError(f"{len(lines)} lines hold {words}:\n" + "\n".join(lines))
    return lines[0]


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.folder = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def test_targets_are_measured_against_the_same_runs_figures(self):
        write_results(self.folder)
        r = run_report(self.folder)
        self.assertEqual(r.returncode, 0, r.stderr)
        text = r.stdout
        # The device, the commit and the run's exit come from gpu.txt.
        self.assertIn("commit abc1234", text)
        self.assertIn("Test GPU; driver_version 999.1", text)
        self.assertIn("exit 1", text)
        self.assertNotIn("Missing from the results", text)
        # ResNet-50 at batch 64 against the fp16 peak, once per convolution path.
        im2col = line_with(text, "ResNet-50 fp16", "im2col")
        self.assertIn("100.0 TFLOP/s, 25.0%", im2col)
        self.assertTrue(im2col.endswith("| missed |"), im2col)
        cudnn = line_with(text, "ResNet-50 fp16", "on cuDNN")
        self.assertIn("250.0 TFLOP/s, 62.5%", cudnn)
        self.assertTrue(cudnn.endswith("| met |"), cudnn)
        # Served against the engine's 128,000 rows/s with two batches in flight.
        one = line_with(text, "served (1 instance, depth 2)")
        self.assertIn("128000 rows/s", one)
        self.assertIn("121600 rows/s, 0.95x", one)
        self.assertTrue(one.endswith("| met |"), one)
        depth1 = line_with(text, "served (1 instance, depth 1)")
        self.assertIn("0.50x", depth1)
        self.assertTrue(depth1.endswith("| missed |"), depth1)
        # Copies hidden, at each model's largest batch.
        hidden = line_with(text, "resnet50, batch 64: copies hidden")
        self.assertIn("| 90% (copies 0.500 ms, compute 1.000 ms) | met |", hidden)
        hidden = line_with(text, "recommender, batch 64: copies hidden")
        self.assertTrue(hidden.endswith("| missed |"), hidden)

    def test_each_variant_is_held_against_its_own_tiers_peak(self):
        write_results(self.folder)
        text = run_report(self.folder).stdout
        resnet = text[text.index("### resnet50"):text.index("## Served")]
        # Rows per second at batch 64: 64 rows in 40 ms is 1,600/s; fp32's 25 TFLOP/s is
        # half of the fp32 peak; tf32_cudnn's 125 TFLOP/s is 62.5% of the TF32 peak.
        row = [l for l in resnet.splitlines() if l.startswith("| 64 | 1,600, 50.0% |")]
        self.assertEqual(len(row), 1, resnet)
        self.assertIn("| 8,000, 62.5% |", row[0])
        # fp32 step by step is held against the fp32 peak; fp16_tp2 against fp16's.
        recommender = text[text.index("### recommender"):]
        self.assertIn("fp16_tp2", recommender)
        rates = [l for l in recommender.splitlines() if l.startswith("| 64 | 80,000, 0.16%")]
        self.assertEqual(len(rates), 1, recommender)
        # A difference that was not finite says so.
        diffs = [l for l in recommender.splitlines() if l.startswith("| 64 |") and "not finite" in l]
        self.assertEqual(len(diffs), 1, recommender)

    def test_tests_are_counted_and_failures_named(self):
        write_results(self.folder)
        text = run_report(self.folder).stdout
        self.assertIn("| `engine_cuda_gpu_plan_test` | 1 | 1 | 1 |", text)
        self.assertIn("Failed: `GpuPlanTest.Fails`", text)

    def test_missing_files_are_named_and_the_rest_reported(self):
        write_results(self.folder, skip=("served_1_instance_depth_1.json", "gemm_probe.json"))
        r = run_report(self.folder)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Missing from the results: `gemm_probe.json`, `served_1_instance_depth_1.json`.",
                      r.stdout)
        # Without a peak, the ResNet-50 target cannot be judged, and says so.
        self.assertTrue(line_with(r.stdout, "ResNet-50 fp16").endswith("| missed |"))
        self.assertIn("not measured", line_with(r.stdout, "ResNet-50 fp16"))
        self.assertNotIn("depth 1", r.stdout)
        self.assertIn("0.95x", line_with(r.stdout, "served (1 instance, depth 2)"))

    def test_a_run_cut_short_reports_what_it_left(self):
        # A test binary that crashed (no XML) and one never run, a plan JSON truncated by a
        # time limit, and a served run with errors.
        write_results(self.folder, skip=("gpu.txt", "plan_bench.tar", "served.json"))
        with open(os.path.join(self.folder, "gpu.txt"), "w") as f:
            f.write(GPU_TXT + "engine_cuda_conv_test: exit status 139\n"
                    "engine_cuda_gpu_plan_test.cudnn: exit status 124\n"
                    "e2e_gpu_test: not run, the run's 3 s were spent\n")
        # Its int8 variant failed: null time and difference.
        row = plan_row(64, 1e12, {"fp32": 1.0, "int8": 2.0})
        row["gpu_int8_ms"] = None
        row["int8_max_abs_diff"] = None
        resnet = json.dumps({"model": "resnet50.onnx", "runs": 20, "cpu_runs": 0, "rows": [row]})
        add_tar(os.path.join(self.folder, "plan_bench.tar"),
                {"resnet50.json": resnet.encode(), "bert_base.json": b'{"model": "bert", "ro'})
        doc = bench_doc(1000.0)
        doc["steps"][0].update({"errors_total": 7, "stable": False})
        with open(os.path.join(self.folder, "served.json"), "w") as f:
            json.dump(doc, f)
        r = run_report(self.folder)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| `engine_cuda_conv_test` | no result: exit status 139 | | |", r.stdout)
        self.assertIn("| `engine_cuda_gpu_plan_test.cudnn` | no result: exit status 124 | | |",
                      r.stdout)
        self.assertIn("| `e2e_gpu_test` | no result: not run, the run's 3 s were spent | | |",
                      r.stdout)
        self.assertIn("`bert_base.json (unreadable)`", r.stdout)
        self.assertIn("resnet50", r.stdout)
        self.assertTrue(line_with(r.stdout, "| 64 | 64,000").endswith("| failed |"))
        self.assertIn("| 64 | 2.000 | 1.000 | - |", r.stdout)
        self.assertIn("| 7 | False |", line_with(r.stdout, "| 2 instances, depth 2 |"))

    def test_a_folder_without_results_is_an_error(self):
        r = run_report(self.folder)
        self.assertEqual(r.returncode, 1)
        self.assertIn("holds none of bench/gpu/run.sh's results", r.stderr)
        self.assertEqual(r.stdout, "")

    def test_writes_the_file_named(self):
        write_results(self.folder)
        out = os.path.join(self.folder, "gpu.md")
        r = run_report(self.folder, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "")
        with open(out) as f:
            self.assertTrue(f.read().startswith("# The GPU path on a device"))


if __name__ == "__main__":
    unittest.main()
