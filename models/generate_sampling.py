#!/usr/bin/env python3
"""Writes the test files for 5-D GridSample, Resize sized at run time, and models whose
outputs are not batch-major (models/README.md, "Sampling and batching").

    /usr/bin/python3 models/generate_sampling.py

Needs Debian's python3-torch 1.13 and python3-onnx 1.12. Deterministic (fixed seeds).

- gridsample_3d.sht: X [2, 3, 4, 5, 6] and grid [2, 3, 4, 5, 3] (coordinates a little past
  [-1, 1] so that every padding mode matters), and PyTorch's F.grid_sample of them for
  mode bilinear (trilinear on 5-D) and nearest, padding zeros, border and reflection,
  align_corners 0 and 1: "out:<mode>_<padding>_<align>".
- resize_from_shape_op13.onnx / _op17.onnx: an FPN-style merge whose upsampling size is
  another input's spatial shape (F.interpolate(p5, size=c4.shape[-2:])), nearest and
  bilinear, with symbolic batch, height and width; .a.sht and .b.sht hold inputs of two
  sizes (the second not a whole multiple) and PyTorch's outputs.
- nms_batch.onnx: NonMaxSuppression over boxes [batch, 6, 4] and scores [batch, 1, 6];
  its output selected_indices is [num_selected, 3], not batch-major.
- flatten_batch.onnx: x [batch, 4] -> Reshape [-1]: output [4 * batch], not batch-major.
"""
import os

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper
from sht import write_sht

HERE = os.path.dirname(os.path.abspath(__file__))


def gridsample_3d():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 4, 5, 6, generator=gen)
    grid = (torch.rand(2, 3, 4, 5, 3, generator=gen) * 2.6 - 1.3)
    tensors = [("in:x", x.numpy()), ("in:grid", grid.numpy())]
    for mode in ("bilinear", "nearest"):
        for pad in ("zeros", "border", "reflection"):
            for align in (0, 1):
                y = F.grid_sample(x, grid, mode=mode, padding_mode=pad, align_corners=bool(align))
                tensors.append(("out:%s_%s_%d" % (mode, pad, align), y.numpy()))
    write_sht(os.path.join(HERE, "gridsample_3d.sht"), tensors)


class FpnMerge(nn.Module):
    def __init__(self):
        super().__init__()
        self.lat4 = nn.Conv2d(4, 6, 1)
        self.lat5 = nn.Conv2d(8, 6, 1)

    def forward(self, c4, c5):
        p5 = self.lat5(c5)
        size = c4.shape[-2:]
        lat = self.lat4(c4)
        nearest = lat + F.interpolate(p5, size=size, mode="nearest")
        bilinear = lat + F.interpolate(p5, size=size, mode="bilinear", align_corners=False)
        return nearest, bilinear


def resize_from_shape():
    torch.manual_seed(6)
    model = FpnMerge().eval()
    gen = torch.Generator().manual_seed(7)
    cases = {"a": ((1, 4, 8, 8), (1, 8, 4, 4)), "b": ((2, 4, 7, 9), (2, 8, 4, 5))}
    for opset in (13, 17):
        name = "resize_from_shape_op%d" % opset
        c4, c5 = torch.randn(*cases["a"][0], generator=gen), torch.randn(*cases["a"][1], generator=gen)
        path = os.path.join(HERE, name + ".onnx")
        torch.onnx.export(model, (c4, c5), path, opset_version=opset,
                          input_names=["c4", "c5"], output_names=["nearest", "bilinear"],
                          dynamic_axes={"c4": {0: "batch", 2: "h4", 3: "w4"},
                                        "c5": {0: "batch", 2: "h5", 3: "w5"},
                                        "nearest": {0: "batch", 2: "h4", 3: "w4"},
                                        "bilinear": {0: "batch", 2: "h4", 3: "w4"}})
        for key, (s4, s5) in cases.items():
            c4, c5 = torch.randn(*s4, generator=gen), torch.randn(*s5, generator=gen)
            with torch.no_grad():
                n, b = model(c4, c5)
            write_sht(os.path.join(HERE, "%s.%s.sht" % (name, key)),
                      [("in:c4", c4.numpy()), ("in:c5", c5.numpy()),
                       ("out:nearest", n.numpy()), ("out:bilinear", b.numpy())])


def not_batch_major():
    boxes = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", 6, 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 1, 6])
    selected = helper.make_tensor_value_info("selected_indices", TensorProto.INT64,
                                             ["num_selected", 3])
    limit = helper.make_tensor("limit", TensorProto.INT64, [1], [3])
    iou = helper.make_tensor("iou", TensorProto.FLOAT, [1], [0.5])
    nms = helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"],
                           ["selected_indices"], name="nms")
    graph = helper.make_graph([nms], "nms_batch", [boxes, scores], [selected],
                              initializer=[limit, iou])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(HERE, "nms_batch.onnx"))

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["flat"])
    flat = helper.make_tensor("flat", TensorProto.INT64, [1], [-1])
    reshape = helper.make_node("Reshape", ["x", "flat"], ["y"], name="flatten")
    graph = helper.make_graph([reshape], "flatten_batch", [x], [y], initializer=[flat])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(HERE, "flatten_batch.onnx"))


if __name__ == "__main__":
    gridsample_3d()
    resize_from_shape()
    not_batch_major()
