#!/usr/bin/python3
"""Writes the FP16 test models and their reference outputs. Run with Debian's interpreter,
like generate.py:

    /usr/bin/python3 models/generate_fp16.py [--out models]

Each model is a small PyTorch module exported in FP32 (opset 17), then converted by
`to_float16` below into an ONNX graph whose weights, constants, inputs and outputs are
FLOAT16, as whole-model FP16 exports (model.half() on a GPU, or converter tools) are:

* fp16_cnn: convolutions with BatchNormalization, a residual block, max and global
  average pooling, Hardswish, a linear classifier; input [batch,3,16,16];
* fp16_transformer: a pre-norm transformer block (LayerNormalization, four-head
  self-attention with Softmax, GELU MLP, residuals); input [batch,sequence,32];
* fp16_mixed: fp16_transformer with FP32 inputs and outputs around the FP16 graph
  (Cast to FLOAT16 after the input, Cast to FLOAT before the output), as
  mixed-precision exports with FP32 I/O are.

References (.b1.sht, .b4.sht: batch 1 and 4) are PyTorch's outputs in FP32 for the
FP16-rounded weights and inputs; inputs are stored as FLOAT16 (FP32 for fp16_mixed),
outputs as FP32, unrounded. Tests accept max |error| <= 2e-3 x max |reference|
(TOLERANCE), which covers rounding the output to FP16 (at most 2^-11 relative), the
graph's scalar constants (the attention scale, GELU's sqrt 2), which the conversion
rounds to FP16 and PyTorch keeps in FP32, and BatchNormalization, which the exporter
folds into the convolutions before their weights are rounded.
"""
import argparse
import os

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper
from sht import write_sht

TOLERANCE = 2e-3


class TinyCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                   nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                                  nn.Hardswish())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        x = self.down(x)
        return self.head(x.mean(dim=(2, 3)))


class TinyTransformerBlock(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)

        def split(t):
            return t.reshape(b, s, h, d // h).transpose(1, 2)

        q, k, v = split(q), split(k), split(v)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // h) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


def randomize(model, gen):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(torch.rand(m.normalized_shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.normalized_shape, generator=gen) * 0.1)
    return model.eval()


def round_to_fp16(model):
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.dtype == torch.float32:
                t.copy_(t.half().float())
    return model


def to_float16(model, keep_io_fp32=False):
    """Rewrites an FP32 ONNX model to FLOAT16: initialisers, Constant and ConstantOfShape
    values, Cast(to FLOAT) targets, and the FLOAT inputs, outputs and value_info. With
    keep_io_fp32, the inputs and outputs stay FLOAT and Casts are added at the edges."""
    g = model.graph
    F, H = TensorProto.FLOAT, TensorProto.FLOAT16

    def half_tensor(t):
        if t.data_type != F:
            return t
        h = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name)
        return h

    for i, init in enumerate(g.initializer):
        g.initializer[i].CopyFrom(half_tensor(init))
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                a.t.CopyFrom(half_tensor(a.t))
            if node.op_type == "Cast" and a.name == "to" and a.i == F:
                a.i = H
    for vi in g.value_info:
        if vi.type.tensor_type.elem_type == F:
            vi.type.tensor_type.elem_type = H
    edges = [(vi, True) for vi in g.input] + [(vi, False) for vi in g.output]
    for vi, is_input in edges:
        if vi.type.tensor_type.elem_type != F:
            continue
        if not keep_io_fp32:
            vi.type.tensor_type.elem_type = H
            continue
        inner = vi.name + "_fp16" if is_input else vi.name + "_fp16out"
        for node in g.node:
            for j, n in enumerate(node.input):
                if n == vi.name:
                    node.input[j] = inner
            for j, n in enumerate(node.output):
                if n == vi.name and not is_input:
                    node.output[j] = inner
        if is_input:
            g.node.insert(0, helper.make_node("Cast", [vi.name], [inner], to=H))
        else:
            g.node.append(helper.make_node("Cast", [inner], [vi.name], to=F))
    onnx.checker.check_model(model)
    return model


def export(module, example, path, names_in, names_out, seq_axis):
    axes = {n: {0: "batch"} for n in names_in + names_out}
    if seq_axis:
        for n in names_in + names_out:
            axes[n][1] = "sequence"
    torch.onnx.export(module, (example,), path, input_names=names_in, output_names=names_out,
                      opset_version=17, dynamic_axes=axes, do_constant_folding=True)
    return onnx.load(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1616)
    models = [
        ("fp16_cnn", TinyCnn, (3, 16, 16), False, False),
        ("fp16_transformer", TinyTransformerBlock, (7, 32), True, False),
        ("fp16_mixed", TinyTransformerBlock, (7, 32), True, True),
    ]
    for stem, make, shape, seq_axis, keep_io in models:
        torch.manual_seed(len(stem))
        module = randomize(make(), gen)
        unrounded = make().eval()
        unrounded.load_state_dict(module.state_dict())
        round_to_fp16(module)
        path = os.path.join(args.out, stem + ".onnx")
        example = torch.randn((2,) + shape, generator=gen)
        model = export(unrounded, example, path, ["x"], ["y"], seq_axis)
        onnx.save(to_float16(model, keep_io), path)
        for b in (1, 4):
            x = torch.randn((b,) + shape, generator=gen).half().float()
            with torch.no_grad():
                y = module(x)
            x_np = x.numpy() if keep_io else x.numpy().astype(np.float16)
            write_sht(os.path.join(args.out, "%s.b%d.sht" % (stem, b)),
                      [("in:x", x_np), ("out:y", y.numpy().astype(np.float32))])


if __name__ == "__main__":
    main()
