"""Strategy table on a deep CNN split into pipeline stages (bench/pipeline/deep_cnn.sh).

The model: a plain 17-convolution CNN on 3x64x64 images (~0.6 GFLOP per image), exported
by PyTorch at run time into a scratch folder (nothing binary is committed). Each strategy
is its own `shoal serve` on the same cores, loaded by `shoal bench` over HTTP with
batch-1 requests:

  serial           one instance, whole model, two threads, no batcher; one request at a time
  whole + batching one instance, whole model, two threads, dynamic batching; N clients
  data parallel    two instances (one core each), whole model, dynamic batching; N clients
  pipeline         one instance cut into two stages (one core each), dynamic batching,
                   batches cut into micro-batches (adaptive); N clients
  hybrid           two instances x two stages (four stage threads, unpinned), dynamic
                   batching; N clients

CPU use is the server's user+system time over the measured window (cores busy); memory
is its peak RSS. Bubble is shoal_pipeline_bubble_ratio scraped after the window. Writes
the "## Deep CNN split into stages" section of bench/results/pipeline.md (other sections
of that file are kept) and prints the table.
"""
import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("serving", os.path.join(ROOT, "bench", "serving", "serving.py"))
serving = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serving)

SECTION = "## Deep CNN split into stages"


def export_model(path, width, depth, size):
    import torch
    import torch.nn as nn

    class DeepCNN(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [nn.Conv2d(3, width, 3, padding=1), nn.ReLU()]
            for i in range(depth):
                stride = 2 if i in (depth // 3, 2 * depth // 3) else 1
                layers += [nn.Conv2d(width, width, 3, stride=stride, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
            self.body = nn.Sequential(*layers)
            self.head = nn.Linear(width, 10)

        def forward(self, x):
            return self.head(self.body(x).mean((2, 3)))

    torch.manual_seed(0)
    model = DeepCNN().eval()
    torch.onnx.export(model, torch.randn(1, 3, size, size), path, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17)


def write_repo(root, onnx, name, s):
    d = os.path.join(root, name, "1")
    os.makedirs(d, exist_ok=True)
    os.symlink(onnx, os.path.join(d, "model.onnx"))
    cfg = 'name: "%s"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n' % name
    if s["batching"]:
        cfg += "dynamic_batching {\n  max_queue_delay_microseconds: 2000\n}\n"
    cfg += "instance_group [ { count: %d kind: KIND_CPU } ]\n" % s["count"]
    params = dict(s.get("parameters", {}))
    if s.get("cores"):
        params["shoal.instance_group.0.cpu_cores"] = s["cores"]
    for k, v in sorted(params.items()):
        cfg += 'parameters { key: "%s" value { string_value: "%s" } }\n' % (k, v)
    open(os.path.join(root, name, "config.pbtxt"), "w").write(cfg)
    return cfg


def scrape_bubble(port):
    try:
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
    except OSError:
        return None
    values = [float(m.group(1)) for m in re.finditer(r"^shoal_pipeline_bubble_ratio\{[^}]*\} (\S+)$", text, re.M)]
    return sum(values) / len(values) if values else None


def run_strategy(opts, work, onnx, s):
    repo = os.path.join(work, "repo_" + s["key"])
    cfg = write_repo(repo, onnx, "deep_cnn", s)
    port, mport = serving.free_port(), serving.free_port()
    argv = [opts.shoal, "serve", "--model-repository", repo, "--http-address", "127.0.0.1", "--http-port", str(port),
            "--allow-grpc", "false", "--allow-metrics", "true", "--metrics-port", str(mport)]
    server = serving.Server(argv, port, os.path.join(work, "shoal_%s.log" % s["key"]))
    try:
        out = os.path.join(work, "bench_%s.json" % s["key"])
        bench = [opts.shoal, "bench", "-m", "deep_cnn", "-u", "127.0.0.1:%d" % port, "-p", str(opts.window_ms),
                 "--warmup", str(opts.warmup_ms), "--max-trials", "1", "--percentile", "99",
                 "--concurrency-range", str(s["concurrency"]), "--json", out]
        t0, c0 = time.time(), serving.cpu_ticks(server.proc.pid)
        r = subprocess.run(bench, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t1, c1 = time.time(), serving.cpu_ticks(server.proc.pid)
        if r.returncode != 0 or not os.path.exists(out):
            raise RuntimeError("shoal bench failed: %s\n%s" % (" ".join(bench), r.stderr))
        step = json.load(open(out))["steps"][0]
        hz = os.sysconf("SC_CLK_TCK")
        return {"strategy": s["label"], "config": cfg, "concurrency": s["concurrency"],
                "throughput": step["inferences_per_s"], "p50_us": step["latency_us"]["p50"],
                "p99_us": step["latency_us"]["p99"], "errors": step["errors_total"],
                # warmup and window together: the server's cores busy on average
                "cpu_cores_busy": (c1 - c0) / hz / max(t1 - t0, 1e-9),
                "peak_rss_mb": serving.vm_hwm_kb(server.proc.pid) / 1024.0, "bubble": scrape_bubble(mport),
                "stages_log": [l.strip() for l in open(server.log_path) if "pipeline stages" in l]}
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "src", "cli", "shoal"))
    ap.add_argument("--window-ms", type=int, default=5000)
    ap.add_argument("--warmup-ms", type=int, default=1500)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--cores", default="0-1")
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loadavg", default="?")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pipeline.md"))
    opts = ap.parse_args()
    n = opts.clients
    strategies = [
        {"key": "serial", "label": "serial (one request at a time, whole model)", "count": 1, "batching": False,
         "cores": opts.cores, "concurrency": 1},
        {"key": "whole", "label": "whole model, one instance + batching", "count": 1, "batching": True,
         "cores": opts.cores, "concurrency": n},
        {"key": "data", "label": "data parallel (instances + batching)", "count": 2, "batching": True,
         "cores": opts.cores, "concurrency": n},
        {"key": "pipeline", "label": "pipeline parallel (stages, micro-batches)", "count": 1, "batching": True,
         "cores": opts.cores, "concurrency": n, "parameters": {"pipeline_stages": "2"}},
        {"key": "hybrid", "label": "hybrid (stages x instances + batching)", "count": 2, "batching": True,
         "concurrency": n, "parameters": {"pipeline_stages": "2"}},
    ]
    with tempfile.TemporaryDirectory(prefix="shoal_pipeline_bench_") as work:
        onnx = os.path.join(work, "deep_cnn.onnx")
        serving.log("exporting the deep CNN (depth %d)" % opts.depth)
        export_model(onnx, 32, opts.depth, 64)
        runs = {s["key"]: [] for s in strategies}
        for rep in range(opts.repeats):
            # Rounds interleave the strategies, so a slow minute of the shared machine falls on each alike.
            for s in strategies:
                serving.log("round %d/%d, strategy: %s" % (rep + 1, opts.repeats, s["label"]))
                x = run_strategy(opts, work, onnx, dict(s, key="%s_%d" % (s["key"], rep)))
                runs[s["key"]].append(x)
                serving.log("  %.1f/s p50 %.1f ms p99 %.1f ms cpu %.2f rss %.0f MB bubble %s" % (
                    x["throughput"], x["p50_us"] / 1000, x["p99_us"] / 1000, x["cpu_cores_busy"],
                    x["peak_rss_mb"], x["bubble"]))
        # Per strategy, the run with the median throughput (all of a run's figures together).
        results = []
        for s in strategies:
            ordered = sorted(runs[s["key"]], key=lambda r: r["throughput"])
            pick = dict(ordered[len(ordered) // 2])
            pick["p50_all_ms"] = [round(r["p50_us"] / 1000, 1) for r in runs[s["key"]]]
            results.append(pick)
    info = serving.machine()
    by = {r["strategy"]: r for r in results}
    lines = [SECTION, "",
             "`bench/pipeline/deep_cnn.sh` on %s, %d logical CPUs, %.1f GiB, kernel %s, commit %s, %s. "
             "**The machine's 2 cores were shared with other engineers' builds and tests while this ran** "
             "(load average before: %s), so absolute figures are noisy and low." % (
                 info["cpu"], info["cores"], info["memory_gib"], info["kernel"], info["commit"], info["date"],
                 opts.loadavg),
             "",
             "Model: a plain CNN, %d 3x3 convolutions of width 32 on 3x64x64 images (~0.6 GFLOP per image), "
             "exported by PyTorch at run time. Batch-1 requests over HTTP from `shoal bench`; %d closed-loop "
             "clients except serial (1). Every strategy on the same cores (%s); hybrid's instances are unpinned "
             "(two instances x two stages = four stage threads on the two cores). CPU use: the server's "
             "user+system time over warmup and window (cores busy). Memory: peak RSS. Bubble: "
             "`shoal_pipeline_bubble_ratio` after the run. %d rounds, strategies interleaved in each; the "
             "table shows each strategy's median-throughput run, and the last column every round's p50." % (
                 opts.depth + 1, n, opts.cores, opts.repeats),
             "",
             "| strategy | throughput (img/s) | p50 (ms) | p99 (ms) | CPU use (cores) | memory (MB, peak RSS) | bubble | p50 of each round (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append("| %s | %.1f | %.1f | %.1f | %.2f | %.0f | %s | %s |" % (
            r["strategy"], r["throughput"], r["p50_us"] / 1000, r["p99_us"] / 1000, r["cpu_cores_busy"],
            r["peak_rss_mb"], "%.2f" % r["bubble"] if r["bubble"] is not None else "-",
            ", ".join("%.1f" % v for v in r["p50_all_ms"])))
    serial = results[0]
    whole, pipe, hybrid = results[1], results[3], results[4]
    lines += ["",
              "Ratios: pipeline p50 / whole-model-instance p50 at the same load and cores: %.2f (target < 1: %s). "
              "Hybrid throughput / serial: %.2fx (issue target: 4.3x at no worse p99; on this shared machine "
              "the serial row's one request at a time on two threads suffers most from the other tenants, so "
              "the ratio says more about contention than about the strategies). Errors: %d." % (
                  pipe["p50_us"] / max(whole["p50_us"], 1e-9),
                  "met" if pipe["p50_us"] < whole["p50_us"] else "missed",
                  hybrid["throughput"] / max(serial["throughput"], 1e-9), sum(r["errors"] for r in results)),
              ""]
    for r in results:
        for l in r["stages_log"]:
            lines.append("- %s: `%s`" % (r["strategy"], l.split("] ")[-1][:200]))
    lines.append("")
    section = "\n".join(lines)
    print(section)
    old = open(opts.out).read() if os.path.exists(opts.out) else "# Pipelines and pipeline parallelism\n\n"
    if SECTION in old:
        start = old.index(SECTION)
        nxt = old.find("\n## ", start + len(SECTION))
        new = old[:start] + section + (old[nxt + 1:] if nxt >= 0 else "")
    else:
        new = old.rstrip("\n") + "\n\n" + section
    open(opts.out, "w").write(new)
    json.dump({"machine": info, "results": results},
              open(os.path.join(os.path.dirname(opts.out), "pipeline_deep_cnn.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
