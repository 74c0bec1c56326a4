#!/usr/bin/env python3
"""The producer examples of docs/worker.md, run as they are written (CTest
e2e_worker_producer_example): a real redis-server and a real `shoal worker` serving the
example `identity` model on loopback; the document's Python producer (with Debian's
python3-redis), pointed at that Redis, must print the model's answer, and its redis-cli
commands must leave an OK result for their request id.

Environment (set by CTest): SHOAL_SOURCE_DIR, SHOAL_BINARY_DIR.
"""
import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SOURCE = os.environ.get("SHOAL_SOURCE_DIR",
                        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BINARY = os.environ.get("SHOAL_BINARY_DIR", os.path.join(SOURCE, "build"))
DOC = os.path.join(SOURCE, "docs", "worker.md")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def producer_blocks():
    """The Python block and the redis-cli block under "## A producer"."""
    with open(DOC) as f:
        text = f.read()
    section = text.split("## A producer", 1)[1].split("\n## ", 1)[0]
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shell = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return python, shell


def wait_until(what, timeout_s, fn):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.1)
    raise TimeoutError(what)


def main():
    python, shell = producer_blocks()
    work = tempfile.mkdtemp(prefix="shoal-producer-")
    procs = []
    try:
        port = free_port()
        redis = subprocess.Popen(
            [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", work],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(redis)

        def redis_up():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False
        wait_until("redis-server up", 20, redis_up)

        repo = os.path.join(work, "models")
        os.makedirs(repo)
        os.symlink(os.path.join(SOURCE, "examples", "models", "identity"),
                   os.path.join(repo, "identity"))
        log = open(os.path.join(work, "worker.log"), "wb")
        worker = subprocess.Popen(
            [os.path.join(BINARY, "src", "cli", "shoal"), "worker",
             "--redis", f"redis://127.0.0.1:{port}", "--stream", "jobs", "--group", "workers",
             "--model-repository", repo, "--backend-directory", os.path.join(BINARY, "backends"),
             "--allow-metrics", "false"],
            stdout=log, stderr=subprocess.STDOUT)
        procs.append(worker)

        # The document's Python producer, as written but for the port.
        assert 'port=6379' in python, "the example no longer connects to port 6379"
        code = python.replace("port=6379", f"port={port}")
        ast.parse(code)
        run = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=60)
        out = run.stdout.decode(errors="replace")
        print("python producer printed:", out.strip())
        problems = []
        if run.returncode != 0:
            problems.append(f"the Python producer failed ({run.returncode}):\n{out}")
        else:
            answer = ast.literal_eval(out.strip().splitlines()[-1])
            outputs = answer.get("outputs", [])
            if (answer.get("model_name") != "identity" or len(outputs) != 1 or
                    outputs[0].get("name") != "OUTPUT0" or outputs[0].get("data") != [1, 2, 3]):
                problems.append(f"unexpected answer from the Python producer: {answer}")

        # The redis-cli commands, with the test's port.
        cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
        commands = shell.replace("\\\n", " ").strip().splitlines()
        assert len(commands) == 2 and commands[0].startswith("redis-cli XADD"), commands
        add = subprocess.run(commands[0].replace("redis-cli", f"{cli} -p {port}", 1),
                             shell=True, stdout=subprocess.PIPE, timeout=20)
        if add.returncode != 0:
            problems.append("redis-cli XADD failed")
        got = {}

        def answered():
            r = subprocess.run(commands[1].replace("redis-cli", f"{cli} -p {port}", 1),
                               shell=True, stdout=subprocess.PIPE, timeout=20)
            lines = r.stdout.decode().splitlines()
            got.clear()
            got.update(zip(lines[0::2], lines[1::2]))
            return "status" in got
        try:
            wait_until("a result for r1", 30, answered)
        except TimeoutError:
            problems.append("no result for the redis-cli request r1")
        print("redis-cli result:", got)
        if got:
            try:
                body = json.loads(got.get("body", ""))
            except ValueError:
                body = {}
            if (got.get("status") != "OK" or body.get("id") != "r1" or
                    [o.get("data") for o in body.get("outputs", [])] != [[1, 2, 3]]):
                problems.append(f"unexpected result for r1: {got}")
        if problems:
            log.flush()
            with open(os.path.join(work, "worker.log"), errors="replace") as f:
                sys.stderr.write("---- worker log ----\n" + f.read())
            for p in problems:
                print("FAIL:", p)
            return 1
        print("OK")
        return 0
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
