#!/usr/bin/python3
"""Writes the engine's test models and their reference inputs/outputs.

Run with Debian's interpreter (it sees python3-torch, -torchvision, -onnx, -sklearn):

    /usr/bin/python3 models/generate.py [--out models]

For every architecture family the engine must run (CNNs: ResNet, MobileNetV2/V3,
EfficientNet, SqueezeNet, ShuffleNetV2, DenseNet; an MLP recommender; BERT-style
encoders with LayerNormalization and decomposed; a convolutional VAE) it builds a
reduced-width network with random weights, exports it at opsets 13 and 17 with a
symbolic batch dimension, runs PyTorch on random inputs at batch 1 and batch 4, and
writes <model>.onnx, <model>.b1.sht and <model>.b4.sht. It also trains a small CNN on
scikit-learn's handwritten digits and writes digits.onnx with the held-out images and
labels (digits.test.sht), and one model with external tensor data (mlp_external.onnx +
mlp_external.data) for the importer's tests.

Reference format (.sht, little-endian): b"SHT1", u32 count, then per tensor: u32 name
length, name (UTF-8; "in:<input>" or "out:<output>"), u32 dtype (shoal DataType:
FP32=11, INT64=9, BOOL=1), u32 rank, i64 dims[rank], u64 byte count, raw bytes.
"""
import argparse
import os
import struct
import zlib

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.models as tvm
from torchvision.models import efficientnet as tv_eff
from torchvision.models import mobilenetv3 as tv_mb3
from torchvision.models import resnet as tv_resnet
from torchvision.models import squeezenet as tv_sq

DTYPES = {np.float32: 11, np.int64: 9, np.bool_: 1}


def write_sht(path, tensors):
    with open(path, "wb") as f:
        f.write(b"SHT1" + struct.pack("<I", len(tensors)))
        for name, arr in tensors:
            arr = np.ascontiguousarray(arr)
            code = DTYPES[arr.dtype.type]
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", code, arr.ndim))
            f.write(struct.pack("<%dq" % arr.ndim, *arr.shape))
            data = arr.tobytes()
            f.write(struct.pack("<Q", len(data)) + data)


def randomize_bn(model, gen):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


# ---- reduced-width architectures ----
class TinyResNet(nn.Module):
    """ResNet stem + one BasicBlock stage + one Bottleneck stage with downsampling."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        self.layer1 = tv_resnet.BasicBlock(8, 8)
        down = nn.Sequential(nn.Conv2d(8, 32, 1, 2, bias=False), nn.BatchNorm2d(32))
        self.layer2 = tv_resnet.Bottleneck(8, 8, stride=2, downsample=down)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class TinySqueezeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, 2), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(3, 2, ceil_mode=True), tv_sq.Fire(16, 4, 8, 8),
                                      tv_sq.Fire(16, 4, 8, 8), nn.MaxPool2d(3, 2, ceil_mode=True),
                                      tv_sq.Fire(16, 8, 16, 16))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(32, 10, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


def mobilenet_v2():
    return tvm.MobileNetV2(num_classes=10, width_mult=0.25,
                           inverted_residual_setting=[[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 1, 2]])


def mobilenet_v3():
    cfg = tv_mb3.InvertedResidualConfig
    setting = [cfg(16, 3, 16, 16, True, "RE", 2, 1, 0.5), cfg(16, 3, 32, 24, False, "RE", 2, 1, 0.5),
               cfg(24, 5, 48, 24, True, "HS", 1, 1, 0.5), cfg(24, 3, 64, 32, True, "HS", 2, 1, 0.5)]
    return tv_mb3.MobileNetV3(setting, last_channel=64, num_classes=10)


def efficientnet():
    cfg = tv_eff.MBConvConfig
    setting = [cfg(1, 3, 1, 16, 8, 1, 0.5, 1.0), cfg(4, 3, 2, 8, 16, 2, 0.5, 1.0), cfg(4, 5, 2, 16, 24, 1, 0.5, 1.0)]
    return tv_eff.EfficientNet(setting, dropout=0.2, num_classes=10, last_channel=64)


def shufflenet():
    return tvm.ShuffleNetV2([2, 1, 1], [8, 16, 32, 64, 64], num_classes=10)


def densenet():
    return tvm.DenseNet(growth_rate=4, block_config=(2, 2), num_init_features=8, bn_size=2, num_classes=10)


class MlpRecommender(nn.Module):
    """Embedding tables for categorical features + dense features -> MLP -> click score."""

    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(50, 8)
        self.item = nn.Embedding(80, 8)
        self.mlp = nn.Sequential(nn.Linear(8 + 16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, dense, ids):
        e = torch.cat([dense, self.user(ids[:, 0]), self.item(ids[:, 1])], dim=1)
        return torch.sigmoid(self.mlp(e))


class DecomposedLayerNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.bias = nn.Parameter(0.1 * torch.randn(d))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.weight + self.bias


class EncoderLayer(nn.Module):
    def __init__(self, d, heads, decomposed):
        super().__init__()
        self.h = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        norm = (lambda: DecomposedLayerNorm(d)) if decomposed else (lambda: nn.LayerNorm(d))
        self.ln1, self.ln2 = norm(), norm()
        self.decomposed = decomposed

    def forward(self, x, mask):
        b, s, d = x.shape
        def split(t):
            return t.view(b, s, self.h, d // self.h).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / float(d // self.h) ** 0.5
        if self.decomposed:
            scores = scores.masked_fill(mask[:, None, None, :] == 0, -1e4)
        else:
            scores = scores + (1.0 - mask[:, None, None, :].float()) * -1e4
        att = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.o(att))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class TinyBert(nn.Module):
    def __init__(self, decomposed, vocab=100, d=32, heads=4, layers=2, max_len=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.register_buffer("positions", torch.arange(max_len).unsqueeze(0))
        self.layers = nn.ModuleList(EncoderLayer(d, heads, decomposed) for _ in range(layers))
        self.pool = nn.Linear(d, d)

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        x = self.tok(input_ids) + self.pos(self.positions[:, :s])
        for layer in self.layers:
            x = layer(x, attention_mask)
        return x, torch.tanh(self.pool(x[:, 0]))


class TinyVae(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU())
        self.mu = nn.Linear(16 * 4 * 4, 8)
        self.logvar = nn.Linear(16 * 4 * 4, 8)
        self.dec_in = nn.Linear(8, 16 * 4 * 4)
        self.dec = nn.Sequential(nn.ConvTranspose2d(16, 8, 3, 2, 1, output_padding=1), nn.ReLU(),
                                 nn.ConvTranspose2d(8, 1, 3, 2, 1, output_padding=1))

    def forward(self, x):
        h = torch.flatten(self.enc(x), 1)
        mu, logvar = self.mu(h), self.logvar(h)
        # Deterministic inference: decode the mean; report the std as exp(logvar / 2).
        z = self.dec_in(mu).view(-1, 16, 4, 4)
        return torch.sigmoid(self.dec(z)), mu, torch.exp(0.5 * logvar)


def image_input(shape):
    return lambda b, g: [torch.randn((b,) + shape, generator=g)]


FAMILIES = {
    "resnet": (TinyResNet, ["input"], ["logits"], image_input((3, 32, 32))),
    "mobilenet_v2": (mobilenet_v2, ["input"], ["logits"], image_input((3, 32, 32))),
    "mobilenet_v3": (mobilenet_v3, ["input"], ["logits"], image_input((3, 32, 32))),
    "efficientnet": (efficientnet, ["input"], ["logits"], image_input((3, 32, 32))),
    "squeezenet": (TinySqueezeNet, ["input"], ["logits"], image_input((3, 48, 48))),
    "shufflenet": (shufflenet, ["input"], ["logits"], image_input((3, 32, 32))),
    "densenet": (densenet, ["input"], ["logits"], image_input((3, 32, 32))),
    "mlp": (MlpRecommender, ["dense", "ids"], ["score"],
            lambda b, g: [torch.randn(b, 8, generator=g),
                          torch.stack([torch.randint(0, 50, (b,), generator=g),
                                       torch.randint(0, 80, (b,), generator=g)], 1)]),
    "bert_layernorm": (lambda: TinyBert(False), ["input_ids", "attention_mask"], ["hidden", "pooled"], None),
    "bert_decomposed": (lambda: TinyBert(True), ["input_ids", "attention_mask"], ["hidden", "pooled"], None),
    "vae": (TinyVae, ["input"], ["reconstruction", "mu", "std"], image_input((1, 16, 16))),
}


def bert_inputs(b, g, s=12):
    ids = torch.randint(0, 100, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.int64)
    mask[:, s - 3:] = 0  # padded tail
    return [ids, mask]


def export(model, args, path, inputs, outputs, opset, dynamic_seq=False):
    axes = {n: {0: "batch"} for n in inputs + outputs}
    if dynamic_seq:
        for n in inputs:
            axes[n][1] = "sequence"
        axes["hidden"][1] = "sequence"
    torch.onnx.export(model, tuple(args), path, input_names=inputs, output_names=outputs, opset_version=opset,
                      dynamic_axes=axes, do_constant_folding=True)
    onnx.checker.check_model(onnx.load(path))


def write_refs(model, make_inputs, inputs, outputs, stem, gen):
    for b in (1, 4):
        args = make_inputs(b, gen)
        with torch.no_grad():
            res = model(*args)
        res = res if isinstance(res, tuple) else (res,)
        tensors = [("in:" + n, a.numpy()) for n, a in zip(inputs, args)]
        tensors += [("out:" + n, r.numpy().astype(np.float32)) for n, r in zip(outputs, res)]
        write_sht(stem + ".b%d.sht" % b, tensors)


def train_digits(out_dir):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(16 * 4 * 4, 10))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    for epoch in range(30):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            F.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x_test))
    acc = float((logits.argmax(1).numpy() == y_test).mean())
    print("digits: held-out accuracy %.4f on %d images" % (acc, len(y_test)))
    path = os.path.join(out_dir, "digits.onnx")
    export(model, [torch.from_numpy(x_test[:1])], path, ["image"], ["logits"], 13)
    write_sht(os.path.join(out_dir, "digits.test.sht"),
              [("in:image", x_test), ("labels", y_test), ("out:logits", logits.numpy()),
               ("torch_accuracy", np.array([acc], dtype=np.float32))])


def external_data_model(out_dir):
    torch.manual_seed(1)
    model = MlpRecommender().eval()
    g = torch.Generator().manual_seed(5)
    args = FAMILIES["mlp"][3](2, g)
    tmp = os.path.join(out_dir, "mlp_external.tmp.onnx")
    export(model, args, tmp, ["dense", "ids"], ["score"], 13)
    m = onnx.load(tmp)
    os.remove(tmp)
    onnx.save_model(m, os.path.join(out_dir, "mlp_external.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="mlp_external.data", size_threshold=0)
    with torch.no_grad():
        res = model(*args)
    write_sht(os.path.join(out_dir, "mlp_external.b2.sht"),
              [("in:dense", args[0].numpy()), ("in:ids", args[1].numpy()), ("out:score", res.numpy())])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--only", default="")
    opts = parser.parse_args()
    for name, (ctor, inputs, outputs, make_inputs) in FAMILIES.items():
        if opts.only and name not in opts.only.split(","):
            continue
        torch.manual_seed(zlib.crc32(name.encode()) % 1000)
        model = ctor().eval()
        gen = torch.Generator().manual_seed(1234)
        randomize_bn(model, gen)
        bert = make_inputs is None
        make = bert_inputs if bert else make_inputs
        for opset in (13, 17):
            stem = os.path.join(opts.out, "%s_op%d" % (name, opset))
            export(model, make(2, gen), stem + ".onnx", inputs, outputs, opset, dynamic_seq=bert)
            write_refs(model, make, inputs, outputs, stem, torch.Generator().manual_seed(opset))
            print("wrote", stem, os.path.getsize(stem + ".onnx"), "bytes")
    if not opts.only or "digits" in opts.only:
        train_digits(opts.out)
    if not opts.only or "external" in opts.only:
        external_data_model(opts.out)


if __name__ == "__main__":
    main()
