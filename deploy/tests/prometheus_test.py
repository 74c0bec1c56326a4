#!/usr/bin/env python3
"""End to end: a real Prometheus scrapes two real `shoal serve` replicas with the scrape
configuration and rules of deploy/prometheus (CTest e2e_deploy_prometheus).

Prometheus runs on loopback with a temporary storage folder and a 1 s scrape and rule
interval; its configuration is deploy/prometheus/prometheus.yml with only the targets,
the intervals and the rules' path changed. Under load on `identity`, the test asks
Prometheus's HTTP API for
  - a histogram quantile over shoal_request_duration_seconds_bucket,
  - the recording rule shoal:request_duration_seconds:p99_5m and shoal:requests:rate5m,
  - the relabelled per-instance series (model_instance, no exported_instance),
  - every rule's health, every query of the Grafana dashboard, and
  - the alert ShoalModelNotReady going pending for `add_sub` once it is unloaded from one
    replica (it stays loaded on the other).
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal_deploy as sd  # noqa: E402

try:
    import yaml
except ImportError:  # python3-yaml, installed by scripts/install-deps.sh
    sys.exit("python3-yaml is needed (Debian package python3-yaml)")

DEPLOY = os.path.join(sd.SOURCE_DIR, "deploy", "prometheus")


def api(port, path, **params):
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]


def query(port, expr):
    """The instant vector `expr` as [(labels, value)]."""
    return [(s["metric"], float(s["value"][1])) for s in api(port, "query", query=expr)["result"]]


def main():
    work = sd.TempWorkdir()
    repo = os.path.join(sd.SOURCE_DIR, "examples", "models")
    replicas = [sd.Shoal(work.path, f"replica{i}", repo, ["identity", "add_sub"])
                for i in range(2)]
    prom = None
    stop = threading.Event()
    failures = []
    try:
        for r in replicas:
            r.start()
        for r in replicas:
            r.wait_ready()

        # The committed configuration, pointed at the test's replicas.
        with open(os.path.join(DEPLOY, "prometheus.yml")) as f:
            config = yaml.safe_load(f)
        config["global"]["scrape_interval"] = "1s"
        config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [os.path.join(DEPLOY, p) for p in config["rule_files"]]
        job = next(j for j in config["scrape_configs"] if j["job_name"] == "shoal")
        config["scrape_configs"] = [job]  # no workers here (job shoal-worker)
        job["static_configs"] = [{"targets": [f"127.0.0.1:{r.metrics_port}" for r in replicas]}]
        conf_path = os.path.join(work.path, "prometheus.yml")
        with open(conf_path, "w") as f:
            yaml.safe_dump(config, f)

        port = sd.free_port()
        prom_log = open(os.path.join(work.path, "prometheus.log"), "ab")
        prom = subprocess.Popen(
            [shutil.which("prometheus") or "/usr/bin/prometheus", f"--config.file={conf_path}",
             f"--storage.tsdb.path={os.path.join(work.path, 'data')}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=prom_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        prom_log.close()

        def prom_ready():
            if prom.poll() is not None:
                raise RuntimeError(f"prometheus exited with {prom.returncode}")
            return sd.http_request(port, "GET", "/-/ready", timeout=2)[0] == 200
        sd.wait_until(prom_ready, 30, "Prometheus ready")

        # Steady load on identity, spread over both replicas.
        def load(r):
            values = [1.0, 2.0, 3.0]
            while not stop.is_set():
                status, body = sd.http_request(r.http_port, "POST", "/v2/models/identity/infer",
                                               sd.identity_request(values))
                if status != 200 or not sd.identity_answer_ok(body, values):
                    failures.append((status, body[:200]))
                time.sleep(0.002)
        threads = [threading.Thread(target=load, args=(r,), daemon=True) for r in replicas]
        for t in threads:
            t.start()

        sd.wait_until(lambda: len(query(port, 'up{job="shoal"} == 1')) == 2, 30,
                      "both replicas scraped")

        # A histogram quantile, computed by Prometheus from shoal's buckets.
        expr = ('histogram_quantile(0.99, sum by (le, model) '
                '(rate(shoal_request_duration_seconds_bucket{model="identity"}[10s])))')
        p99 = []

        def have_quantile():
            p99[:] = [v for _, v in query(port, expr) if v == v]  # not NaN
            return bool(p99)
        sd.wait_until(have_quantile, 30, "a p99 from Prometheus")
        assert 0 < p99[0] < 1.0, f"p99 of identity {p99[0]} s, expected within (0, 1) s"
        print(f"histogram_quantile p99 of identity: {p99[0] * 1e3:.3f} ms")

        # The recording rules, evaluated by Prometheus on the real series.
        rec = []

        def have_rules():
            rec[:] = [v for _, v in query(
                port, 'shoal:request_duration_seconds:p99_5m{model="identity"}') if v == v]
            return bool(rec) and any(v > 0 for _, v in query(
                port, 'shoal:requests:rate5m{model="identity"}'))
        sd.wait_until(have_rules, 30, "recording rules with values")
        assert 0 < rec[0] < 1.0, f"shoal:request_duration_seconds:p99_5m = {rec[0]}"
        print(f"shoal:request_duration_seconds:p99_5m{{model=identity}}: {rec[0] * 1e3:.3f} ms")

        # shoal's own `instance` label arrives as model_instance.
        series = query(port, 'shoal_instance_busy_seconds_total{model="identity"}')
        assert series, "no shoal_instance_busy_seconds_total series"
        for labels, _ in series:
            assert labels.get("model_instance", "").startswith("identity_"), labels
            assert "exported_instance" not in labels, labels
            assert labels["instance"].startswith("127.0.0.1:"), labels

        # Every rule evaluates without error against the real series.
        groups = api(port, "rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        alerts = {r["name"] for r in rules if r["type"] == "alerting"}
        for name in ("ShoalP99OverSLO", "ShoalErrorRatioHigh", "ShoalRejectionRatioHigh",
                     "ShoalQueueGrowing", "ShoalModelNotReady", "ShoalServerNotReady",
                     "ShoalInstancesSaturated"):
            assert name in alerts, f"alert {name} not loaded: {sorted(alerts)}"
        sd.wait_until(lambda: all(r.get("lastEvaluation", "").startswith("20") for r in
                                  (x for g in api(port, "rules")["groups"] for x in g["rules"])),
                      30, "every rule evaluated")
        bad = [(r["name"], r.get("lastError")) for g in api(port, "rules")["groups"]
               for r in g["rules"] if r.get("health") != "ok"]
        assert not bad, f"rules in error: {bad}"
        assert not query(port, 'ALERTS{alertname="ShoalModelNotReady"}'), "alert before unload"

        # Every query of the Grafana dashboard is valid PromQL that Prometheus evaluates
        # (variables replaced as Grafana would); the throughput panel has data.
        exprs = subprocess.run([sys.executable, os.path.join(sd.SOURCE_DIR, "deploy", "tests",
                                                             "check_grafana.py"),
                                "--print-exprs"], stdout=subprocess.PIPE, check=True,
                               universal_newlines=True).stdout.splitlines()
        assert len(exprs) > 10, exprs
        for expr in exprs:
            query(port, expr)  # raises on a parse or evaluation error
        assert any(v > 0 for _, v in query(port, next(e for e in exprs if "outcome=" in e))), \
            "the dashboard's throughput query has no data"
        print(f"{len(exprs)} dashboard queries evaluated")

        # Unload add_sub from one replica: it is now ready on fewer replicas than are up.
        status, body = sd.http_request(replicas[1].http_port, "POST",
                                       "/v2/repository/models/add_sub/unload", b"{}")
        assert status == 200, f"unload answered {status} {body!r}"
        pending = []

        def alert_pending():
            pending[:] = query(port, 'ALERTS{alertname="ShoalModelNotReady"}')
            return bool(pending)
        sd.wait_until(alert_pending, 30, "ShoalModelNotReady pending")
        labels = pending[0][0]
        assert labels["model"] == "add_sub" and labels["alertstate"] == "pending", labels
        assert len(pending) == 1, pending
        print(f"alert: {labels}")
        stop.set()
        for t in threads:
            t.join(timeout=10)
        assert not failures, f"inference failures: {failures[:3]}"
        print("OK")
        return 0
    except BaseException:
        for r in replicas:
            sys.stderr.write(f"---- {r.name} log ----\n{r.log()}\n")
        try:
            with open(os.path.join(work.path, "prometheus.log"), errors="replace") as f:
                sys.stderr.write(f"---- prometheus log ----\n{f.read()[-6000:]}\n")
        except OSError:
            pass
        raise
    finally:
        stop.set()
        if prom and prom.poll() is None:
            prom.terminate()
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        for r in replicas:
            r.stop()
        work.cleanup()


if __name__ == "__main__":
    sys.exit(main())
