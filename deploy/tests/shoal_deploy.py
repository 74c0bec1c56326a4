"""Processes for the deploy/ end-to-end tests and bench/scale_out: real `shoal serve`
replicas, a real nginx and a real Prometheus, each on its own loopback ports, with its
files in a temporary folder. Standard library only.

The shoal binary is $SHOAL_BINARY_DIR/src/cli/shoal (CTest sets SHOAL_BINARY_DIR), or
$SHOAL_BUILD/src/cli/shoal, or build/src/cli/shoal under the source tree.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

SOURCE_DIR = os.environ.get(
    "SHOAL_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def shoal_binary():
    if os.environ.get("SHOAL_BINARY_DIR"):
        return os.path.join(os.environ["SHOAL_BINARY_DIR"], "src", "cli", "shoal")
    build = os.environ.get("SHOAL_BUILD", os.path.join(SOURCE_DIR, "build"))
    return os.path.join(build, "src", "cli", "shoal")


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(done, timeout_s=20.0, what="condition"):
    """Polls done() until true; raises TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if done():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def http_request(port, method, path, body=None, headers=None, timeout=10.0):
    """(status, body bytes) of one request to 127.0.0.1:port on a fresh connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def metric_sum(text, name, **labels):
    """Sum of the samples of `name` in a Prometheus text scrape whose labels include `labels`."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != name:
            continue
        have = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if "=" in kv)
        if all(have.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(value)
            found = True
    return total if found else None


class Shoal:
    """One `shoal serve` replica on its own three loopback ports."""

    def __init__(self, workdir, name, model_repository, models, extra_args=()):
        self.name = name
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.args = [shoal_binary(), "serve", "--model-repository", model_repository,
                     "--address", "127.0.0.1", "--http-port", str(self.http_port),
                     "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
                     "--model-control-mode", "explicit"]
        for m in models:
            self.args += ["--load-model", m]
        self.args += list(extra_args)
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.proc = None

    def start(self):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        return self

    def wait_ready(self, timeout_s=30.0):
        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            return http_request(self.http_port, "GET", "/v2/health/ready", timeout=2)[0] == 200
        wait_until(ready, timeout_s, f"{self.name} ready")
        return self

    def metrics(self):
        status, body = http_request(self.metrics_port, "GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"{self.name} /metrics answered {status}")
        return body.decode()

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-8000:]
        except OSError:
            return ""


class Nginx:
    """nginx in the foreground with its own prefix, config from deploy/nginx's template."""

    def __init__(self, workdir, replicas, max_fails=2, fail_timeout="5s"):
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "render", os.path.join(SOURCE_DIR, "deploy", "nginx", "render.py"))
        render = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(render)
        self.prefix = os.path.join(workdir, "nginx")
        for d in ("logs", "temp"):
            os.makedirs(os.path.join(self.prefix, d), exist_ok=True)
        # Run as root, nginx's workers become `nobody`, and must reach their temp files.
        for d in (workdir, self.prefix):
            os.chmod(d, 0o755)
        self.http_port, self.grpc_port = free_port(), free_port()
        self.conf = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(render.render(f"127.0.0.1:{self.http_port}", f"127.0.0.1:{self.grpc_port}",
                                  [f"127.0.0.1:{r.http_port}" for r in replicas],
                                  [f"127.0.0.1:{r.grpc_port}" for r in replicas],
                                  max_fails, fail_timeout))
        self.proc = None

    def start(self):
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen(
            [nginx, "-p", self.prefix, "-c", self.conf, "-e", "stderr", "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.prefix, "stderr.log"), "ab"),
            stdin=subprocess.DEVNULL)

        def listening():
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.proc.returncode}:\n{self.log()}")
            with socket.create_connection(("127.0.0.1", self.http_port), timeout=1):
                return True
        wait_until(listening, 20, "nginx listening")
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: finish open requests
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self):
        out = []
        for name in ("stderr.log", "logs/error.log"):
            try:
                with open(os.path.join(self.prefix, name), errors="replace") as f:
                    out.append(f.read()[-4000:])
            except OSError:
                pass
        return "\n".join(out)

    def access_log(self):
        with open(os.path.join(self.prefix, "logs", "access.log"), errors="replace") as f:
            return f.read()


def identity_request(values):
    """Body of a KServe v2 JSON infer request to the example `identity` model."""
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                   "shape": [1, len(values)], "data": values}]}).encode()


def identity_answer_ok(body, values):
    try:
        out = json.loads(body)["outputs"][0]
        return out["name"] == "OUTPUT0" and [float(v) for v in out["data"]] == values
    except (ValueError, KeyError, IndexError, TypeError):
        return False


class TempWorkdir:
    def __init__(self, keep=None):
        self.path = keep or tempfile.mkdtemp(prefix="shoal-deploy-")
        os.makedirs(self.path, exist_ok=True)
        self.keep = bool(keep)

    def cleanup(self):
        if not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)
