#!/usr/bin/python3
"""The latency-SLO benchmark behind bench/slo/run.sh (stdlib only).

For each model, two `shoal serve` processes side by side on the same model and the same
instances: (a) a Triton-style configuration (batching_policy "fixed_window": every batch
waits out max_queue_delay_microseconds, FIFO, no admission, an unbounded queue) and
(b) shoal's SLO scheduling (batching_policy "slo" with latency_slo_us: work-conserving
release, earliest deadline first, admission by predicted wait with 429 + Retry-After).
Both are driven by `shoal bench` over HTTP:
  - one request at a time on the idle SLO server (closed loop, concurrency 1): the
    latency a lone request can have;
  - saturation: closed loop at high concurrency, on each server;
  - open loop, Poisson arrivals, at 25, 50, 80, 95, 120, 150 and 200% of the fixed-window
    server's saturation rate, the two servers measured in turn at each level;
  - an on/off burst: Poisson at 200% of saturation for 0.5 s of every 2 s (a mean of 50%).
Per level: goodput (answers within the SLO per second, `shoal bench -l`), p50/p99/p99.9 of
the answered requests, requests refused (429) and how fast they were answered, the tier
mix, and the server's RSS. With --heldout (the example's held-out colour digits and their
labels, an .npz written by run.sh), the image classifier's int8 tier is calibrated on the
first 100 and each tier's top-1 accuracy is measured on the other 350 through the server
that runs the ladder. Writes bench/results/slo.md and slo.json.
"""
import argparse
import importlib.util
import json
import os
import random
import resource
import shutil
import struct
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("serving", os.path.join(ROOT, "bench", "serving", "serving.py"))
serving = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serving)

LEVELS = [25, 50, 80, 95, 120, 150, 200]
# The burst level: Poisson at BURST_PEAK% of saturation during the first BURST_ON of
# every BURST_PERIOD_MS, silence for the rest.
BURST_PERIOD_MS, BURST_ON, BURST_PEAK = 2000, 0.25, 200
CALIBRATION_IMAGES = 100
# One request at a time, open loop: arrivals far enough apart that every one finds the
# server idle and its threads asleep.
SPARSE_RATE_PER_S = 20

# Per model: its config body (tensors, batch size, instances), its batching window (the
# fixed-window server waits it out; the SLO server uses it as an upper bound only), the
# SLO, and where its files come from.
MODELS = {
    "cost_model": {
        "label": "cost_model plugin: a batch of n takes 2 ms + 0.25 ms·n (1 instance)",
        "config": 'backend: "cost_model"\nmax_batch_size: 32\n'
                  'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
                  'parameters { key: "a_us" value { string_value: "2000" } }\n'
                  'parameters { key: "b_us" value { string_value: "250" } }\n',
        "files": [], "delay_us": 2000, "slo_ms": 50,
    },
    "recommender": {
        "label": "recommender MLP (example repository), 1 instance, 2 threads",
        "config": 'platform: "onnxruntime_onnx"\nmax_batch_size: 256\n'
                  'input [ { name: "features" data_type: TYPE_FP32 dims: [ 64 ] } ]\n'
                  'output [ { name: "score" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
                  'parameters { key: "intra_op_thread_count" value { string_value: "2" } }\n',
        "files": ["model.onnx"], "delay_us": 500, "slo_ms": 25,
    },
    "image_classifier": {
        "label": "image_classifier CNN (example repository), 1 instance, 2 threads",
        "config": 'platform: "onnxruntime_onnx"\nmax_batch_size: 32\n'
                  'input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]\n'
                  'output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
                  'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
                  'parameters { key: "intra_op_thread_count" value { string_value: "2" } }\n'
                  'parameters { key: "conv_algorithm" value { string_value: "winograd" } }\n',
        "files": ["model.onnx"], "delay_us": 2000, "slo_ms": 25, "ladder": True,
    },
}

POLICIES = [("fixed", "fixed window (Triton-style)"), ("slo", "SLO scheduling"),
            ("ladder", "SLO + precision ladder fp32 -> int8"),
            ("slo_fixed_reserve", "SLO scheduling, fixed 25% reserve (no learning)")]
# --fixed-reserve-column: also serve each model with admission's earlier rule (a fixed 25%
# of the deadline in reserve, nothing learned from late answers), beside the default.
FIXED_RESERVE_COLUMN = [False]


def policies(model):
    return [(p, label) for p, label in POLICIES
            if (p != "ladder" or MODELS[model].get("ladder"))
            and (p != "slo_fixed_reserve" or FIXED_RESERVE_COLUMN[0])]


def npy_bytes(descr, shape, data):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join("%d, " % d for d in shape))
    header += " " * (((len(header) + 11 + 63) // 64) * 64 - len(header) - 11) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def read_npz(path):
    """{name: (descr, shape, raw bytes)} of an .npz of little-endian arrays (stdlib only)."""
    out = {}
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            b = z.read(name)
            n = struct.unpack("<H", b[8:10])[0]
            header = eval(b[10:10 + n].decode())  # numpy's own header: a Python dict literal
            out[name[:-4]] = (header["descr"], tuple(header["shape"]), b[10 + n:])
    return out


def write_calibration(path, heldout=None, n=64):
    """The int8 tier's calibration inputs (an .npz with one array, `image`, samples first):
    the first CALIBRATION_IMAGES held-out images when given, else n random images in [0, 1]
    (the accuracy the server logs at load is against fp32 on these inputs)."""
    if heldout:
        descr, shape, data = heldout["image"]
        per = 3 * 32 * 32 * 4
        npy = npy_bytes(descr, (CALIBRATION_IMAGES,) + shape[1:], data[:CALIBRATION_IMAGES * per])
    else:
        rng = random.Random(7)
        count = n * 3 * 32 * 32
        npy = npy_bytes("<f4", (n, 3, 32, 32), struct.pack("<%df" % count, *(rng.random() for _ in range(count))))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("image.npy", npy)


def top1(server, model, heldout, tier, batch=25):
    """Top-1 accuracy of `tier` (the request's `precision` parameter) on the held-out
    images after the calibration ones, through the server."""
    _, shape, data = heldout["image"]
    _, _, label_bytes = heldout["labels"]
    labels = struct.unpack("<%dq" % (len(label_bytes) // 8), label_bytes)
    per = 3 * 32 * 32
    floats = struct.unpack("<%df" % (len(data) // 4), data)
    right = total = 0
    answered_by = set()
    for i in range(CALIBRATION_IMAGES, shape[0], batch):
        n = min(batch, shape[0] - i)
        body = json.dumps({"parameters": {"precision": tier}, "inputs": [
            {"name": "image", "shape": [n, 3, 32, 32], "datatype": "FP32",
             "data": floats[i * per:(i + n) * per]}]}).encode()
        req = serving.urllib.request.Request("http://127.0.0.1:%d/v2/models/%s/infer" % (server.port, model),
                                             data=body, headers={"Content-Type": "application/json"})
        with serving.urllib.request.urlopen(req, timeout=60) as r:
            reply = json.load(r)
        answered_by.add(reply.get("parameters", {}).get("precision", "?"))
        logits = reply["outputs"][0]["data"]
        for j in range(n):
            row = logits[j * 10:(j + 1) * 10]
            right += int(max(range(10), key=row.__getitem__) == labels[i + j])
            total += 1
    return {"top1": right / total, "images": total, "answered_by": sorted(answered_by)}


def write_repo(root, model, policy, heldout=None):
    m = MODELS[model]
    d = os.path.join(root, model, "1")
    os.makedirs(d, exist_ok=True)
    for f in m["files"]:
        shutil.copy(os.path.join(ROOT, "examples", "models", model, "1", f), d)
    cfg = 'name: "%s"\n' % model + m["config"]
    cfg += "dynamic_batching { max_queue_delay_microseconds: %d }\n" % m["delay_us"]
    if policy == "fixed":
        cfg += 'parameters { key: "batching_policy" value { string_value: "fixed_window" } }\n'
    else:
        cfg += 'parameters { key: "latency_slo_us" value { string_value: "%d" } }\n' % (m["slo_ms"] * 1000)
    if policy == "slo_fixed_reserve":
        cfg += 'parameters { key: "deadline_reserve_percent" value { string_value: "25" } }\n'
        cfg += 'parameters { key: "admission_overrun_percentile" value { string_value: "0" } }\n'
    if policy == "ladder":
        write_calibration(os.path.join(root, model, "calibration.npz"), heldout)
        cfg += 'parameters { key: "precision_tiers" value { string_value: "int8" } }\n'
        cfg += 'parameters { key: "precision_ladder" value { string_value: "fp32,int8" } }\n'
    open(os.path.join(root, model, "config.pbtxt"), "w").write(cfg)


def start(opts, work, model, policy):
    repo = os.path.join(work, "repo_%s_%s" % (model, policy))
    write_repo(repo, model, policy, opts.heldout_arrays)
    port, metrics_port = serving.free_port(), serving.free_port()
    argv = [opts.shoal, "serve", "--model-repository", repo, "--address", "127.0.0.1",
            "--http-port", str(port), "--allow-grpc", "false", "--metrics-port", str(metrics_port),
            "--backend-directory", os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(opts.shoal))),
                                                "backends")]
    server = serving.Server(argv, port, os.path.join(work, "shoal_%s_%s.log" % (model, policy)))
    server.metrics_port = metrics_port
    return server


def tier_counts(server):
    """shoal_precision_requests_total by tier, from the server's metrics."""
    counts = {}
    with serving.urllib.request.urlopen("http://127.0.0.1:%d/metrics" % server.metrics_port, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("shoal_precision_requests_total{"):
                tier = line.split('precision="', 1)[1].split('"', 1)[0]
                counts[tier] = counts.get(tier, 0) + float(line.rsplit(" ", 1)[1])
    return counts


def accuracy_line(server):
    """The int8 tier's accuracy against fp32 that the server logged at load."""
    for line in open(server.log_path):
        if "precision int8 against fp32" in line:
            return line.split("precision int8 against fp32: ", 1)[1].strip()
    return None


def cpu_s(pid):
    """User + system CPU seconds the process has used."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def bench(opts, work, server, model, load_args, window_ms=None, warmup_ms=None, n=[0]):
    n[0] += 1
    out = os.path.join(work, "bench%d.json" % n[0])
    argv = [opts.shoal, "bench", "-m", model, "-u", "127.0.0.1:%d" % server.port,
            "-p", str(window_ms or opts.window_ms), "--warmup", str(warmup_ms or opts.warmup_ms), "--max-trials", "1",
            "--percentile", "99", "-l", str(MODELS[model]["slo_ms"]), "--json", out] + load_args
    # CPU time of the client (`shoal bench`, a child) and of the server over the whole call,
    # warm-up included, in cores: on 2 shared cores what one takes the other cannot have.
    client0, server0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_s(server.proc.pid), time.time()
    r = serving.subprocess.run(argv, stdout=serving.subprocess.PIPE, stderr=serving.subprocess.PIPE, text=True)
    client1, server1, wall = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_s(server.proc.pid), time.time() - t0
    if r.returncode != 0 or not os.path.exists(out):
        raise RuntimeError("shoal bench failed (%d): %s\n%s" % (r.returncode, " ".join(argv), r.stderr))
    s = json.load(open(out))["steps"][0]
    lat = s["latency_us"]
    return {"throughput": s["inferences_per_s"], "goodput": s["goodput_per_s"], "p50_us": lat["p50"],
            "p99_us": lat["p99"], "p999_us": lat["p99.9"], "answered": s["requests"],
            "errors": s["errors"], "errors_total": s["errors_total"], "sent": s.get("sent", s["requests"]),
            "duration_s": s["duration_s"], "rss_kb": vm_rss_kb(server.proc.pid),
            "refusals": s["errors"].get("HTTP 429", 0), "expired": s["errors"].get("HTTP 504", 0),
            "refusal_p50_us": s.get("error_latency_us", {}).get("HTTP 429", {}).get("p50", 0),
            "refusal_p99_us": s.get("error_latency_us", {}).get("HTTP 429", {}).get("p99", 0),
            # The same figures from each request's actual send: without the client's own lag
            # behind its schedule (the client shares the 2 cores with the server).
            "refusal_sent_p50_us": s.get("error_latency_from_send_us", {}).get("HTTP 429", {}).get("p50", 0),
            "refusal_sent_p99_us": s.get("error_latency_from_send_us", {}).get("HTTP 429", {}).get("p99", 0),
            "p50_sent_us": s.get("latency_from_send_us", {}).get("p50", 0),
            "p99_sent_us": s.get("latency_from_send_us", {}).get("p99", 0),
            "goodput_sent": s.get("goodput_from_send_per_s", 0),
            "lag_p50_us": s.get("send_lag_us", {}).get("p50", 0),
            "lag_p99_us": s.get("send_lag_us", {}).get("p99", 0),
            "late_sends": s.get("late_sends", 0),
            "peak_rss_kb": serving.vm_hwm_kb(server.proc.pid),
            "client_cores": (client1.ru_utime + client1.ru_stime - client0.ru_utime - client0.ru_stime) / wall,
            "server_cores": (server1 - server0) / wall}


def run_model(opts, work, model):
    serving.log("%s: starting both servers" % model)
    servers = {p: start(opts, work, model, p) for p, _ in policies(model)}
    try:
        res = {"label": MODELS[model]["label"], "slo_ms": MODELS[model]["slo_ms"],
               "delay_us": MODELS[model]["delay_us"], "levels": {}}
        res["alone"] = bench(opts, work, servers["slo"], model, ["--concurrency-range", "1"])
        res["alone_fixed"] = bench(opts, work, servers["fixed"], model, ["--concurrency-range", "1"])
        # Also alone, but open loop and sparse (SPARSE_RATE_PER_S, Poisson): each request finds
        # the server's threads asleep, as a request at 25% load mostly does, where the closed
        # loop above sends the next request the moment a reply arrives, to threads still hot.
        res["alone_sparse"] = bench(opts, work, servers["slo"], model,
                                    ["--request-rate-range", str(SPARSE_RATE_PER_S),
                                     "--request-distribution", "poisson"])
        res["saturation"] = {p: bench(opts, work, servers[p], model,
                                      ["--concurrency-range", str(opts.saturation_concurrency)])
                             for p, _ in policies(model)}
        sat = res["saturation"]["fixed"]["throughput"]
        res["saturation_rate"] = sat
        serving.log("%s: alone p50 %.0f us; saturation %.0f/s (fixed) %.0f/s (slo)" % (
            model, res["alone"]["p50_us"], sat, res["saturation"]["slo"]["throughput"]))
        burst_mean = BURST_PEAK * BURST_ON
        level_order = []
        for pct in opts.levels + (["burst"] if opts.burst else []):
            burst = pct == "burst"
            rate = max(1.0, sat * (burst_mean if burst else pct) / 100.0)
            load = (["--request-distribution", "burst", "--burst-period-ms", str(BURST_PERIOD_MS),
                     "--burst-on-fraction", str(BURST_ON)] if burst
                    else ["--request-distribution", "poisson"])
            level = {}
            order = [p for p, _ in policies(model)]
            if len(level_order) % 2 and "slo_fixed_reserve" in order:
                # The two admission rules take turns going first, so a drift of the machine
                # within a level does not always favour the same one.
                i, j = order.index("slo"), order.index("slo_fixed_reserve")
                order[i], order[j] = order[j], order[i]
            level_order.append(pct)
            for p in order:
                before = tier_counts(servers[p])
                # A burst level measures whole periods: warm-up one, windows of two.
                timing = (2 * BURST_PERIOD_MS, BURST_PERIOD_MS) if burst else (None, None)
                level[p] = bench(opts, work, servers[p], model, ["--request-rate-range", "%.1f" % rate] + load, *timing)
                level[p]["rate"] = rate
                after = tier_counts(servers[p])
                level[p]["tiers"] = {t: after[t] - before.get(t, 0) for t in after if after[t] > before.get(t, 0)}
                serving.log("%s %5s%% %-6s goodput %.0f/s p99 %.1f ms refused %d" % (
                    model, pct, p, level[p]["goodput"], level[p]["p99_us"] / 1000, level[p]["errors_total"]))
            res["levels"][str(pct)] = level
        if "ladder" in servers:
            # The levels above are shares of the fixed window's saturation, which the fp32 SLO
            # server exceeds: at "200%" it is offered less than twice what it can serve, and
            # the ladder cannot double its goodput. This level offers twice the fp32 SLO
            # server's own saturation to it and to the ladder.
            rate = 2 * res["saturation"]["slo"]["throughput"]
            level = {}
            for p in ("slo", "ladder"):
                before = tier_counts(servers[p])
                level[p] = bench(opts, work, servers[p], model,
                                 ["--request-rate-range", "%.1f" % rate, "--request-distribution", "poisson"])
                level[p]["rate"] = rate
                after = tier_counts(servers[p])
                level[p]["tiers"] = {t: after[t] - before.get(t, 0) for t in after if after[t] > before.get(t, 0)}
                serving.log("%s 200%% of SLO fp32 %-6s goodput %.0f/s" % (model, p, level[p]["goodput"]))
            res["ladder_level"] = level
        if "ladder" in servers:
            res["int8_accuracy"] = accuracy_line(servers["ladder"])
            if opts.heldout_arrays:
                res["top1"] = {t: top1(servers["ladder"], model, opts.heldout_arrays, t) for t in ("fp32", "int8")}
                serving.log("%s top-1 on held-out images: %s" % (model, res["top1"]))
        return res
    finally:
        for s in servers.values():
            s.stop()


def report(opts, results, info, elapsed):
    L = ["# Latency SLOs: fixed-window batching beside SLO scheduling", "",
         "Written by `bench/slo/run.sh` (%s, commit %s, %s, %d cores; %d s; load average after: %s). "
         "Each model is served twice from the same files: a Triton-style configuration "
         "(`batching_policy: fixed_window`: every batch waits out the window, FIFO, unbounded queue) and "
         "shoal's SLO scheduling (`latency_slo_us` set: work-conserving release, earliest deadline first, "
         "admission by predicted wait). Open-loop levels are Poisson arrivals at a percentage of the "
         "fixed-window server's closed-loop saturation rate (concurrency %d); each level runs %d ms per "
         "server after %d ms of warm-up. Goodput counts answers within the SLO; latencies are of answered "
         "requests; *refused* are 429s (admission said the deadline could not be met), *expired* 504s (admitted, then found unable to make its deadline in the queue and dropped unrun). The machine is shared: compare "
         "the two columns of one run." % (info["date"], info["commit"], info["cpu"], info["cores"], elapsed,
                                         serving.loadavg(), opts.saturation_concurrency, opts.window_ms,
                                         opts.warmup_ms), ""]
    if FIXED_RESERVE_COLUMN[0]:
        L += ["With `--fixed-reserve-column`, each model is also served by a third SLO server that "
              "keeps admission's earlier rule: a fixed 25% of the time to the deadline in reserve "
              "(`deadline_reserve_percent: 25`, `admission_overrun_percentile: 0`), where the "
              "default keeps 25%, or the 99th percentile of how late its recent predictions ran when "
              "that is more.", ""]
    for model, r in results.items():
        alone = r["alone"]["p50_us"]
        L += ["## %s" % r["label"], "",
              "SLO %d ms; window %d us. One request at a time on the idle server: p50 %.2f ms (SLO "
              "server), %.2f ms (fixed window). Saturation (closed loop): %.0f/s fixed window, %.0f/s SLO "
              "(ratio %.2f)." % (r["slo_ms"], r["delay_us"], alone / 1000, r["alone_fixed"]["p50_us"] / 1000,
                                 r["saturation"]["fixed"]["throughput"], r["saturation"]["slo"]["throughput"],
                                 r["saturation"]["slo"]["throughput"] / max(r["saturation"]["fixed"]["throughput"], 1e-9)),
              "",
              "| load | rate/s | policy | goodput/s | goodput / saturation | p50 ms | p99 ms | p99.9 ms | answered in SLO | in SLO from send | refused (429) | 429 p50 / p99 ms | 429 from send p50 / p99 ms | send lag p50 / p99 ms | expired (504) | tiers | RSS MB (peak) | CPU cores: server / client |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        sat = r["saturation_rate"]
        rows = [(pct, level, policies(model)) for pct, level in r["levels"].items()]
        if r.get("ladder_level"):
            rows.append(("sloX2", r["ladder_level"], [(p, l) for p, l in policies(model) if p in r["ladder_level"]]))
        for pct, level, pols in rows:
            for p, label in pols:
                x = level[p]
                tiers = ", ".join("%s %.0f%%" % (t, 100 * n / max(sum(x["tiers"].values()), 1))
                                  for t, n in sorted(x["tiers"].items())) or "-"
                within = x["goodput"] * x["duration_s"]
                frac = within / x["answered"] if x["answered"] else 0
                frac_sent = x.get("goodput_sent", 0) * x["duration_s"] / x["answered"] if x["answered"] else 0
                refusals = ("%.2f / %.2f" % (x["refusal_p50_us"] / 1000, x["refusal_p99_us"] / 1000)
                            if x["refusals"] else "-")
                refusals_sent = ("%.2f / %.2f" % (x.get("refusal_sent_p50_us", 0) / 1000,
                                                  x.get("refusal_sent_p99_us", 0) / 1000)
                                 if x["refusals"] else "-")
                lag = "%.2f / %.2f" % (x.get("lag_p50_us", 0) / 1000, x.get("lag_p99_us", 0) / 1000)
                if pct == "burst":
                    load = "burst %d%% %.1f s / %.0f s" % (BURST_PEAK, BURST_ON * BURST_PERIOD_MS / 1000,
                                                           BURST_PERIOD_MS / 1000)
                elif pct == "sloX2":
                    load = "200% of the fp32 SLO server's saturation"
                else:
                    load = "%s%%" % pct
                L.append("| %s | %.0f | %s | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f%% | %.2f%% | %d | %s | %s | %s | %d | %s | %.0f (%.0f) | %.2f / %.2f |" % (
                    load, x["rate"], label, x["goodput"], x["goodput"] / max(sat, 1e-9), x["p50_us"] / 1000,
                    x["p99_us"] / 1000, x["p999_us"] / 1000, 100 * frac, 100 * frac_sent, x["refusals"], refusals,
                    refusals_sent, lag, x["expired"], tiers, x["rss_kb"] / 1024, x["peak_rss_kb"] / 1024,
                    x.get("server_cores", 0), x.get("client_cores", 0)))
        if r.get("int8_accuracy"):
            L += ["", "The int8 tier against fp32 at load, on its calibration images: %s." % r["int8_accuracy"]]
        if r.get("top1"):
            t = r["top1"]
            L += ["", "Top-1 accuracy through the ladder's server on %d held-out images (labels; int8 calibrated "
                  "on %d others): fp32 %.2f%%, int8 %.2f%%, a change of %+.2f percentage points (target: at most "
                  "1)." % (t["fp32"]["images"], CALIBRATION_IMAGES, 100 * t["fp32"]["top1"], 100 * t["int8"]["top1"],
                           100 * (t["int8"]["top1"] - t["fp32"]["top1"]))]
        top = r["levels"].get("200", {})
        if "ladder" in top and "fixed" in top:
            fixed = top["fixed"]["goodput"]
            vs_fixed = ("%.2fx the fixed window's" % (top["ladder"]["goodput"] / fixed) if fixed > 0
                        else "%.0f/s where the fixed window's is 0" % top["ladder"]["goodput"])
            L += ["", "At 200%% load the ladder's goodput is %s and %.2fx fixed-precision SLO scheduling's."
                  % (vs_fixed, top["ladder"]["goodput"] / max(top["slo"]["goodput"], 1e-9))]
        x2 = r.get("ladder_level")
        if x2:
            L += ["", "At 200%% of the fp32 SLO server's own saturation (%.0f/s offered) the ladder's goodput is "
                  "%.0f/s, %.2fx fixed-precision SLO scheduling's %.0f/s (target >= 2x)." % (
                      x2["slo"]["rate"], x2["ladder"]["goodput"],
                      x2["ladder"]["goodput"] / max(x2["slo"]["goodput"], 1e-9), x2["slo"]["goodput"])]
        low = r["levels"].get("25", {}).get("slo")
        if low:
            sparse = r.get("alone_sparse")
            line = ("At 25%% load the SLO server's p50 is %.2fx one request at a time (closed loop, "
                    "target <= 1.25x)" % (low["p50_us"] / max(alone, 1e-9)))
            if sparse:
                line += ("; %.2fx one request at a time sent open loop at %d/s (p50 %.2f ms: every request "
                         "finds the threads asleep); timed from the actual send, p50 %.2f ms at 25%% against "
                         "%.2f ms sparse, %.2fx" % (
                             low["p50_us"] / max(sparse["p50_us"], 1e-9), SPARSE_RATE_PER_S,
                             sparse["p50_us"] / 1000, low.get("p50_sent_us", 0) / 1000,
                             sparse.get("p50_sent_us", 0) / 1000,
                             low.get("p50_sent_us", 0) / max(sparse.get("p50_sent_us", 0), 1e-9)))
            L += ["", line + "."]
        L.append("")
    L += ["The load generator shares the 2 cores with the server: where a level's send rate is more than "
          "it can keep (the recommender above ~25,000/s), its latencies include the client's own lag and "
          "the level says nothing about the server. *burst* sends Poisson arrivals at %d%% of saturation for "
          "%.1f s of every %.0f s and nothing in between (a mean of %.0f%%); its rate/s column is that mean. "
          "Refusal latency runs from a request's scheduled send to its 429, as the client sees it; "
          "the *from send* columns time the same replies from the request's actual send, which leaves out "
          "the client's own lag behind its schedule (the *send lag* column: the open-loop client runs on "
          "the same 2 cores as the server and everything else on the machine). *CPU cores* is the CPU time "
          "the server and the client (`shoal bench`) each used during the level, warm-up included, divided by "
          "its wall time: on 2 cores, what the client takes to send the offered load the server cannot have." % (
              BURST_PEAK, BURST_ON * BURST_PERIOD_MS / 1000, BURST_PERIOD_MS / 1000, BURST_PEAK * BURST_ON), ""]
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--models", default="cost_model,recommender,image_classifier")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)))
    ap.add_argument("--window-ms", type=int, default=4000)
    ap.add_argument("--warmup-ms", type=int, default=1000)
    ap.add_argument("--saturation-concurrency", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--keep", help="keep logs and bench JSON in this folder")
    ap.add_argument("--heldout", help="an .npz of held-out images (`image`) and `labels` for the ladder")
    ap.add_argument("--no-burst", dest="burst", action="store_false", help="skip the burst level")
    ap.add_argument("--fixed-reserve-column", action="store_true",
                    help="also serve each model with admission's earlier fixed 25%% reserve")
    opts = ap.parse_args()
    FIXED_RESERVE_COLUMN[0] = opts.fixed_reserve_column
    opts.heldout_arrays = read_npz(opts.heldout) if opts.heldout else None
    opts.levels = [int(x) for x in opts.levels.split(",")]
    models = opts.models.split(",")
    for m in models:
        if m not in MODELS:
            sys.exit("unknown model %s (one of %s)" % (m, ", ".join(MODELS)))
    work = opts.keep or tempfile.mkdtemp(prefix="shoal_slo_")
    os.makedirs(work, exist_ok=True)
    t0 = time.time()
    results = {}
    try:
        for m in models:
            results[m] = run_model(opts, work, m)
    finally:
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = int(time.time() - t0)
    info = serving.machine()
    os.makedirs(opts.out, exist_ok=True)
    json.dump({"machine": info, "results": results}, open(os.path.join(opts.out, "slo.json"), "w"), indent=1)
    open(os.path.join(opts.out, "slo.md"), "w").write(report(opts, results, info, elapsed))
    serving.log("wrote %s/slo.md and slo.json in %d s" % (opts.out, elapsed))


if __name__ == "__main__":
    main()
