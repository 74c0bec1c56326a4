#!/usr/bin/python3
"""Writes the ONNX models of the example repository and the end-to-end test's references.

Run with Debian's interpreter (it sees python3-torch, python3-onnx, python3-sklearn):

    /usr/bin/python3 examples/models/generate.py              # every model
    /usr/bin/python3 examples/models/generate.py --only vae   # recommender, image_classifier,
                                                              # text_classifier, vae, refs

It trains, with fixed seeds, on a single thread (so reruns give the same weights):

- recommender       MLP 64 -> 1024 -> 1024 -> 512 -> 1 (ReLU, sigmoid score; 1.6M multiply-adds
                    per row, the size of a production ranking model's MLP) on synthetic click logs:
                    2000 users and 500 items drawn from a hidden latent-factor model; each
                    row is 32 user features + 32 item features, the label a sampled click.
- image_classifier  CNN (3 conv/BN/ReLU blocks, pooling, 10 classes) on 3x32x32 colour
                    images made from scikit-learn's handwritten digits (scaled to 24x24,
                    placed at a random offset, random foreground/background colours, noise).
- text_classifier   transformer encoder (embedding + positions, 2 layers, 4 heads, d=64,
                    mean pool, linear) over 32 token ids, on a synthetic sentiment task:
                    ids 1-50 are "positive" words, 51-100 "negative", 101-999 neutral, 0
                    padding; the class is negative / neutral / positive by the difference.
- encoder, decoder  a VAE on the 8x8 digits (the `digits` model's input), split in two:
                    encoder image [1,8,8] -> mu [16], logvar [16]; decoder z [16] -> image
                    [1,8,8] in 0..1, so encoder -> decoder -> digits chains.

- latent_walk       no training: z = mu + step * exp(logvar / 2), a step of `step` posterior
                    standard deviations away from the encoder's mean (perturbing a latent code).
- latent_mix        no training: z = (1 - alpha) * z_a + alpha * z_b (interpolating two codes).
  The ensembles vae_walk (encoder -> latent_walk -> decoder) and vae_blend (two encoders
  in parallel -> latent_mix -> decoder) run them between the VAE's halves; `--only
  pipeline` rebuilds these two models and the four references from the committed encoder
  and decoder weights, without retraining.

Every model is exported at opset 17 with a symbolic batch dimension to
examples/models/<model>/1/model.onnx. `digits` is not retrained here: it is a copy of
models/digits.onnx, written by models/generate.py.

It also writes tests/e2e/examples/<model>.json for every model of the repository: the
input of one request (KServe v2 JSON tensors) and the expected outputs (PyTorch's, for the
ONNX models, computed on exactly the float32 values written), read by
tests/e2e/examples_test.cc.
"""
import argparse
import json
import os
import struct

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REFS = os.path.join(ROOT, "tests", "e2e", "examples")
OPSET = 17


# ---------------------------------------------------------------- the models
class Recommender(nn.Module):
    """Ranking MLP: user and item features in, click probability out."""

    def __init__(self, features=64):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(features, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                 nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 1))

    def forward(self, features):
        return torch.sigmoid(self.mlp(features))


def conv_bn(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class ImageClassifier(nn.Module):
    """3x32x32 -> 10 logits: conv/BN/ReLU blocks with max pooling, global average pool."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(*conv_bn(3, 32), *conv_bn(32, 32), nn.MaxPool2d(2),  # 16x16
                                      *conv_bn(32, 64), nn.MaxPool2d(2),  # 8x8
                                      *conv_bn(64, 128), nn.AdaptiveAvgPool2d(1))
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(128, classes)

    def forward(self, image):
        return self.fc(self.dropout(torch.flatten(self.features(image), 1)))


class EncoderLayer(nn.Module):
    """Post-norm transformer encoder layer (what BERT uses), written out so the export is
    plain MatMul/Softmax/LayerNormalization rather than PyTorch's fused fast path."""

    def __init__(self, d, heads, ff):
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)

        def heads(t):
            return t.reshape(b, s, self.h, d // self.h).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        att = F.softmax(q @ k.transpose(-1, -2) / float(d // self.h) ** 0.5, dim=-1)
        att = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.drop(self.o(att)))
        return self.ln2(x + self.drop(self.ff2(F.gelu(self.ff1(x)))))


class TextClassifier(nn.Module):
    def __init__(self, vocab=1000, seq=32, d=64, heads=4, ff=256, layers=2, classes=3):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.02 * torch.randn(1, seq, d))
        self.layers = nn.ModuleList(EncoderLayer(d, heads, ff) for _ in range(layers))
        self.fc = nn.Linear(d, classes)

    def forward(self, input_ids):
        x = self.tok(input_ids) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.fc(x.mean(dim=1))


LATENT = 16


class VaeEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU())
        self.fc = nn.Sequential(nn.Linear(64 * 4 * 4, 128), nn.ReLU())
        self.mu = nn.Linear(128, LATENT)
        self.logvar = nn.Linear(128, LATENT)

    def forward(self, image):
        h = self.fc(torch.flatten(self.conv(image), 1))
        return self.mu(h), self.logvar(h)


class VaeDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(LATENT, 128), nn.ReLU(), nn.Linear(128, 64 * 4 * 4), nn.ReLU())
        self.deconv = nn.Sequential(nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 1, 3, padding=1))

    def forward(self, z):
        return torch.sigmoid(self.deconv(self.fc(z).reshape(-1, 64, 4, 4)))


class LatentWalk(nn.Module):
    def forward(self, mu, logvar, step):
        return mu + step * torch.exp(0.5 * logvar)


class LatentMix(nn.Module):
    def forward(self, z_a, z_b, alpha):
        return (1 - alpha) * z_a + alpha * z_b


# ---------------------------------------------------------------- data and training
def load_digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    # The same split as models/generate.py's digits model.
    return train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)


def fit(model, batches, steps, lr, loss_fn):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    model.train()
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, *next(batches))
        loss.backward()
        opt.step()
        sched.step()
        if step % max(1, steps // 5) == 0 or step == steps - 1:
            print("  step %4d loss %.4f" % (step, loss.item()))
    model.eval()
    return model


def click_logs(n, g):
    """Rows of 32 user + 32 item features and a sampled click from a hidden factor model."""
    users, items, k = 2000, 500, 8
    hu = torch.Generator().manual_seed(100)
    u_lat = torch.randn(users, k, generator=hu)
    i_lat = torch.randn(items, k, generator=hu)
    i_pop = 0.8 * torch.randn(items, generator=hu)
    u_proj = torch.randn(k, 32, generator=hu) / k ** 0.5
    i_proj = torch.randn(k, 32, generator=hu) / k ** 0.5
    u = torch.randint(0, users, (n,), generator=g)
    i = torch.randint(0, items, (n,), generator=g)
    uf = torch.tanh(u_lat[u] @ u_proj) + 0.1 * torch.randn(n, 32, generator=g)
    itf = torch.tanh(i_lat[i] @ i_proj) + 0.1 * torch.randn(n, 32, generator=g)
    logit = 1.5 * (u_lat[u] * i_lat[i]).sum(1) / k ** 0.5 + i_pop[i] - 1.0
    click = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    return torch.cat([uf, itf], 1), click[:, None]


def train_recommender():
    torch.manual_seed(10)
    g = torch.Generator().manual_seed(11)
    x, y = click_logs(200000, g)
    xt, yt = click_logs(20000, torch.Generator().manual_seed(12))

    def batches():
        while True:
            idx = torch.randint(0, len(x), (512,), generator=g)
            yield x[idx], y[idx]

    model = fit(Recommender(), batches(), 1500, 3e-3,
                lambda m, a, b: F.binary_cross_entropy(m(a), b))
    from sklearn.metrics import roc_auc_score
    with torch.no_grad():
        auc = roc_auc_score(yt.numpy().ravel(), model(xt).numpy().ravel())
    print("recommender: held-out AUC %.3f on %d synthetic impressions" % (auc, len(yt)))
    return model, xt[:4]


def colour_digits(x, g):
    """8x8 digits in 0..1 -> 3x32x32 colour images in 0..1."""
    n = x.shape[0]
    big = F.interpolate(torch.as_tensor(x), size=(24, 24), mode="bilinear", align_corners=False)
    bg = torch.rand(n, 3, 1, 1, generator=g)
    fg = (bg + (1.0 - 2.0 * (bg >= 0.5).float()) * (0.4 + 0.4 * torch.rand(n, 3, 1, 1, generator=g))).clamp(0, 1)
    img = bg.expand(n, 3, 32, 32).clone()
    for j in range(n):
        oy, ox = torch.randint(0, 9, (2,), generator=g).tolist()
        a = big[j]
        img[j, :, oy:oy + 24, ox:ox + 24] = a * fg[j] + (1 - a) * bg[j]
    return (img + 0.03 * torch.randn(img.shape, generator=g)).clamp(0, 1)


def train_image_classifier(split):
    x_train, x_test, y_train, y_test = split
    torch.manual_seed(20)
    g = torch.Generator().manual_seed(21)
    yt = torch.from_numpy(y_train)

    def batches():
        while True:
            idx = torch.randint(0, len(x_train), (64,), generator=g)
            yield colour_digits(x_train[idx.numpy()], g), yt[idx]

    model = fit(ImageClassifier(), batches(), 700, 3e-3, lambda m, a, b: F.cross_entropy(m(a), b))
    test = colour_digits(x_test, torch.Generator().manual_seed(22))
    with torch.no_grad():
        acc = float((model(test).argmax(1).numpy() == y_test).mean())
    print("image_classifier: held-out accuracy %.4f on %d colour digits" % (acc, len(y_test)))
    return model, test[:2], y_test[:2]


def sentences(n, g, seq=32):
    lengths = torch.randint(6, seq + 1, (n,), generator=g)
    ids = torch.randint(101, 1000, (n, seq), generator=g)
    kind = torch.rand(n, seq, generator=g)
    ids = torch.where(kind < 0.12, torch.randint(1, 51, (n, seq), generator=g), ids)
    ids = torch.where((kind >= 0.12) & (kind < 0.24), torch.randint(51, 101, (n, seq), generator=g), ids)
    ids = torch.where(torch.arange(seq)[None] < lengths[:, None], ids, torch.zeros_like(ids))
    diff = ((ids >= 1) & (ids <= 50)).sum(1) - ((ids >= 51) & (ids <= 100)).sum(1)
    label = 1 + (diff >= 2).long() - (diff <= -2).long()
    return ids, label


def train_text_classifier():
    torch.manual_seed(30)
    g = torch.Generator().manual_seed(31)
    model = fit(TextClassifier(), iter(lambda: sentences(64, g), None), 800, 2e-3,
                lambda m, a, b: F.cross_entropy(m(a), b))
    ids, label = sentences(2000, torch.Generator().manual_seed(32))
    with torch.no_grad():
        acc = float((model(ids).argmax(1) == label).float().mean())
    print("text_classifier: held-out accuracy %.4f on %d synthetic sentences" % (acc, len(label)))
    return model, ids[:2], label[:2]


def train_vae(split):
    x_train, x_test, _, _ = split
    torch.manual_seed(40)
    g = torch.Generator().manual_seed(41)
    enc, dec = VaeEncoder(), VaeDecoder()
    both = nn.ModuleList([enc, dec])
    xt = torch.from_numpy(x_train)

    def batches():
        while True:
            yield xt[torch.randint(0, len(xt), (64,), generator=g)], torch.randn(64, LATENT, generator=g)

    def loss(m, x, eps):
        mu, logvar = m[0](x)
        rec = m[1](mu + eps * torch.exp(0.5 * logvar))
        bce = F.binary_cross_entropy(rec, x, reduction="sum") / len(x)
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / len(x)
        return bce + kl

    fit(both, batches(), 3000, 3e-3, loss)
    with torch.no_grad():
        x = torch.from_numpy(x_test)
        err = float((dec(enc(x)[0]) - x).abs().mean())
    print("vae: held-out mean |reconstruction - image| %.4f (pixels in 0..1)" % err)
    return enc, dec, x[:2]


# ---------------------------------------------------------------- export and references
def export(model, example, name, inputs, outputs):
    path = os.path.join(HERE, name, "1", "model.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    axes = {n: {0: "batch"} for n in inputs + outputs}
    example = example if isinstance(example, tuple) else (example,)
    torch.onnx.export(model, example, path, input_names=inputs, output_names=outputs, opset_version=OPSET,
                      dynamic_axes=axes, do_constant_folding=True)
    m = onnx.load(path)
    onnx.checker.check_model(m)
    print("wrote %s: %d bytes, ops %s" % (os.path.relpath(path, ROOT), os.path.getsize(path),
                                         sorted({n.op_type for n in m.graph.node})))


DATATYPE = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


def tensor(name, arr):
    arr = np.asarray(arr)
    return {"name": name, "datatype": DATATYPE[arr.dtype], "shape": list(arr.shape),
            "data": [float(v) if arr.dtype == np.float32 else int(v) for v in arr.ravel()]}


def metadata(ref, variable=()):
    """The metadata the server must report: batch dimension -1, the names in `variable`
    with every dimension variable (-1)."""
    def spec(t):
        dims = [-1] * (len(t["shape"]) - 1) if t["name"] in variable else t["shape"][1:]
        return {"name": t["name"], "datatype": t["datatype"], "shape": [-1] + dims}
    return {"inputs": [spec(t) for t in ref["inputs"]], "outputs": [spec(t) for t in ref["outputs"]]}


def write_ref(model_name, inputs, outputs, note, labels=None, label_output=None, variable=()):
    """inputs/outputs: [(name, numpy array)]. Float outputs are compared within
    1e-4 x max(1, max |reference|); `labels` (one per row) must be the argmax of
    `label_output`."""
    os.makedirs(REFS, exist_ok=True)
    ref = {"model": model_name, "note": note, "inputs": [tensor(n, a) for n, a in inputs],
           "outputs": [tensor(n, a) for n, a in outputs], "relative_tolerance": 1e-4}
    ref["metadata"] = metadata(ref, variable)
    if labels is not None:
        ref["labels"] = [int(v) for v in labels]
        ref["label_output"] = label_output
    with open(os.path.join(REFS, model_name + ".json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")
    print("wrote tests/e2e/examples/%s.json" % model_name)


def round4(t):
    """float32 inputs with 4 decimals, so the JSON stays short; the reference is computed on
    these exact values."""
    return torch.from_numpy(np.round(t.numpy().astype(np.float64), 4).astype(np.float32))


def run(model, *args):
    with torch.no_grad():
        res = model(*args)
    return [r.numpy() for r in (res if isinstance(res, tuple) else (res,))]


def read_sht(path):
    codes = {11: np.float32, 9: np.int64, 1: np.bool_}
    out = {}
    with open(path, "rb") as f:
        assert f.read(4) == b"SHT1"
        (count,) = struct.unpack("<I", f.read(4))
        for _ in range(count):
            (nl,) = struct.unpack("<I", f.read(4))
            name = f.read(nl).decode()
            code, rank = struct.unpack("<II", f.read(8))
            dims = struct.unpack("<%dq" % rank, f.read(8 * rank))
            (nb,) = struct.unpack("<Q", f.read(8))
            out[name] = np.frombuffer(f.read(nb), dtype=codes[code]).reshape(dims)
    return out


def plugin_and_digits_refs():
    a = np.arange(1, 17, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 0.5, dtype=np.float32)
    write_ref("add_sub", [("INPUT0", a), ("INPUT1", b)], [("OUTPUT0", a + b), ("OUTPUT1", a - b)],
              "OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1")
    v = np.array([[0.5, -1.25, 3.0, 42.0]], dtype=np.float32)
    write_ref("identity", [("INPUT0", v)], [("OUTPUT0", v)], "echoes INPUT0", variable=("INPUT0", "OUTPUT0"))
    c = np.array([[1.5], [-2.0]], dtype=np.float32)
    write_ref("cost_model", [("INPUT0", c)], [("OUTPUT0", c)], "sleeps a + b*n, then echoes INPUT0")
    # digits: the first 8 held-out images of models/digits.test.sht and PyTorch's logits.
    t = read_sht(os.path.join(ROOT, "models", "digits.test.sht"))
    images, logits, labels = t["in:image"][:8], t["out:logits"][:8], t["labels"][:8]
    assert (logits.argmax(1) == labels).all(), "a reference digit is misclassified"
    write_ref("digits", [("image", images)], [("logits", logits)],
              "8 held-out digits (models/digits.test.sht) and PyTorch's logits", labels, "logits")


def load_vae():
    """The committed encoder and decoder, as PyTorch modules (their ONNX initializers carry
    the state_dict names)."""
    from onnx import numpy_helper
    mods = []
    for name, module in (("encoder", VaeEncoder()), ("decoder", VaeDecoder())):
        m = onnx.load(os.path.join(HERE, name, "1", "model.onnx"))
        state = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in m.graph.initializer}
        module.load_state_dict(state)
        mods.append(module.eval())
    return mods


def pipeline_models_and_refs():
    enc, dec = load_vae()
    walk, mix = LatentWalk(), LatentMix()
    z16 = torch.zeros(2, LATENT)
    one = torch.full((2, 1), 0.5)
    export(walk, (z16, z16, one), "latent_walk", ["mu", "logvar", "step"], ["z"])
    export(mix, (z16, z16, one), "latent_mix", ["z_a", "z_b", "alpha"], ["z"])
    ref = json.load(open(os.path.join(REFS, "encoder.json")))
    images = np.array(ref["inputs"][0]["data"], dtype=np.float32).reshape(ref["inputs"][0]["shape"])
    x = torch.from_numpy(images)
    mu, logvar = run(enc, x)
    step = np.array([[1.5], [-1.0]], dtype=np.float32)
    write_ref("latent_walk", [("mu", mu), ("logvar", logvar), ("step", step)],
              [("z", *run(walk, torch.from_numpy(mu), torch.from_numpy(logvar), torch.from_numpy(step)))],
              "the encoder's outputs for 2 held-out digits, stepped 1.5 and -1 standard deviations")
    alpha = np.array([[0.25], [0.75]], dtype=np.float32)
    write_ref("latent_mix", [("z_a", mu), ("z_b", mu[::-1].copy()), ("alpha", alpha)],
              [("z", *run(mix, torch.from_numpy(mu), torch.from_numpy(mu[::-1].copy()), torch.from_numpy(alpha)))],
              "two latent codes mixed a quarter and three quarters of the way")
    # The ensembles: PyTorch runs the same steps one after another.
    (z,) = run(walk, torch.from_numpy(mu), torch.from_numpy(logvar), torch.from_numpy(step))
    write_ref("vae_walk", [("image", images), ("step", step)], [("walked", *run(dec, torch.from_numpy(z)))],
              "ensemble encoder -> latent_walk -> decoder on 2 held-out digits")
    images_b = images[::-1].copy()
    (mu_b, _) = run(enc, torch.from_numpy(images_b))
    (zm,) = run(mix, torch.from_numpy(mu), torch.from_numpy(mu_b), torch.from_numpy(alpha))
    write_ref("vae_blend", [("image_a", images), ("image_b", images_b), ("alpha", alpha)],
              [("blended", *run(dec, torch.from_numpy(zm)))],
              "ensemble: two encoders in parallel -> latent_mix -> decoder, 2 pairs of held-out digits")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="comma-separated: recommender, image_classifier, "
                        "text_classifier, vae, refs, pipeline")
    opts = parser.parse_args()
    want = set(opts.only.split(",")) if opts.only else None
    torch.set_num_threads(1)  # reproducible floating-point sums
    split = load_digits_split() if want is None or want - {"refs", "pipeline"} else None

    if want is None or "recommender" in want:
        model, x = train_recommender()
        export(model, x, "recommender", ["features"], ["score"])
        x = round4(x)
        write_ref("recommender", [("features", x.numpy())], [("score", *run(model, x))],
                  "4 held-out synthetic impressions (32 user + 32 item features) and PyTorch's click scores")
    if want is None or "image_classifier" in want:
        model, x, labels = train_image_classifier(split)
        export(model, x, "image_classifier", ["image"], ["logits"])
        x = round4(x)
        out = run(model, x)
        assert (out[0].argmax(1) == labels).all()
        write_ref("image_classifier", [("image", x.numpy())], [("logits", *out)],
                  "2 held-out colour digits and PyTorch's logits", labels, "logits")
    if want is None or "text_classifier" in want:
        model, ids, labels = train_text_classifier()
        export(model, ids, "text_classifier", ["input_ids"], ["logits"])
        out = run(model, ids)
        assert (out[0].argmax(1) == labels.numpy()).all()
        write_ref("text_classifier", [("input_ids", ids.numpy())], [("logits", *out)],
                  "2 held-out synthetic sentences (0 = negative, 1 = neutral, 2 = positive) and PyTorch's logits",
                  labels.numpy(), "logits")
    if want is None or "vae" in want:
        enc, dec, x = train_vae(split)
        export(enc, x, "encoder", ["image"], ["mu", "logvar"])
        mu, _ = run(enc, x)
        export(dec, torch.from_numpy(mu), "decoder", ["z"], ["image"])
        x = round4(x)
        mu, logvar = run(enc, x)
        write_ref("encoder", [("image", x.numpy())], [("mu", mu), ("logvar", logvar)],
                  "2 held-out digits and PyTorch's posterior mean and log-variance")
        z = round4(torch.from_numpy(mu))
        write_ref("decoder", [("z", z.numpy())], [("image", *run(dec, z))],
                  "the encoder's mu for 2 held-out digits (4 decimals) and PyTorch's reconstruction")
    if want is None or "refs" in want:
        plugin_and_digits_refs()
    if want is None or "pipeline" in want:
        pipeline_models_and_refs()


if __name__ == "__main__":
    main()
