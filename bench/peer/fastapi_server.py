#!/usr/bin/python3
"""The benchmark's peer: the PyTorch model server a user would write in an afternoon.

FastAPI + uvicorn + PyTorch, serving the example repository's `recommender` and
`image_classifier` with the same weights shoal serves, over the KServe v2 HTTP/JSON
subset `shoal bench` uses:

    GET  /v2/health/live, /v2/health/ready, /v2/models/{m}/ready
    GET  /v2/models/{m}          metadata: name, versions, platform, inputs, outputs
    GET  /v2/models/{m}/config   {"max_batch_size": --max-batch} (so clients send a batch axis)
    GET  /v2/models/{m}/stats    forwards and rows run so far (mean batch size), also in
                                 Triton's `model_stats` shape, which `shoal bench` reads
    POST /v2/models/{m}/infer    {"inputs": [{name, shape, datatype, data (flat or nested)}]}
                                 -> {"model_name", "model_version", "outputs": [...]}
                                 or the binary tensor extension (what `shoal bench` sends):
                                 a JSON header of Inference-Header-Content-Length bytes with
                                 `binary_data_size` per input, then the raw bytes; the reply
                                 is binary too when `binary_data_output` (or an output's
                                 `binary_data`) is set

Two modes:

    --mode plain     one request at a time: each forward runs on the event loop
    --mode batching  an asyncio queue per model; a batch is released when it holds
                     --max-batch rows or its first request has waited --max-delay-ms;
                     one forward per batch, run in a worker thread so the next batch forms

Threads: `torch.set_num_threads(--threads)` (default 2: the two cores shoal's example
configs use in total) and one inter-op thread, so both servers compute on the same
number of cores. uvicorn runs one worker process (the default) -- a second worker would
load a second copy of each model and double the threads.

Needs Debian's python3-torch, python3-onnx, python3-fastapi, python3-uvicorn:

    apt-get install -y --no-install-recommends python3-fastapi python3-uvicorn
    /usr/bin/python3 bench/peer/fastapi_server.py --port 8500 --mode batching

The weights come from examples/models/<m>/1/model.onnx (initializers copied into an
equivalent torch.nn module; BatchNormalization is already folded into the convolutions
there), and at startup each model is checked against tests/e2e/examples/<m>.json, the
PyTorch reference the end-to-end test also uses.
"""
import argparse
import asyncio
import concurrent.futures
import json
import os
import sys
import time

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}


# ---------------------------------------------------------------- the models, in PyTorch
def recommender():
    return nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 512),
                         nn.ReLU(), nn.Linear(512, 1), nn.Sigmoid())


def image_classifier():
    def conv(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]

    return nn.Sequential(*conv(3, 32), *conv(32, 32), nn.MaxPool2d(2), *conv(32, 64), nn.MaxPool2d(2),
                         *conv(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


# name: (constructor, inputs [(name, datatype, shape without batch)], outputs [...])
MODELS = {
    "recommender": (recommender, [("features", "FP32", [64])], [("score", "FP32", [1])]),
    "image_classifier": (image_classifier, [("image", "FP32", [3, 32, 32])], [("logits", "FP32", [10])]),
}


def load_weights(module, onnx_path):
    """Copies the ONNX file's Conv and Gemm weights, in graph order, into the module's
    Conv2d and Linear layers, in module order."""
    g = onnx.load(onnx_path).graph
    init = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    params = [[init[n.input[1]], init[n.input[2]]] for n in g.node if n.op_type in ("Conv", "Gemm")]
    for n in g.node:  # Gemm with transB=0 stores W as [in, out]
        if n.op_type == "Gemm" and not any(a.name == "transB" and a.i == 1 for a in n.attribute):
            raise ValueError("unexpected Gemm layout in " + onnx_path)
    layers = [m for m in module.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    if len(layers) != len(params):
        raise ValueError("%s has %d Conv/Gemm nodes, the module %d layers" % (onnx_path, len(params), len(layers)))
    with torch.no_grad():
        for layer, (w, b) in zip(layers, params):
            layer.weight.copy_(torch.from_numpy(w.copy()))
            layer.bias.copy_(torch.from_numpy(b.copy()))
    return module.eval()


def self_check(name, model):
    path = os.path.join(ROOT, "tests", "e2e", "examples", name + ".json")
    if not os.path.exists(path):
        return
    ref = json.load(open(path))
    x = torch.from_numpy(np.asarray(ref["inputs"][0]["data"], np.float32).reshape(ref["inputs"][0]["shape"]))
    want = np.asarray(ref["outputs"][0]["data"], np.float32).reshape(ref["outputs"][0]["shape"])
    with torch.inference_mode():
        got = model(x).numpy()
    err = float(np.abs(got - want).max())
    if err > 1e-4 * max(1.0, float(np.abs(want).max())):
        sys.exit("%s: PyTorch differs from the reference by %g" % (name, err))
    print("%s: matches tests/e2e/examples/%s.json (max |diff| %.2g)" % (name, name, err), flush=True)


# ---------------------------------------------------------------- protocol
class BadRequest(Exception):
    pass


def parse_request(model, body, header_length=None):
    """Returns (id, input tensor, binary_output). The body is JSON, or -- the binary tensor
    extension, what `shoal bench` and Triton's clients send -- a JSON header of
    `header_length` bytes followed by the raw tensor bytes (`binary_data_size` each)."""
    raw = b""
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise BadRequest("Inference-Header-Content-Length is beyond the body")
        body, raw = body[:header_length], body[header_length:]
    try:
        req = json.loads(body)
        tensors = req["inputs"]
    except (ValueError, KeyError, TypeError):
        raise BadRequest("the body must be a JSON object with 'inputs'")
    spec_in = MODELS[model][1]
    if len(tensors) != len(spec_in):
        raise BadRequest("expected %d inputs, got %d" % (len(spec_in), len(tensors)))
    t = tensors[0]
    name, datatype, dims = spec_in[0]
    if t.get("name") != name or t.get("datatype") != datatype:
        raise BadRequest("expected input '%s' of %s" % (name, datatype))
    shape = t.get("shape")
    if not isinstance(shape, list) or len(shape) != len(dims) + 1 or shape[1:] != dims or shape[0] < 1:
        raise BadRequest("input '%s' must have shape [batch, %s]" % (name, ", ".join(map(str, dims))))
    dtype = np.dtype(DTYPES[datatype])
    size = (t.get("parameters") or {}).get("binary_data_size")
    try:
        if size is not None:
            if size != len(raw) or size != int(np.prod(shape)) * dtype.itemsize:
                raise BadRequest("input '%s': binary_data_size %s does not match shape %s and the body"
                                 % (name, size, shape))
            arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        else:
            arr = np.asarray(t["data"], dtype=dtype).reshape(shape)
    except (ValueError, KeyError, TypeError):
        raise BadRequest("input '%s': data does not match shape %s" % (name, shape))
    params = req.get("parameters") or {}
    binary_out = bool(params.get("binary_data_output")) or any(
        bool((o.get("parameters") or {}).get("binary_data")) for o in req.get("outputs") or [])
    return req.get("id"), torch.from_numpy(arr), binary_out


def response(model, request_id, out, binary=False):
    """Returns (body bytes, JSON header length or None): JSON data, or the binary extension
    (a JSON header, then the output's raw bytes)."""
    name, datatype, _ = MODELS[model][2][0]
    out = np.ascontiguousarray(out, dtype=DTYPES[datatype])
    tensor = {"name": name, "datatype": datatype, "shape": list(out.shape)}
    if binary:
        tensor["parameters"] = {"binary_data_size": out.nbytes}
    else:
        tensor["data"] = out.reshape(-1).tolist()
    body = {"model_name": model, "model_version": "1", "outputs": [tensor]}
    if request_id is not None:
        body["id"] = request_id
    header = json.dumps(body).encode()
    if not binary:
        return header, None
    return header + out.tobytes(), len(header)


# ---------------------------------------------------------------- batching
class Batcher:
    """Collects requests for one model: a batch leaves when it holds max_batch rows or its
    first request has waited max_delay; one forward per batch, in a worker thread."""

    def __init__(self, model, max_batch, max_delay_s, counters):
        self.model, self.max_batch, self.max_delay = model, max_batch, max_delay_s
        self.counters = counters
        self.queue = asyncio.Queue()
        self.pending = None  # a request taken from the queue that did not fit the last batch
        # One worker thread: PyTorch's intra-op pool belongs to the calling thread, so a
        # pool of executor threads would start a team of --threads threads each.
        # The thread count is per thread in OpenMP, so the worker sets its own.
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),))

    async def infer(self, x):
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((x, fut))
        return await fut

    async def run(self):
        loop = asyncio.get_running_loop()
        while True:
            first = self.pending or await self.queue.get()
            self.pending = None
            batch, rows = [first], first[0].shape[0]
            deadline = loop.time() + self.max_delay
            while rows < self.max_batch:
                # Take what is already queued first: one wait_for costs this event loop
                # about as long as a short delay, so waiting for each item in turn would
                # time out after the second one however many were queued.
                try:
                    item = self.queue.get_nowait()
                except asyncio.QueueEmpty:
                    timeout = deadline - loop.time()
                    if timeout <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self.queue.get(), timeout)
                    except asyncio.TimeoutError:
                        break
                if rows + item[0].shape[0] > self.max_batch:
                    self.pending = item
                    break
                batch.append(item)
                rows += item[0].shape[0]
            try:
                x = torch.cat([b[0] for b in batch]) if len(batch) > 1 else batch[0][0]
                out = await loop.run_in_executor(self.executor, forward, self.model, x)
                self.counters["batches"] += 1
                self.counters["rows"] += rows
                start = 0
                for xb, fut in batch:
                    n = xb.shape[0]
                    if not fut.cancelled():
                        fut.set_result(out[start:start + n])
                    start += n
            except Exception as e:  # noqa: BLE001 -- the requests get the error
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)


def forward(model, x):
    with torch.inference_mode():
        return model(x).numpy()


# ---------------------------------------------------------------- the app
def make_app(opts):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    models = {}
    for name in opts.models.split(","):
        ctor = MODELS[name][0]
        models[name] = load_weights(ctor(), os.path.join(ROOT, "examples", "models", name, "1", "model.onnx"))
        self_check(name, models[name])
    batchers = {}
    counters = {name: {"batches": 0, "rows": 0, "requests": 0, "ns": 0} for name in models}
    app = FastAPI()

    @app.on_event("startup")
    async def start_batchers():
        if opts.mode == "batching":
            for name, m in models.items():
                batchers[name] = Batcher(m, opts.max_batch, opts.max_delay_ms / 1000.0, counters[name])
                asyncio.get_running_loop().create_task(batchers[name].run())
        for name, m in models.items():  # warm up: first calls allocate and pick kernels
            for n in (1, opts.max_batch):
                forward(m, torch.zeros([n] + MODELS[name][1][0][2]))

    def error(status, msg):
        return JSONResponse({"error": msg}, status_code=status)

    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    async def health():
        return Response(status_code=200)

    @app.get("/v2")
    async def server_metadata():
        return {"name": "fastapi-pytorch-peer", "version": torch.__version__, "extensions": []}

    @app.get("/v2/models/{model}/ready")
    async def model_ready(model: str):
        return Response(status_code=200 if model in models else 404)

    @app.get("/v2/models/{model}")
    async def metadata(model: str):
        if model not in models:
            return error(404, "unknown model '%s'" % model)
        _, ins, outs = MODELS[model]
        def tensors(specs):
            return [{"name": n, "datatype": d, "shape": [-1] + dims} for n, d, dims in specs]
        return {"name": model, "versions": ["1"], "platform": "pytorch", "inputs": tensors(ins),
                "outputs": tensors(outs)}

    @app.get("/v2/models/{model}/config")
    async def config(model: str):
        if model not in models:
            return error(404, "unknown model '%s'" % model)
        return {"name": model, "max_batch_size": opts.max_batch}

    @app.get("/v2/models/{model}/stats")
    async def stats(model: str):
        # Triton's statistics shape (what `shoal bench` reads: executions and inferences,
        # so it reports the mean batch size), plus the plain counters.
        if model not in models:
            return error(404, "unknown model '%s'" % model)
        c = counters[model]
        return {"model": model, "mode": opts.mode, "batches": c["batches"], "rows": c["rows"],
                "model_stats": [{"name": model, "version": "1", "inference_count": c["rows"],
                                 "execution_count": c["batches"],
                                 "inference_stats": {"success": {"count": c["requests"], "ns": c["ns"]}}}]}

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: Request):
        if model not in models:
            return error(404, "unknown model '%s'" % model)
        start = time.monotonic_ns()
        header = request.headers.get("inference-header-content-length")
        try:
            request_id, x, binary = parse_request(model, await request.body(),
                                                  int(header) if header is not None else None)
        except (BadRequest, ValueError) as e:
            return error(400, str(e))
        c = counters[model]
        if model in batchers:
            out = await batchers[model].infer(x)
        else:
            out = forward(models[model], x)
            c["batches"] += 1
            c["rows"] += x.shape[0]
        body, header_length = response(model, request_id, out, binary)
        c["requests"] += 1
        c["ns"] += time.monotonic_ns() - start
        if header_length is None:
            return Response(body, media_type="application/json")
        return Response(body, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(header_length)})

    return app


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8500)
    p.add_argument("--mode", choices=["plain", "batching"], default="plain")
    p.add_argument("--max-batch", type=int, default=32, help="batching: most rows per forward")
    p.add_argument("--max-delay-ms", type=float, default=2.0, help="batching: longest wait of a batch's first request")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--models", default="recommender,image_classifier")
    opts = p.parse_args()
    torch.set_num_threads(opts.threads)
    torch.set_num_interop_threads(1)
    import uvicorn
    app = make_app(opts)
    print("serving %s on %s:%d, mode %s, %d torch threads" % (opts.models, opts.host, opts.port, opts.mode,
                                                            opts.threads), flush=True)
    uvicorn.run(app, host=opts.host, port=opts.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
