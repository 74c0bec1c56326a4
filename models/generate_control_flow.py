#!/usr/bin/python3
"""Writes the test models of ONNX control flow (If, Loop) and their reference outputs.
Run with Debian's interpreter, like generate.py:

    /usr/bin/python3 models/generate_control_flow.py [--out models]

Two kinds of model:

* PyTorch exports (cf_*_opNN.onnx) of torch.jit.script'ed modules, at opsets 13 and 17:
  - cf_script: a `for` loop whose trip count is an input, a data-dependent `if` inside it
    (nested control flow), a `while` loop, a tensor grown with torch.cat every iteration
    (a loop-carried value that changes shape) and an `if` whose branches give different
    shapes;
  - cf_detect: detection post-processing: box decoding against anchors, then per class a
    score threshold (NonZero inside the loop body), the kept boxes appended to the
    detections, and at most `max_det` rows kept.
  References are PyTorch's outputs (.a.sht, .b.sht: two inputs that take different
  branches and trip counts).
* Graphs built with onnx.helper (cf_graph_*.onnx) for what PyTorch's exporter does not
  write: scan outputs, a Loop with a trip count and no condition, with a condition and no
  trip count, with both, an If inside a Loop body and a Loop inside an If branch, both
  reading values two scopes out, and outer values read by name. Their references come from the NumPy code beside them.

The .sht format is generate.py's (see models/README.md).
"""
import argparse
import os

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper

from sht import write_sht


# ---- PyTorch exports ----

class ScriptedFlow(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, n: torch.Tensor):
        h = x
        rows = x[:1] * 0
        for i in range(int(n)):
            h = torch.tanh(self.lin(h))
            if bool(h.sum() > 0):  # nested: an If in the Loop body
                h = h * 0.5 + float(i)
            else:
                h = h - 0.25
            rows = torch.cat([rows, h[:1]], 0)  # grows every iteration
        k = 0
        while bool(h.abs().max() > 1.0) and k < 10:
            h = h * 0.5
            k += 1
        if bool(rows.sum() > 0):  # branches of different shapes
            out = rows[1:]
        else:
            out = torch.cat([rows, rows], 0)
        return h, out, torch.tensor(k)


class DetectPost(nn.Module):
    def __init__(self, anchors: torch.Tensor, threshold: float, max_det: int):
        super().__init__()
        self.register_buffer("anchors", anchors)
        self.threshold = threshold
        self.max_det = max_det

    def forward(self, deltas: torch.Tensor, scores: torch.Tensor):
        # deltas [N, 4] (dx, dy, dw, dh), scores [N, C] -> detections [D, 6]
        a = self.anchors
        wa = a[:, 2] - a[:, 0]
        ha = a[:, 3] - a[:, 1]
        cx = a[:, 0] + 0.5 * wa + deltas[:, 0] * wa
        cy = a[:, 1] + 0.5 * ha + deltas[:, 1] * ha
        w = wa * torch.exp(deltas[:, 2])
        h = ha * torch.exp(deltas[:, 3])
        boxes = torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], 1)
        dets = torch.zeros(0, 6)
        for c in range(scores.shape[1]):
            s = scores[:, c]
            idx = torch.nonzero(s > self.threshold).squeeze(1)
            kept = boxes.index_select(0, idx)
            ks = s.index_select(0, idx).unsqueeze(1)
            label = torch.ones_like(ks) * float(c)
            dets = torch.cat([dets, torch.cat([kept, ks, label], 1)], 0)
        if dets.shape[0] > self.max_det:
            dets = dets[: self.max_det]
        return dets


def export(module, args, path, opset, input_names, output_names, dynamic_axes):
    scripted = torch.jit.script(module)
    torch.onnx.export(scripted, args, path, opset_version=opset, input_names=input_names,
                      output_names=output_names, dynamic_axes=dynamic_axes)
    onnx.checker.check_model(onnx.load(path))
    return scripted


def torch_models(out):
    torch.manual_seed(0)
    flow = ScriptedFlow().eval()
    flow_inputs = {
        "a": (torch.randn(3, 4), torch.tensor(4)),
        "b": (torch.randn(2, 4) - 2.0, torch.tensor(1)),
    }
    anchors = torch.rand(12, 2) * 8
    anchors = torch.cat([anchors, anchors + 1 + torch.rand(12, 2) * 4], 1)
    det = DetectPost(anchors, 0.6, 7).eval()
    det_inputs = {
        "a": (torch.randn(12, 4) * 0.2, torch.rand(12, 3)),
        "b": (torch.randn(12, 4) * 0.2, torch.rand(12, 3) * 0.7),
    }
    for opset in (13, 17):
        path = os.path.join(out, "cf_script_op%d.onnx" % opset)
        scripted = export(flow, flow_inputs["a"], path, opset, ["x", "n"], ["h", "rows", "k"],
                          {"x": {0: "batch"}})
        for tag, (x, n) in flow_inputs.items():
            with torch.no_grad():
                h, rows, k = scripted(x, n)
            write_sht(os.path.join(out, "cf_script_op%d.%s.sht" % (opset, tag)),
                      [("in:x", x.numpy()), ("in:n", n.numpy()), ("out:h", h.numpy()),
                       ("out:rows", rows.numpy()), ("out:k", k.numpy())])
        path = os.path.join(out, "cf_detect_op%d.onnx" % opset)
        scripted = export(det, det_inputs["a"], path, opset, ["deltas", "scores"], ["dets"],
                          {"scores": {1: "classes"}})  # anchors fix the box count
        for tag, (d, s) in det_inputs.items():
            with torch.no_grad():
                dets = scripted(d, s)
            write_sht(os.path.join(out, "cf_detect_op%d.%s.sht" % (opset, tag)),
                      [("in:deltas", d.numpy()), ("in:scores", s.numpy()),
                       ("out:dets", dets.numpy())])
        print("cf_script_op%d, cf_detect_op%d" % (opset, opset))


# ---- Hand-built graphs ----

def scalar_i64(name):
    return helper.make_tensor_value_info(name, TensorProto.INT64, [])


def save(model, path):
    onnx.checker.check_model(model)
    onnx.save(model, path)


def loop_scan_graph(out):
    """Loop(M, no cond) over acc; the body reads outer inputs w (one scope out) and x (two
    scopes out, inside an If on the iteration's parity); scan outputs z and i*2."""
    # If branches, inside the body: then z = y * x, else z = y - x.
    then_g = helper.make_graph([helper.make_node("Mul", ["y", "x"], ["z_then"])], "then",
                               [], [helper.make_tensor_value_info("z_then", TensorProto.FLOAT, [3])])
    else_g = helper.make_graph([helper.make_node("Sub", ["y", "x"], ["z_else"])], "else",
                               [], [helper.make_tensor_value_info("z_else", TensorProto.FLOAT, [3])])
    body_nodes = [
        helper.make_node("Add", ["acc_in", "w"], ["y"]),
        helper.make_node("Mod", ["i", "two"], ["parity"]),
        helper.make_node("Equal", ["parity", "zero"], ["even"]),
        helper.make_node("If", ["even"], ["z"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Mul", ["i", "two"], ["i2"]),
        helper.make_node("Identity", ["z"], ["z_row"]),
    ]
    body = helper.make_graph(
        body_nodes, "body",
        [scalar_i64("i"), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("z_row", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("i2", TensorProto.INT64, [])],
        initializer=[numpy_helper.from_array(np.array(0, np.int64), "zero")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["acc", "zs", "is"], body=body)],
        "loop_scan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]), scalar_i64("M")],
        [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("zs", TensorProto.FLOAT, ["trips", 3]),
         helper.make_tensor_value_info("is", TensorProto.INT64, ["trips"])],
        # "two" lives in the outer graph: the body and its If read it by name.
        initializer=[numpy_helper.from_array(np.array(2, np.int64), "two")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
         os.path.join(out, "cf_graph_loop_scan.onnx"))
    rng = np.random.default_rng(1)
    for tag, m in (("m4", 4), ("m0", 0)):
        x = rng.standard_normal(3).astype(np.float32)
        w = rng.standard_normal(3).astype(np.float32)
        acc, zs, its = x.copy(), [], []
        for i in range(m):
            y = acc + w
            acc = y * x if i % 2 == 0 else y - x
            zs.append(acc.copy())
            its.append(np.int64(2 * i))
        zs = np.stack(zs) if zs else np.zeros((0, 3), np.float32)
        its = np.array(its, np.int64)
        write_sht(os.path.join(out, "cf_graph_loop_scan.%s.sht" % tag),
                  [("in:x", x), ("in:w", w), ("in:M", np.array(m, np.int64)),
                   ("out:acc", acc), ("out:zs", zs.astype(np.float32)), ("out:is", its)])


def loop_while_graph(out):
    """Loops with a condition: while sum(v) < limit: v = v * 2 (no trip count), and the
    same with a trip count of 3 (whichever ends first); the counter is carried too."""
    def body(name):
        return helper.make_graph(
            [helper.make_node("Mul", ["v_in", "two_f"], ["v_out"]),
             helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
             helper.make_node("Less", ["s", "limit"], ["cond_out"]),
             helper.make_node("Add", ["c_in", "one"], ["c_out"])],
            name,
            [scalar_i64("i"), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["n"]),
             scalar_i64("c_in")],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["n"]),
             scalar_i64("c_out")])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["v"], ["s0"], keepdims=0),
         helper.make_node("Less", ["s0", "limit"], ["cond0"]),
         helper.make_node("Loop", ["", "cond0", "v", "zero"], ["v_while", "c_while"],
                          body=body("while_body")),
         helper.make_node("Loop", ["three", "cond0", "v", "zero"], ["v_capped", "c_capped"],
                          body=body("capped_body"))],
        "loop_while",
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("limit", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("v_while", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("c_while", TensorProto.INT64, []),
         helper.make_tensor_value_info("v_capped", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("c_capped", TensorProto.INT64, [])],
        initializer=[numpy_helper.from_array(np.array(2, np.float32), "two_f"),
                     numpy_helper.from_array(np.array(1, np.int64), "one"),
                     numpy_helper.from_array(np.array(0, np.int64), "zero"),
                     numpy_helper.from_array(np.array(3, np.int64), "three")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
         os.path.join(out, "cf_graph_while.onnx"))
    for tag, v, limit in (("long", [0.1, 0.2, 0.05], 30.0), ("never", [5.0, 6.0], 1.0)):
        v = np.array(v, np.float32)
        limit = np.float32(limit)
        res = []
        for cap in (None, 3):
            x, c, i = v.copy(), 0, 0
            cond = x.sum() < limit
            while cond and (cap is None or i < cap):
                x = x * 2
                c += 1
                i += 1
                cond = x.sum() < limit
            res += [x, np.array(c, np.int64)]
        write_sht(os.path.join(out, "cf_graph_while.%s.sht" % tag),
                  [("in:v", v), ("in:limit", np.array(limit, np.float32)),
                   ("out:v_while", res[0]), ("out:c_while", res[1]),
                   ("out:v_capped", res[2]), ("out:c_capped", res[3])])


def if_shapes_graph(out):
    """If on a run-time condition whose branches give different shapes: the then branch
    concatenates x with itself, the else branch returns an outer value unchanged."""
    then_g = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["t"], axis=0)], "then",
                               [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["rows", 3])])
    else_g = helper.make_graph([], "else", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x_in"], ["x"]),
         helper.make_node("Neg", ["x_in"], ["y"]),
         helper.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Add", ["r", "one_f"], ["out"])],
        "if_shapes",
        [helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["rows", 3])],
        initializer=[numpy_helper.from_array(np.array(1, np.float32), "one_f")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]),
         os.path.join(out, "cf_graph_if.onnx"))
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    for tag, c in (("then", True), ("else", False)):
        r = np.concatenate([np.maximum(x, 0)] * 2) if c else -x
        write_sht(os.path.join(out, "cf_graph_if.%s.sht" % tag),
                  [("in:x_in", x), ("in:c", np.array(c)), ("out:out", r + 1)])


def nested_graph(out):
    """A Loop inside an If: then runs acc = acc * 2 + w for M iterations (M and w read from
    the outer graph two scopes out), else returns x - w."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc_in", "two_f"], ["a2"]),
         helper.make_node("Add", ["a2", "w"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [scalar_i64("i"), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2])])
    then_g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["looped"], body=body)], "then", [],
        [helper.make_tensor_value_info("looped", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["diff"])], "else", [],
                               [helper.make_tensor_value_info("diff", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g)],
        "nested",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []), scalar_i64("M")],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2])],
        initializer=[numpy_helper.from_array(np.array(2, np.float32), "two_f")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]),
         os.path.join(out, "cf_graph_nested.onnx"))
    x = np.array([0.5, -1.0], np.float32)
    w = np.array([0.25, 2.0], np.float32)
    for tag, c, m in (("then", True, 3), ("else", False, 3)):
        if c:
            r = x.copy()
            for _ in range(m):
                r = r * 2 + w
        else:
            r = x - w
        write_sht(os.path.join(out, "cf_graph_nested.%s.sht" % tag),
                  [("in:x", x), ("in:w", w), ("in:c", np.array(c)),
                   ("in:M", np.array(m, np.int64)), ("out:r", r.astype(np.float32))])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    loop_scan_graph(args.out)
    loop_while_graph(args.out)
    if_shapes_graph(args.out)
    nested_graph(args.out)
    print("cf_graph_loop_scan, cf_graph_while, cf_graph_if, cf_graph_nested")
    torch_models(args.out)


if __name__ == "__main__":
    main()
