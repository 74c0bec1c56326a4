#!/usr/bin/python3
"""Writes bench/results/gpu.md from what `bench/gpu/run.sh device` left under $OUT (stdlib only).

    python3 bench/gpu/report.py RESULTS_DIR [-o bench/results/gpu.md]

RESULTS_DIR holds the device run's files: gpu.txt (the device, the driver, each test's
outcome), gtest-xml.tar (one gtest XML per test binary), gemm_probe.json (the device's GEMM
peak per tier), plan_bench.tar (one gpu_plan_bench JSON per model) and served*.json (`shoal
bench` against `shoal serve` with KIND_GPU instances). A file that is missing is named in the
report, and the rest is still written.

The report puts issue 20's targets first, each measured against a figure from the same run:
  - ResNet-50 in fp16 at batch 64: the plan's GEMM arithmetic per second (convolutions
    counted as their im2col products) over the fp16 GEMM peak gemm_probe measured, for
    convolutions on im2col and on cuDNN (target: >= 0.5);
  - served against the engine alone: the recommender's rows per second through `shoal serve`
    (one KIND_GPU instance, double buffered) over the plan's own rate at the same batch of 64
    rows with two batches in flight, as the instance runs it (target: >= 0.9);
  - copies hidden: gpu_plan_bench's copy_hidden at each model's largest batch (target: >= 0.8).
Then the tests, the peak, each model's times, throughput, share of its tier's peak and
difference from the CPU engine, and the served runs. Exits 1 when RESULTS_DIR has none of the
files, 0 otherwise (a missed target is reported, not an error).
"""
import argparse
import io
import json
import os
import re
import sys
import tarfile
import xml.etree.ElementTree as ET

# The targets issue 20 sets.
PEAK_TARGET = 0.5
SERVED_TARGET = 0.9
HIDDEN_TARGET = 0.8
SERVED_BATCH = 64  # bench/gpu/run.sh serves the recommender with max_batch_size 64

# gpu_plan_bench's variants in column order, and the GEMM peak each is held against.
TIERS = ["fp32", "tf32", "fp16", "bf16", "int8"]


def tier_of(variant):
    """The peak a variant's arithmetic is compared with: fp32_steps -> fp32, fp16_tp2 -> fp16."""
    base = variant.split("_")[0]
    return base if base in TIERS else None


def parse_json(text, name, missing):
    """The document, or None (named as unreadable) when a run cut short left it truncated."""
    try:
        return json.loads(text)
    except ValueError:
        missing.append(f"{name} (unreadable)")
        return None


def read_json(path, missing):
    if not os.path.exists(path):
        missing.append(os.path.basename(path))
        return None
    with open(path) as f:
        return parse_json(f.read(), os.path.basename(path), missing)


def read_tar_members(path, missing):
    """{member's base name: bytes} of a tar, or {} (named as missing) when there is none."""
    if not os.path.exists(path):
        missing.append(os.path.basename(path))
        return {}
    out = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile():
                out[os.path.basename(m.name)] = tar.extractfile(m).read()
    return out


def header(gpu_txt):
    """(date, commit, device line, cuDNN line, the run's exit line) from gpu.txt's header."""
    date = commit = device = cudnn = exit_line = None
    lines = gpu_txt.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"# shoal GPU checks, (.*), commit (\S+)", line)
        if m:
            date, commit = m.group(1), m.group(2)
        elif line.startswith("name, driver_version") and i + 1 < len(lines):
            names = [c.strip() for c in line.split(",")]
            values = [c.strip() for c in lines[i + 1].split(",")]
            device = "; ".join(f"{n} {v}" if n != "name" else v for n, v in zip(names, values))
        elif line.startswith("cuDNN:"):
            cudnn = line[len("cuDNN:"):].strip()
        elif re.match(r"exit \d+$", line):
            exit_line = line
    return date, commit, device, cudnn, exit_line


def test_outcomes(xml_files):
    """[(binary, passed, failed, skipped, [failed test names])] from gtest XML files."""
    rows = []
    for name in sorted(xml_files):
        root = ET.parse(io.BytesIO(xml_files[name])).getroot()
        passed = failed = skipped = 0
        failures = []
        for case in root.iter("testcase"):
            full = f"{case.get('classname')}.{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                failures.append(full)
            elif case.find("skipped") is not None or case.get("result") == "skipped":
                skipped += 1
            elif case.get("status", "run") == "run":
                passed += 1
        rows.append((re.sub(r"\.xml$", "", name), passed, failed, skipped, failures))
    return rows


def variants_of(row):
    """The GPU variants a plan_bench row timed, in column order (keys gpu_<variant>_ms)."""
    return [k[len("gpu_"):-len("_ms")] for k in row if k.startswith("gpu_") and k.endswith("_ms")]


def tflops(row, variant):
    ms = row.get(f"gpu_{variant}_ms") or 0  # null: the variant failed
    return row["gemm_flops"] / (ms * 1e9) if ms > 0 else 0.0


def fmt(x, digits=2):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{x:.{digits}f}"


def percent(x):
    """A share as a percentage, with two significant digits below 1%."""
    return f"{x:.1%}" if x >= 0.01 else f"{x * 100:.2g}%"


def ratio(x, target):
    return "met" if x is not None and x >= target else "missed"


def peak_figures(plans, peaks):
    """ResNet-50 at batch 64: {variant: (TFLOP/s, share of the fp16 peak)} for fp16 and fp16_cudnn."""
    plan = plans.get("resnet50")
    peak = peaks.get("fp16")
    if not plan or not peak:
        return {}
    out = {}
    for row in plan["rows"]:
        if row["batch"] != 64:
            continue
        for v in ("fp16", "fp16_cudnn"):
            if row.get(f"gpu_{v}_ms"):  # absent, or null where the variant failed
                t = tflops(row, v)
                out[v] = (t, t / peak)
    return out


def engine_rate(plans):
    """The recommender's rows/s at batch SERVED_BATCH with two batches in flight (fp32 graph)."""
    plan = plans.get("recommender")
    if not plan:
        return None
    for row in plan["rows"]:
        if row["batch"] == SERVED_BATCH and row.get("fp32_pipelined_ms", 0) > 0:
            return SERVED_BATCH * 1000.0 / row["fp32_pipelined_ms"]
    return None


def served_step(doc):
    """The measured step of a `shoal bench --json` document (its last, the highest load)."""
    steps = doc.get("steps") or []
    return steps[-1] if steps else None


def build(results_dir):
    missing = []
    gpu_txt = ""
    path = os.path.join(results_dir, "gpu.txt")
    if os.path.exists(path):
        with open(path) as f:
            gpu_txt = f.read()
    else:
        missing.append("gpu.txt")
    probe = read_json(os.path.join(results_dir, "gemm_probe.json"), missing)
    plan_files = read_tar_members(os.path.join(results_dir, "plan_bench.tar"), missing)
    xml_files = read_tar_members(os.path.join(results_dir, "gtest-xml.tar"), missing)
    served = {}
    for label, name in (("2 instances, depth 2", "served.json"),
                        ("1 instance, depth 2", "served_1_instance.json"),
                        ("1 instance, depth 1", "served_1_instance_depth_1.json")):
        doc = read_json(os.path.join(results_dir, name), missing)
        if doc is not None:
            served[label] = doc
    plans = {}
    for k, v in plan_files.items():
        if k.endswith(".json"):
            doc = parse_json(v.decode(), k, missing)
            if doc is not None:
                plans[re.sub(r"\.json$", "", k)] = doc
    peaks = {t: v["median"] for t, v in (probe or {}).get("tflops", {}).items()}
    found = bool(gpu_txt or probe or plans or xml_files or served)
    return found, missing, gpu_txt, probe, plans, xml_files, served, peaks


def render(results_dir):
    found, missing, gpu_txt, probe, plans, xml_files, served, peaks = build(results_dir)
    if not found:
        return None
    out = []
    w = out.append
    date, commit, device, cudnn, exit_line = header(gpu_txt)
    w("# The GPU path on a device")
    w("")
    w(f"Written by `bench/gpu/report.py` from a run of `bench/gpu/run.sh device` "
      f"({date or 'date unknown'}, commit {commit or 'unknown'}) on "
      f"{device or (probe or {}).get('device') or 'an unnamed device'}. "
      f"cuDNN: {cudnn or 'not reported'}. {exit_line or 'The run did not reach its end.'}")
    if missing:
        w("")
        w("Missing from the results: " + ", ".join(f"`{m}`" for m in missing) + ".")

    # Issue 20's targets, first.
    w("")
    w("## Targets (issue 20)")
    w("")
    w("| target | measured | |")
    w("|---|---|---|")
    figures = peak_figures(plans, peaks)
    if figures:
        for v, (t, share) in figures.items():
            where = "cuDNN" if v.endswith("_cudnn") else "im2col + cuBLASLt"
            w(f"| ResNet-50 fp16, batch 64, convolutions on {where}: >= {PEAK_TARGET:.0%} of the "
              f"fp16 GEMM peak ({peaks['fp16']:.1f} TFLOP/s) | {t:.1f} TFLOP/s, "
              f"{share:.1%} | {ratio(share, PEAK_TARGET)} |")
    else:
        w("| ResNet-50 fp16, batch 64: >= 50% of the fp16 GEMM peak | not measured (no ResNet-50 "
          "batch 64 row or no fp16 peak) | missed |")
    engine = engine_rate(plans)
    for label, doc in served.items():
        step = served_step(doc)
        if step is None or engine is None:
            w(f"| served ({label}) >= {SERVED_TARGET}x the engine alone | not measured | missed |")
            continue
        r = step["inferences_per_s"] / engine
        w(f"| served ({label}) >= {SERVED_TARGET}x the engine alone ({engine:.0f} rows/s at batch "
          f"{SERVED_BATCH}, two in flight) | {step['inferences_per_s']:.0f} rows/s, {r:.2f}x | "
          f"{ratio(r, SERVED_TARGET)} |")
    if not served:
        w(f"| served >= {SERVED_TARGET}x the engine alone | not measured | missed |")
    for name in sorted(plans):
        rows = plans[name]["rows"]
        if not rows:
            continue
        last = max(rows, key=lambda r: r["batch"])
        h = last["copy_hidden"]
        w(f"| {name}, batch {last['batch']}: copies hidden >= {HIDDEN_TARGET:.0%} | {h:.0%} "
          f"(copies {last['fp32_copy_in_ms'] + last['fp32_copy_out_ms']:.3f} ms, compute "
          f"{last['fp32_steps_ms']:.3f} ms) | {ratio(h, HIDDEN_TARGET)} |")

    w("")
    w("## Tests")
    w("")
    # Binaries that left no XML: crashed, timed out, lacked a library, or were not run.
    no_result = {}
    for line in gpu_txt.splitlines():
        # (Test binaries only: a benchmark skipped for time says so in the same words.)
        m = re.match(r"((?:engine|backends|e2e)_[\w.]+): (exit status \d+|not run, .*)$", line)
        if m and m.group(1) + ".xml" not in xml_files:
            no_result[m.group(1)] = m.group(2)
    if xml_files or no_result:
        w("| test | passed | failed | skipped |")
        w("|---|---|---|---|")
        failures = []
        for binary, passed, failed, skipped, names in test_outcomes(xml_files):
            w(f"| `{binary}` | {passed} | {failed} | {skipped} |")
            failures += names
        for binary, why in sorted(no_result.items()):
            w(f"| `{binary}` | no result: {why} | | |")
        if failures:
            w("")
            w("Failed: " + ", ".join(f"`{n}`" for n in failures) + ". Their output is in "
              "`tests.log`.")
    else:
        w("No gtest XML: see `gpu.txt`.")

    w("")
    w("## The device's GEMM peak (gpu_gemm_probe)")
    w("")
    if probe:
        w(f"A {probe['size']}x{probe['size']}x{probe['size']} cuBLASLt GEMM, "
          f"{probe['runs']} runs per tier.")
        w("")
        w("| tier | median TFLOP/s | min | max |")
        w("|---|---|---|---|")
        for t, v in probe["tflops"].items():
            w(f"| {t} | {v['median']:.1f} | {v['min']:.1f} | {v['max']:.1f} |")
    else:
        w("Not measured.")

    w("")
    w("## The engine alone (gpu_plan_bench)")
    for name in sorted(plans):
        plan = plans[name]
        rows = plan["rows"]
        if not rows:
            continue
        variants = variants_of(rows[0])
        w("")
        w(f"### {name}")
        w("")
        model = plan["model"]
        if os.path.isabs(model):  # a file the run wrote for itself (ResNet-50, BERT-base)
            model = os.path.basename(model)
        w(f"`{model}`, median of {plan['runs']} runs; each GPU time is "
          "one batch through the plan with its copies, as a CUDA graph (`fp32_steps`: step by "
          "step). GEMM GFLOP is the plan's products, convolutions counted as their im2col "
          "products.")
        w("")
        w("ms per batch:")
        w("")
        w("| batch | CPU | " + " | ".join(variants) + " | GEMM GFLOP |")
        w("|---|---|" + "---|" * len(variants) + "---|")
        for r in rows:
            cpu = fmt(r["cpu_ms"], 3) if r["cpu_ms"] > 0 else "-"
            w(f"| {r['batch']} | {cpu} | " +
              " | ".join(fmt(r[f'gpu_{v}_ms'], 3) for v in variants) +
              f" | {r['gemm_flops'] / 1e9:.3g} |")
        def per_variant(title, names, cell):
            """A table of `cell(row, variant)` by batch (rows) and variant (columns)."""
            w("")
            w(title)
            w("")
            w("| batch | " + " | ".join(names) + " |")
            w("|---|" + "---|" * len(names))
            for r in rows:
                w(f"| {r['batch']} | " + " | ".join(cell(r, v) for v in names) + " |")

        def rate(r, v):
            ms = r[f"gpu_{v}_ms"]
            if not ms:
                return "failed"
            rows_per_s = r["batch"] * 1000.0 / ms if ms > 0 else 0
            peak = peaks.get(tier_of(v) or "")
            return f"{rows_per_s:,.0f}" + (f", {percent(tflops(r, v) / peak)}" if peak else "")

        def diff(r, v):
            d = r[f"{v}_max_abs_diff"]
            return "not finite" if d is None else f"{d:.2e}"

        per_variant("Rows per second, and TFLOP/s as a share of the tier's GEMM peak:", variants,
                    rate)
        diffs = [v for v in variants if f"{v}_max_abs_diff" in rows[0]]
        if diffs:
            per_variant("Largest difference from the CPU engine's fp32 outputs:", diffs, diff)
        w("")
        w("fp32 as a CUDA graph, split by CUDA events, and R batches back to back, synchronously "
          "and with two in flight:")
        w("")
        w("| batch | copy in ms | compute ms | copy out ms | sequential ms/batch | "
          "two in flight ms/batch | copies hidden |")
        w("|---|---|---|---|---|---|---|")
        for r in rows:
            w(f"| {r['batch']} | {r['fp32_copy_in_ms']:.4f} | {r['fp32_steps_ms']:.4f} | "
              f"{r['fp32_copy_out_ms']:.4f} | {r['fp32_sequential_ms']:.4f} | "
              f"{r['fp32_pipelined_ms']:.4f} | {r['copy_hidden']:.0%} |")
    if not plans:
        w("")
        w("Not measured.")

    w("")
    w("## Served (shoal serve, KIND_GPU recommender; shoal bench)")
    w("")
    if served:
        w("Requests of 16 rows, 16 outstanding over HTTP; batches of up to 64 rows form.")
        w("")
        w("| instances | rows/s | vs the engine alone | p50 ms | p99 ms | errors | stable | "
          "server batch | queue us | compute us |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        for label, doc in served.items():
            s = served_step(doc)
            if s is None:
                w(f"| {label} | no step measured | | | | | | | | |")
                continue
            server = s.get("server") or {}
            vs = f"{s['inferences_per_s'] / engine:.2f}x" if engine else "-"
            lat = s.get("latency_us", {})
            w(f"| {label} | {s['inferences_per_s']:.0f} | {vs} | {lat.get('p50', 0) / 1000:.2f} | "
              f"{lat.get('p99', 0) / 1000:.2f} | {s.get('errors_total', '-')} | "
              f"{s.get('stable', '-')} | {fmt(server.get('batch_size'), 1)} | "
              f"{fmt(server.get('queue_us'), 0)} | {fmt(server.get('compute_infer_us'), 0)} |")
    else:
        w("Not measured.")
    w("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="the folder the device run's files were fetched into")
    ap.add_argument("-o", "--output", help="write here (default: standard output)")
    opts = ap.parse_args()
    text = render(opts.results)
    if text is None:
        print(f"report.py: {opts.results} holds none of bench/gpu/run.sh's results", file=sys.stderr)
        return 1
    if opts.output:
        with open(opts.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
