#!/usr/bin/python3
"""Exports the engine benchmark's models to ONNX and times PyTorch on them.

    /usr/bin/python3 bench/engine/export_models.py OUT_DIR [--threads 2] [--runs 5]
        [--min-seconds 0.5] [--models resnet50,mobilenet_v2,bert_base,vae,mlp,lstm,gru,detector,unet] [--no-time]
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
from torchvision.ops import nms

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


def conv_bn(cin, cout, k=3, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convolutions, projection shortcut when the shape changes)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cout))
        self.short = (nn.Identity() if stride == 1 and cin == cout else
                      nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


class Detector(nn.Module):
    """One-stage detector (RetinaNet-like, small) on 3x320x320 images: ResNet-ish backbone
    (stem 32, stages 32/64/128/256), an FPN (96 channels, nearest-neighbour top-down
    upsampling) over strides 8, 16 and 32, a shared head (two 3x3 convolutions, then box
    deltas and class logits for 3 anchors per location, 20 classes), box decoding against
    constant anchors, and the post-processing inside the graph: the top 300 anchors per
    image by best class score (TopK), a score threshold, and torchvision's NMS (IoU 0.5)
    over all images and classes at once (batched_nms's coordinate trick). Outputs
    have one row per kept detection: boxes [K, 4] (x1, y1, x2, y2), scores [K], labels [K],
    and the image each came from [K]."""

    def __init__(self, classes=20, fpn=96, side=320, pre_nms=300, score_threshold=0.05, iou=0.5):
        super().__init__()
        self.classes, self.pre_nms, self.threshold, self.iou = classes, pre_nms, score_threshold, iou
        self.stem = nn.Sequential(conv_bn(3, 32, 3, 2), conv_bn(32, 32, 3, 2))  # stride 4
        self.c2 = BasicBlock(32, 32, 1)
        self.c3 = nn.Sequential(BasicBlock(32, 64, 2), BasicBlock(64, 64, 1))  # stride 8
        self.c4 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128, 1))  # stride 16
        self.c5 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256, 1))  # stride 32
        self.lat = nn.ModuleList([nn.Conv2d(c, fpn, 1) for c in (64, 128, 256)])
        self.out = nn.ModuleList([nn.Conv2d(fpn, fpn, 3, 1, 1) for _ in range(3)])
        anchors = 3
        self.head = nn.Sequential(nn.Conv2d(fpn, fpn, 3, 1, 1), nn.ReLU(), nn.Conv2d(fpn, fpn, 3, 1, 1), nn.ReLU())
        self.box = nn.Conv2d(fpn, anchors * 4, 3, 1, 1)
        self.cls = nn.Conv2d(fpn, anchors * classes, 3, 1, 1)
        with torch.no_grad():
            # Random weights give near-constant logits (every score ~0.5, all tied). Spread
            # them as a trained head's are: zero-mean, scaled class weights and a low prior, so
            # that on random images about half of the 300 candidates per image pass the
            # threshold and NMS has overlapping boxes of one class to suppress.
            w = self.cls.weight
            w.sub_(w.mean(dim=(1, 2, 3), keepdim=True)).mul_(60.0)
            self.cls.bias.fill_(-4.5)
            self.box.weight.mul_(30.0)
        rows = []
        for stride in (8, 16, 32):
            n = side // stride
            c = (torch.arange(n, dtype=torch.float32) + 0.5) * stride
            cy, cx = torch.meshgrid(c, c, indexing="ij")
            # 3 square anchors per location (4, 6 and 8 strides wide), in the head's channel order
            sizes = torch.tensor([4.0, 6.0, 8.0]) * stride
            a = torch.stack([cx[..., None].expand(n, n, 3), cy[..., None].expand(n, n, 3),
                             sizes.expand(n, n, 3), sizes.expand(n, n, 3)], -1)
            rows.append(a.reshape(-1, 4))
        self.register_buffer("anchors", torch.cat(rows))  # [N, 4]: cx, cy, w, h

    def forward(self, x):
        c3 = self.c3(self.c2(self.stem(x)))
        c4 = self.c4(c3)
        c5 = self.c5(c4)
        p5 = self.lat[2](c5)
        p4 = self.lat[1](c4) + nn.functional.interpolate(p5, scale_factor=2.0, mode="nearest")
        p3 = self.lat[0](c3) + nn.functional.interpolate(p4, scale_factor=2.0, mode="nearest")
        deltas, logits = [], []
        for p, conv in zip((p3, p4, p5), self.out):
            h = self.head(conv(p))
            b = h.shape[0]
            deltas.append(self.box(h).permute(0, 2, 3, 1).reshape(b, -1, 4))
            logits.append(self.cls(h).permute(0, 2, 3, 1).reshape(b, -1, self.classes))
        d = torch.cat(deltas, 1)  # [B, N, 4]
        a = self.anchors
        cx = a[:, 0] + d[..., 0] * 0.1 * a[:, 2]
        cy = a[:, 1] + d[..., 1] * 0.1 * a[:, 3]
        w = a[:, 2] * torch.exp(torch.clamp(d[..., 2] * 0.2, max=4.0))
        h = a[:, 3] * torch.exp(torch.clamp(d[..., 3] * 0.2, max=4.0))
        boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
        scores, labels = torch.sigmoid(torch.cat(logits, 1)).max(-1)  # [B, N]
        top, idx = scores.topk(self.pre_nms, dim=1)  # [B, k]
        b = x.shape[0]
        image = torch.arange(b).unsqueeze(1).expand(b, self.pre_nms).reshape(-1)
        idx = idx.reshape(-1)
        boxes = boxes[image, idx]
        labels = labels[image, idx]
        top = top.reshape(-1)
        # batched_nms's coordinate trick (one NMS over all images and classes: boxes of
        # another image or class are shifted apart so that they never overlap), written out:
        # torchvision.ops.batched_nms wraps it in a scripted emptiness check that exports as
        # an If, which the engine does not run yet. The offset comes from the candidates
        # before the threshold, which are never empty.
        offset = boxes.max() + 1.0
        keep = top > self.threshold
        boxes, top, labels, image = boxes[keep], top[keep], labels[keep], image[keep]
        category = (image * self.classes + labels).to(boxes.dtype)
        kept = nms(boxes + (category * offset)[:, None], top, self.iou)
        return boxes[kept], top[kept], labels[kept], image[kept]


class UNet(nn.Module):
    """Segmentation U-Net on 3x256x256 images: 4 encoder levels (16/32/64/128 channels,
    two 3x3 conv-BN-ReLU each, max pooling between), a 256-channel bottleneck, a decoder
    of 2x2 transposed convolutions, skip concatenations and two 3x3 conv-BN-ReLU per level,
    and a 1x1 convolution to 5 class logits per pixel."""

    def __init__(self, base=16, classes=5):
        super().__init__()
        ch = [base, 2 * base, 4 * base, 8 * base]
        self.down = nn.ModuleList()
        cin = 3
        for c in ch:
            self.down.append(nn.Sequential(conv_bn(cin, c), conv_bn(c, c)))
            cin = c
        self.mid = nn.Sequential(conv_bn(ch[-1], 2 * ch[-1]), conv_bn(2 * ch[-1], 2 * ch[-1]))
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        cin = 2 * ch[-1]
        for c in reversed(ch):
            self.up.append(nn.ConvTranspose2d(cin, c, 2, 2))
            self.dec.append(nn.Sequential(conv_bn(2 * c, c), conv_bn(c, c)))
            cin = c
        self.final = nn.Conv2d(ch[0], classes, 1)

    def forward(self, x):
        skips = []
        for d in self.down:
            x = d(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.mid(x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips)):
            x = dec(torch.cat([up(x), skip], 1))
        return self.final(x)


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
    "detector": (Detector, ["input"], ["boxes", "scores", "labels", "image"], images((3, 320, 320))),
    "unet": (UNet, ["input"], ["logits"], images((3, 256, 256))),
}
# Outputs whose first axis is not the batch (one row per kept detection).
DETECTION_OUTPUTS = {"boxes", "scores", "labels", "image"}


def export(name, model, make_inputs, inputs, outputs, path, gen):
    axes = {n: {0: "detections" if name == "detector" and n in DETECTION_OUTPUTS else "batch"}
            for n in inputs + outputs}
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
