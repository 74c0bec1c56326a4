#!/usr/bin/python3
"""HTTP codec offload benchmark (bench/http_offload/run.sh): does one large request stall
the other connections of its I/O loop?

`shoal serve` with ONE HTTP I/O loop serves an identity model. A "large" client sends,
back to back, gzip-compressed infer requests of N float32 values as JSON, asking for the
answer as JSON too (so inflating, parsing and writing it are all real work). Meanwhile a
"small" client sends one-value infer requests on its own connection and records each one's
latency. Run twice in one go: --http-codec-thread-count 0 (everything on the loop, shoal
before this change) and the default (2 codec threads). Prints and writes the small
requests' latency percentiles, the large requests' rate, and the ratios.
"""
import argparse
import gzip
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = """name: "identity"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def body_for(values):
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32",
                                   "data": values}]}).encode()


def start(shoal, repo, backends, codec_threads):
    port, grpc, metrics = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [shoal, "serve", "--model-repository", repo, "--backend-directory", backends,
         "--address", "127.0.0.1", "--http-port", str(port), "--grpc-port", str(grpc),
         "--metrics-port", str(metrics), "--http-thread-count", "1",
         "--http-codec-thread-count", str(codec_threads)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit("shoal serve did not become ready")


def measure(port, large_body, seconds):
    stop = threading.Event()
    large_done = [0]

    def large():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while not stop.is_set():
            c.request("POST", "/v2/models/identity/infer", large_body,
                      {"Content-Encoding": "gzip", "Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                sys.exit(f"large request answered {r.status}")
            large_done[0] += 1

    t = threading.Thread(target=large, daemon=True)
    t.start()
    time.sleep(0.5)  # the large client is under way
    small = body_for([1.0])
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    lat = []
    begin = time.perf_counter()
    large_at_begin = large_done[0]
    while time.perf_counter() - begin < seconds:
        t0 = time.perf_counter()
        c.request("POST", "/v2/models/identity/infer", small)
        r = c.getresponse()
        r.read()
        lat.append((time.perf_counter() - t0) * 1e3)
        if r.status != 200:
            sys.exit(f"small request answered {r.status}")
        time.sleep(0.002)
    elapsed = time.perf_counter() - begin
    large_rate = (large_done[0] - large_at_begin) / elapsed
    stop.set()
    t.join()
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    return {"small_requests": len(lat), "small_p50_ms": q(0.5), "small_p99_ms": q(0.99),
            "small_max_ms": lat[-1], "large_per_s": large_rate}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--values", type=int, default=1_000_000, help="floats per large request")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    a = ap.parse_args()
    build = os.environ.get("SHOAL_BUILD", os.path.join(ROOT, "build"))
    shoal = os.path.join(build, "src", "cli", "shoal")
    backends = os.path.join(build, "backends")
    repo = tempfile.mkdtemp(prefix="shoal_offload_")
    try:
        os.makedirs(os.path.join(repo, "identity", "1"))
        with open(os.path.join(repo, "identity", "config.pbtxt"), "w") as f:
            f.write(CONFIG)
        raw = body_for([float(i % 1000) / 7 for i in range(a.values)])
        large_body = gzip.compress(raw, 6)
        print(f"large request: {a.values} floats, {len(raw) / 1e6:.1f} MB of JSON, "
              f"{len(large_body) / 1e6:.1f} MB gzip-compressed; answer as JSON", flush=True)
        results = {}
        for label, codec in (("on the loop (codec threads 0)", 0), ("offloaded (codec threads 2)", 2)):
            proc, port = start(shoal, repo, backends, codec)
            try:
                results[label] = measure(port, large_body, a.seconds)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            r = results[label]
            print(f"{label}: small p50 {r['small_p50_ms']:.2f} ms, p99 {r['small_p99_ms']:.2f} ms, "
                  f"max {r['small_max_ms']:.1f} ms ({r['small_requests']} requests); "
                  f"large {r['large_per_s']:.2f}/s", flush=True)
        before, after = results.values()
        ratios = {k: before[k] / after[k] for k in ("small_p50_ms", "small_p99_ms", "small_max_ms")}
        ratios["large_per_s"] = after["large_per_s"] / before["large_per_s"]
        print("ratios (on the loop / offloaded): p50 %.1fx, p99 %.1fx, max %.1fx; large rate "
              "(offloaded / on the loop) %.2fx" % (ratios["small_p50_ms"], ratios["small_p99_ms"],
                                                  ratios["small_max_ms"], ratios["large_per_s"]))
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "http_offload.json"), "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
                       "values": a.values, "seconds": a.seconds, "results": results,
                       "ratios": ratios}, f, indent=1)
    finally:
        shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
