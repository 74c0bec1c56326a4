#!/usr/bin/python3
"""Exports the engine benchmark's models to ONNX and times PyTorch on them.

    /usr/bin/python3 bench/engine/export_models.py OUT_DIR [--threads 2] [--runs 5]
        [--min-seconds 0.5] [--models resnet50,mobilenet_v2,bert_base,vae,mlp,lstm,gru] [--no-time]
        [--skip-existing]

Builds each model with random weights, writes OUT_DIR/<model>.onnx (opset 17, symbolic
batch axis), then times PyTorch itself on it: frozen TorchScript (trace, freeze,
optimize_for_inference), torch.set_num_threads(THREADS), at batch 1 and 8; each timed run
repeats inference until it lasts MIN_SECONDS, and the figure is the median items/s over
RUNS runs after warm-up. --skip-existing keeps an OUT_DIR/<model>.onnx already there
(built by an earlier run of this script) instead of exporting it again. Writes OUT_DIR/pytorch.json:
    {"threads": 2, "results": {"resnet50": {"1": items_per_s, "8": ...}, ...},
     "notes": {"resnet50": "..."}}
Run it with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (bench/engine/run.sh does) so that
PyTorch's matmuls use OpenBLAS's best kernels; see docs/platform-notes.md.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torchvision.models as tvm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
import generate  # noqa: E402  (the test models' architectures, reused at full size)

BATCHES = (1, 8)
SEQ = 128
RNN_SEQ = 64  # tokens per sample for the recurrent classifiers


class MlpRecommender(nn.Module):
    """generate.MlpRecommender at benchmark size: 32 dense features + two 16-wide
    embeddings -> MLP 64-256-128-1 -> sigmoid."""

    def __init__(self, users=10000, items=50000, dense=32, emb=16):
        super().__init__()
        self.user = nn.Embedding(users, emb)
        self.item = nn.Embedding(items, emb)
        self.mlp = nn.Sequential(nn.Linear(dense + 2 * emb, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                 nn.Linear(128, 1))

    def forward(self, dense, ids):
        e = torch.cat([dense, self.user(ids[:, 0]), self.item(ids[:, 1])], dim=1)
        return torch.sigmoid(self.mlp(e))


class Vae(nn.Module):
    """generate.TinyVae at benchmark size: 1x64x64 images, 32/64 channels, latent 128."""

    def __init__(self, c1=32, c2=64, latent=128, side=64):
        super().__init__()
        self.c2, self.s = c2, side // 4
        flat = c2 * self.s * self.s
        self.enc = nn.Sequential(nn.Conv2d(1, c1, 3, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(c1, c2, 3, 2, 1), nn.ReLU())
        self.mu = nn.Linear(flat, latent)
        self.logvar = nn.Linear(flat, latent)
        self.dec_in = nn.Linear(latent, flat)
        self.dec = nn.Sequential(nn.ConvTranspose2d(c2, c1, 3, 2, 1, output_padding=1), nn.ReLU(),
                                 nn.ConvTranspose2d(c1, 1, 3, 2, 1, output_padding=1))

    def forward(self, x):
        h = torch.flatten(self.enc(x), 1)
        mu, logvar = self.mu(h), self.logvar(h)
        z = self.dec_in(mu).view(-1, self.c2, self.s, self.s)
        return torch.sigmoid(self.dec(z)), mu, torch.exp(0.5 * logvar)


class RecurrentClassifier(nn.Module):
    """Text classifier: token embedding (10000 x 128) -> two-layer LSTM or GRU (hidden 256,
    batch first) -> linear layer (10 classes) on the last layer's final hidden state."""

    def __init__(self, cell, vocab=10000, emb=128, hidden=256, layers=2, classes=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = cell(emb, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, ids):
        _, h = self.rnn(self.emb(ids))
        h = h[0] if isinstance(h, tuple) else h  # LSTM: (h, c)
        return self.fc(h[-1])


def token_inputs(b, g):
    return [torch.randint(0, 10000, (b, RNN_SEQ), generator=g)]


def bert_base():
    # generate.TinyBert with LayerNormalization at BERT-base size: 12 layers, hidden 768,
    # 12 heads, FFN 3072, vocabulary 30522, 512 positions.
    return generate.TinyBert(False, vocab=30522, d=768, heads=12, layers=12, max_len=512)


def images(shape):
    return lambda b, g: [torch.randn((b,) + shape, generator=g)]


def bert_inputs(b, g):
    return [torch.randint(0, 30522, (b, SEQ), generator=g), torch.ones(b, SEQ, dtype=torch.int64)]


def mlp_inputs(b, g):
    return [torch.randn(b, 32, generator=g),
            torch.stack([torch.randint(0, 10000, (b,), generator=g), torch.randint(0, 50000, (b,), generator=g)], 1)]


# name -> (constructor, input names, output names, inputs(batch, generator))
MODELS = {
    "resnet50": (lambda: tvm.resnet50(weights=None), ["input"], ["logits"], images((3, 224, 224))),
    "mobilenet_v2": (lambda: tvm.mobilenet_v2(weights=None), ["input"], ["logits"], images((3, 224, 224))),
    "bert_base": (bert_base, ["input_ids", "attention_mask"], ["hidden", "pooled"], bert_inputs),
    "vae": (Vae, ["input"], ["reconstruction", "mu", "std"], images((1, 64, 64))),
    "mlp": (MlpRecommender, ["dense", "ids"], ["score"], mlp_inputs),
    "lstm": (lambda: RecurrentClassifier(nn.LSTM), ["ids"], ["logits"], token_inputs),
    "gru": (lambda: RecurrentClassifier(nn.GRU), ["ids"], ["logits"], token_inputs),
}


def export(name, model, make_inputs, inputs, outputs, path, gen):
    axes = {n: {0: "batch"} for n in inputs + outputs}
    for opset in (17, 13):
        try:
            torch.onnx.export(model, tuple(make_inputs(2, gen)), path, input_names=inputs, output_names=outputs,
                              opset_version=opset, dynamic_axes=axes, do_constant_folding=True)
            return opset
        except Exception as e:  # noqa: BLE001 - fall back to opset 13
            print("%s: export at opset %d failed: %s" % (name, opset, e), file=sys.stderr)
    raise RuntimeError("%s: export failed" % name)


def scripted(model, args):
    """Frozen, inference-optimized TorchScript; (module, note)."""
    with torch.no_grad():
        frozen = torch.jit.freeze(torch.jit.trace(model, tuple(args)).eval())
        try:
            return torch.jit.optimize_for_inference(frozen), ""
        except Exception as e:  # noqa: BLE001
            return frozen, "optimize_for_inference failed (%s); frozen only" % type(e).__name__


def time_items_per_s(fn, batch, runs, min_seconds):
    fn()  # warm-up: the first calls run TorchScript's profiling executor
    fn()
    t0 = time.perf_counter()
    fn()
    per_call = max(time.perf_counter() - t0, 1e-6)
    iters = max(1, int(min_seconds / per_call + 0.999))
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        rates.append(batch * iters / (time.perf_counter() - t0))
    return statistics.median(rates)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--min-seconds", type=float, default=0.5)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--no-time", action="store_true", help="export only")
    p.add_argument("--skip-existing", action="store_true", help="keep OUT/<model>.onnx when present")
    opts = p.parse_args()
    os.makedirs(opts.out, exist_ok=True)
    torch.set_num_threads(opts.threads)
    result = {"threads": opts.threads, "torch": torch.__version__, "results": {}, "notes": {}}
    for name in opts.models.split(","):
        ctor, inputs, outputs, make_inputs = MODELS[name]
        torch.manual_seed(0)
        model = ctor().eval()
        gen = torch.Generator().manual_seed(1234)
        generate.randomize_bn(model, gen)
        t0 = time.perf_counter()
        path = os.path.join(opts.out, name + ".onnx")
        if opts.skip_existing and os.path.exists(path):
            make_inputs(2, gen)  # as export does, so the timing inputs are the same
            print("%s: reusing %s" % (name, path), file=sys.stderr, flush=True)
        else:
            opset = export(name, model, make_inputs, inputs, outputs, path, gen)
            print("%s: exported opset %d, %.1f MB in %.1f s" % (name, opset, os.path.getsize(path) / 1e6,
                                                                time.perf_counter() - t0), file=sys.stderr, flush=True)
        if opts.no_time:
            continue
        figures, notes = {}, []
        for b in BATCHES:
            args = make_inputs(b, gen)
            try:
                mod, note = scripted(model, args)
                if note and note not in notes:
                    notes.append(note)
                with torch.no_grad():
                    figures[str(b)] = time_items_per_s(lambda: mod(*args), b, opts.runs, opts.min_seconds)
            except Exception as e:  # noqa: BLE001 - report, keep going
                notes.append("batch %d: %s: %s" % (b, type(e).__name__, str(e).splitlines()[0][:200]))
            print("%s: batch %d: PyTorch %s items/s" % (name, b, "%.2f" % figures[str(b)] if str(b) in figures
                                                         else "failed"), file=sys.stderr, flush=True)
        result["results"][name] = figures
        if notes:
            result["notes"][name] = "; ".join(notes)
    if not opts.no_time:
        with open(os.path.join(opts.out, "pytorch.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
