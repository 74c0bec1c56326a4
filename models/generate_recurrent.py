#!/usr/bin/python3
"""Writes the test models of the recurrent operators (ONNX RNN, GRU, LSTM) and their
reference outputs. Run with Debian's interpreter, like generate.py:

    /usr/bin/python3 models/generate_recurrent.py [--out models]

Two kinds of model:

* PyTorch exports (rnn_*_opNN.onnx): nn.LSTM / nn.GRU / nn.RNN with several layers,
  bidirectional, batch-first, initial states as inputs, and a small LSTM classifier;
  references at batch 1 and 4 are PyTorch's outputs (.b1.sht, .b4.sht).
* Graphs built with onnx.helper (rnn_graph_*.onnx) for what PyTorch's exporter never
  writes: sequence_lens (PyTorch exports packed sequences without it), GRU without
  linear_before_reset, peepholes, clip, input_forget, non-default activations and
  layout 1. Their references come from the NumPy implementation below, which is first
  checked against PyTorch (including pack_padded_sequence for ragged batches) on every
  configuration PyTorch has. Files with sequence_lens have two references: .ragged.sht
  (lengths differ) and .full.sht (every length is the sequence length).

The .sht format is generate.py's (see models/README.md); sequence_lens is INT32 (8).
"""
import argparse
import os

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper
from sht import write_sht


# ---- NumPy reference of ONNX's RNN, GRU and LSTM ----
ALPHA_DEFAULTS = {"affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
                  "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None)}
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def activation(name, alpha, beta):
    n = name.lower()
    return {
        "relu": lambda x: np.maximum(x, 0),
        "tanh": np.tanh,
        "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "affine": lambda x: alpha * x + beta,
        "leakyrelu": lambda x: np.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda x: np.where(x > alpha, x, 0),
        "scaledtanh": lambda x: alpha * np.tanh(beta * x),
        "hardsigmoid": lambda x: np.clip(alpha * x + beta, 0, 1),
        "elu": lambda x: np.where(x >= 0, x, alpha * (np.exp(x) - 1)),
        "softsign": lambda x: x / (1 + np.abs(x)),
        "softplus": lambda x: np.log1p(np.exp(x)),
    }[n]


def activations(op, names, alphas, betas, dirs):
    names = list(names or DEFAULT_ACTS[op])
    alphas, betas = list(alphas or []), list(betas or [])
    out = []
    for name in names:  # alphas/betas go, in order, to the functions that take them
        da, db = ALPHA_DEFAULTS.get(name.lower(), (None, None))
        a = alphas.pop(0) if da is not None and alphas else da
        b = betas.pop(0) if db is not None and betas else db
        out.append(activation(name, a, b))
    per = len(DEFAULT_ACTS[op])
    if len(out) == per and dirs == 2:
        out = out + out
    return [out[d * per:(d + 1) * per] for d in range(dirs)]


def reference(op, X, W, R, B=None, lens=None, h0=None, c0=None, P=None, direction="forward", layout=0,
              linear_before_reset=0, clip=None, input_forget=0, acts=None, alphas=None, betas=None):
    """ONNX semantics, one sequence and one step at a time. Returns Y, Y_h (and Y_c)."""
    X = X.astype(np.float64)
    if layout == 1:
        X = X.transpose(1, 0, 2)
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    T, N, _ = X.shape
    D, H = W.shape[0], R.shape[2]
    G = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    B = np.zeros((D, 2 * G * H)) if B is None else B
    fns = activations(op, acts, alphas, betas, D)
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    Y = np.zeros((T, D, N, H))
    Yh = np.zeros((D, N, H))
    Yc = np.zeros((D, N, H))
    for d in range(D):
        back = direction == "reverse" or (direction == "bidirectional" and d == 1)
        Wd, Rd, wb, rb = W[d], R[d], B[d, :G * H], B[d, G * H:]
        f = fns[d]
        for b in range(N):
            L = T if lens is None else int(lens[b])
            h = np.zeros(H) if h0 is None else h0[d, b].astype(np.float64)
            c = np.zeros(H) if c0 is None else c0[d, b].astype(np.float64)
            for t in (range(L - 1, -1, -1) if back else range(L)):
                xw = Wd @ X[t, b] + wb
                if op == "RNN":
                    h = f[0](cl(xw + Rd @ h + rb))
                elif op == "GRU":
                    hr = Rd @ h + rb
                    z = f[0](cl(xw[:H] + hr[:H]))
                    r = f[0](cl(xw[H:2 * H] + hr[H:2 * H]))
                    if linear_before_reset:
                        n = f[1](cl(xw[2 * H:] + r * hr[2 * H:]))
                    else:
                        n = f[1](cl(xw[2 * H:] + Rd[2 * H:] @ (r * h) + rb[2 * H:]))
                    h = (1 - z) * n + z * h
                else:
                    g = xw + Rd @ h + rb
                    p = np.zeros(3 * H) if P is None else P[d]
                    i = f[0](cl(g[:H] + p[:H] * c))
                    fg = 1 - i if input_forget else f[0](cl(g[2 * H:3 * H] + p[2 * H:] * c))
                    c = fg * c + i * f[1](cl(g[3 * H:]))
                    o = f[0](cl(g[H:2 * H] + p[H:2 * H] * c))
                    h = o * f[2](c)
                Y[t, d, b] = h
            Yh[d, b], Yc[d, b] = h, c
    if layout == 1:
        Y, Yh, Yc = Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2), Yc.transpose(1, 0, 2)
    out = [Y.astype(np.float32), Yh.astype(np.float32)]
    return out + [Yc.astype(np.float32)] if op == "LSTM" else out


# ---- PyTorch's weights in ONNX's layout, and the reference checked against PyTorch ----
GATE_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2], "RNN": [0]}  # ONNX gate k = torch gate order[k]


def onnx_weights(module, op, layer):
    H = module.hidden_size
    dirs = 2 if module.bidirectional else 1
    order = GATE_ORDER[op]

    def perm(t):
        t = t.detach().numpy()
        return np.concatenate([t[g * H:(g + 1) * H] for g in order], 0)

    W, R, B = [], [], []
    for d in range(dirs):
        sfx = "_l%d%s" % (layer, "_reverse" if d else "")
        W.append(perm(getattr(module, "weight_ih" + sfx)))
        R.append(perm(getattr(module, "weight_hh" + sfx)))
        B.append(np.concatenate([perm(getattr(module, "bias_ih" + sfx)), perm(getattr(module, "bias_hh" + sfx))]))
    return np.stack(W), np.stack(R), np.stack(B)


def check_reference_against_torch():
    """The NumPy reference must reproduce PyTorch on every configuration PyTorch has,
    including ragged batches through pack_padded_sequence."""
    g = torch.Generator().manual_seed(7)
    for op, ctor, kw in (("LSTM", nn.LSTM, {}), ("GRU", nn.GRU, {}), ("RNN", nn.RNN, {"nonlinearity": "relu"}),
                         ("RNN", nn.RNN, {})):
        torch.manual_seed(3)
        m = ctor(5, 6, num_layers=1, bidirectional=True, **kw).eval()
        T, N = 7, 4
        x = torch.randn(T, N, 5, generator=g)
        h0 = torch.randn(2, N, 6, generator=g)
        c0 = torch.randn(2, N, 6, generator=g)
        lens = torch.tensor([7, 3, 5, 1])
        packed = nn.utils.rnn.pack_padded_sequence(x, lens, enforce_sorted=False)
        with torch.no_grad():
            out, state = m(packed, (h0, c0) if op == "LSTM" else h0)
        y, _ = nn.utils.rnn.pad_packed_sequence(out, total_length=T)
        W, R, B = onnx_weights(m, op, 0)
        act = ["Relu", "Relu"] if kw.get("nonlinearity") == "relu" else None
        ref = reference(op, x.numpy(), W, R, B, lens.numpy(), h0.numpy(), c0.numpy(), direction="bidirectional",
                        linear_before_reset=1 if op == "GRU" else 0, acts=act)
        y_ref = ref[0].transpose(0, 2, 1, 3).reshape(T, N, 12)  # [T, D, N, H] -> torch's [T, N, D*H]
        states = state if op == "LSTM" else (state,)
        err = max([np.abs(y_ref - y.numpy()).max()] +
                  [np.abs(r - s.numpy()).max() for r, s in zip(ref[1:], states)])
        assert err < 1e-5, (op, kw, err)
    print("numpy reference matches PyTorch (bidirectional, initial states, ragged lengths)")


# ---- PyTorch exports ----
class Stack(nn.Module):
    """A recurrent stack returning its full output and final states."""

    def __init__(self, rnn, with_state):
        super().__init__()
        self.rnn = rnn
        self.with_state = with_state

    def forward(self, x, *state):
        y, s = self.rnn(x, state[0]) if self.with_state else self.rnn(x)
        return (y,) + (s if isinstance(s, tuple) else (s,))


class LstmStateStack(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h0, c0):
        y, (h, c) = self.rnn(x, (h0, c0))
        return y, h, c


class LstmClassifier(nn.Module):
    """Embedded tokens -> LSTM -> linear layer on the last hidden state."""

    def __init__(self, vocab=50, d=16, hidden=24, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, ids):
        _, (h, _) = self.rnn(self.emb(ids))
        return self.fc(h[-1])


def torch_models():
    """(name, module, input names, output names, opset, make_inputs(batch, gen), batch axis per input)"""
    I, H, T = 6, 8, 5

    def seq_in(batch_first):
        return lambda b, g: [torch.randn((b, T, I) if batch_first else (T, b, I), generator=g)]

    def with_states(layers_dirs, batch_first, lstm):
        def make(b, g):
            x = torch.randn((b, T, I) if batch_first else (T, b, I), generator=g)
            s = [torch.randn(layers_dirs, b, H, generator=g) for _ in range(2 if lstm else 1)]
            return [x] + s
        return make

    return [
        ("rnn_lstm_bi2_op13", Stack(nn.LSTM(I, H, num_layers=2, bidirectional=True, batch_first=True), False),
         ["x"], ["y", "h", "c"], 13, seq_in(True), [0]),
        ("rnn_lstm_state_op17", LstmStateStack(nn.LSTM(I, H, num_layers=2)), ["x", "h0", "c0"], ["y", "h", "c"], 17,
         with_states(2, False, True), [1, 1, 1]),
        ("rnn_gru_bi2_op17", Stack(nn.GRU(I, H, num_layers=2, bidirectional=True, batch_first=True), True),
         ["x", "h0"], ["y", "h"], 17, with_states(4, True, False), [0, 1]),
        ("rnn_rnn_relu_op13", Stack(nn.RNN(I, H, num_layers=2, nonlinearity="relu"), True), ["x", "h0"],
         ["y", "h"], 13, with_states(2, False, False), [1, 1]),
        ("rnn_rnn_tanh_bi_op17", Stack(nn.RNN(I, H, bidirectional=True, batch_first=True), False), ["x"],
         ["y", "h"], 17, seq_in(True), [0]),
        ("rnn_lstm_classifier_op17", LstmClassifier(), ["ids"], ["logits"], 17,
         lambda b, g: [torch.randint(0, 50, (b, 9), generator=g)], [0]),
    ]


def export_torch(out_dir):
    for name, model, inputs, outputs, opset, make, batch_axes in torch_models():
        torch.manual_seed(sum(map(ord, name)))
        for p in model.parameters():  # default init is small; widen it for a sharper test
            p.data.uniform_(-0.6, 0.6)
        model.eval()
        gen = torch.Generator().manual_seed(11)
        axes = {n: {a: "batch"} for n, a in zip(inputs, batch_axes)}
        path = os.path.join(out_dir, name + ".onnx")
        torch.onnx.export(model, tuple(make(2, gen)), path, input_names=inputs, output_names=outputs,
                          opset_version=opset, dynamic_axes=axes, do_constant_folding=True)
        onnx.checker.check_model(onnx.load(path))
        for b in (1, 4):
            args = make(b, torch.Generator().manual_seed(100 + b))
            with torch.no_grad():
                res = model(*args)
            res = res if isinstance(res, tuple) else (res,)
            tensors = [("in:" + n, a.numpy()) for n, a in zip(inputs, args)]
            tensors += [("out:" + n, r.numpy()) for n, r in zip(outputs, res)]
            write_sht(os.path.join(out_dir, "%s.b%d.sht" % (name, b)), tensors)
        print("wrote", path, os.path.getsize(path), "bytes")


# ---- graphs built by hand ----
def rnd(rng, *shape, scale=0.5):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


class GraphBuilder:
    def __init__(self, name):
        self.name, self.nodes, self.inits, self.inputs, self.outputs = name, [], [], [], []
        self.feeds, self.refs = {}, {}

    def input(self, name, arr, dtype=TensorProto.FLOAT):
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(arr.shape)))
        self.feeds[name] = arr
        return name

    def const(self, name, arr):
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(self, op, prefix, inputs, outputs, ref, **attrs):
        """One recurrent node; `outputs` is a list of (name or "" when omitted)."""
        self.nodes.append(helper.make_node(op, inputs, outputs, name=prefix, **attrs))
        for n, r in zip(outputs, ref):
            if n:
                self.outputs.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, list(r.shape)))
                self.refs[n] = r

    def save(self, out_dir, opset, refs_by_suffix):
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        path = os.path.join(out_dir, self.name + ".onnx")
        onnx.save(model, path)
        for suffix, (feeds, refs) in refs_by_suffix.items():
            tensors = [("in:" + n, a) for n, a in feeds.items()] + [("out:" + n, a) for n, a in refs.items()]
            write_sht(os.path.join(out_dir, "%s%s.sht" % (self.name, suffix)), tensors)
        print("wrote", path, os.path.getsize(path), "bytes")


def ragged_and_full(build):
    """Builds the graph twice, with ragged and with full sequence_lens; same graph, two refs."""
    refs = {}
    for suffix, full in ((".ragged", False), (".full", True)):
        g = build(full)
        refs[suffix] = (dict(g.feeds), dict(g.refs))
    return g, refs


def graph_lstm_seqlens(out_dir):
    """Bidirectional LSTM: sequence_lens, initial_h, initial_c as inputs, every output; and a
    second LSTM on the same input with peepholes, clip, input_forget, reverse and
    non-default activations (the engine's loop)."""
    T, N, I, H = 6, 3, 5, 4

    def build(full):
        rng = np.random.default_rng(21)
        g = GraphBuilder("rnn_graph_lstm")
        X = rnd(rng, T, N, I, scale=1.0)
        lens = np.array([T, T, T] if full else [6, 2, 4], dtype=np.int32)
        h0, c0 = rnd(rng, 2, N, H), rnd(rng, 2, N, H)
        W, R, B = rnd(rng, 2, 4 * H, I), rnd(rng, 2, 4 * H, H), rnd(rng, 2, 8 * H)
        x = g.input("x", X)
        sl = g.input("seq_lens", lens, TensorProto.INT32)
        ih, ic = g.input("h0", h0), g.input("c0", c0)
        ins = [x, g.const("W", W), g.const("R", R), g.const("B", B), sl, ih, ic]
        g.node("LSTM", "lstm_bi", ins, ["y", "y_h", "y_c"],
               reference("LSTM", X, W, R, B, lens, h0, c0, direction="bidirectional"),
               direction="bidirectional", hidden_size=H)
        W2, R2, B2, P2 = rnd(rng, 1, 4 * H, I), rnd(rng, 1, 4 * H, H), rnd(rng, 1, 8 * H), rnd(rng, 1, 3 * H)
        acts, alphas, betas = ["HardSigmoid", "Elu", "Softsign"], [0.3, 0.8], [0.45]
        ref = reference("LSTM", X, W2, R2, B2, lens, None, None, P2, direction="reverse", clip=1.5,
                        input_forget=1, acts=acts, alphas=alphas, betas=betas)
        g.node("LSTM", "lstm_peephole", [x, g.const("W2", W2), g.const("R2", R2), g.const("B2", B2), sl, "", "",
                                         g.const("P2", P2)], ["y2", "", "y2_c"], [ref[0], None, ref[2]],
               direction="reverse", hidden_size=H, clip=1.5, input_forget=1, activations=acts,
               activation_alpha=alphas, activation_beta=betas)
        return g

    g, refs = ragged_and_full(build)
    g.save(out_dir, 13, refs)


def graph_gru_seqlens(out_dir):
    """GRU without linear_before_reset (bidirectional, sequence_lens, initial_h) and with it
    (reverse, default activations; and forward with ScaledTanh/HardSigmoid and clip)."""
    T, N, I, H = 5, 3, 4, 6

    def build(full):
        rng = np.random.default_rng(22)
        g = GraphBuilder("rnn_graph_gru")
        X = rnd(rng, T, N, I, scale=1.0)
        lens = np.array([T, T, T] if full else [3, 5, 1], dtype=np.int32)
        h0 = rnd(rng, 2, N, H)
        x = g.input("x", X)
        sl = g.input("seq_lens", lens, TensorProto.INT32)
        ih = g.input("h0", h0)
        W, R, B = rnd(rng, 2, 3 * H, I), rnd(rng, 2, 3 * H, H), rnd(rng, 2, 6 * H)
        g.node("GRU", "gru_lbr0", [x, g.const("W", W), g.const("R", R), g.const("B", B), sl, ih], ["y", "y_h"],
               reference("GRU", X, W, R, B, lens, h0, direction="bidirectional"),
               direction="bidirectional", hidden_size=H)
        W2, R2, B2 = rnd(rng, 1, 3 * H, I), rnd(rng, 1, 3 * H, H), rnd(rng, 1, 6 * H)
        g.node("GRU", "gru_lbr1_reverse", [x, g.const("W2", W2), g.const("R2", R2), g.const("B2", B2), sl],
               ["y2", "y2_h"], reference("GRU", X, W2, R2, B2, lens, direction="reverse", linear_before_reset=1),
               direction="reverse", hidden_size=H, linear_before_reset=1)
        acts, alphas, betas = ["HardSigmoid", "ScaledTanh"], [0.25, 1.2], [0.5, 0.9]
        g.node("GRU", "gru_lbr1_acts", [x, "W2", "R2", "B2", sl],
               ["", "y3_h"], [None, reference("GRU", X, W2, R2, B2, lens, linear_before_reset=1, clip=2.0,
                                              acts=acts, alphas=alphas, betas=betas)[1]],
               hidden_size=H, linear_before_reset=1, clip=2.0, activations=acts, activation_alpha=alphas,
               activation_beta=betas)
        return g

    g, refs = ragged_and_full(build)
    g.save(out_dir, 13, refs)


def graph_rnn_activations(out_dir):
    """RNN with LeakyRelu (oneDNN's relu with a slope), Sigmoid in reverse, and Affine /
    ThresholdedRelu / Softplus (the engine's loop), without biases or states."""
    T, N, I, H = 4, 2, 3, 5
    rng = np.random.default_rng(23)
    g = GraphBuilder("rnn_graph_rnn")
    X = rnd(rng, T, N, I, scale=1.0)
    x = g.input("x", X)
    cases = [("leaky", "forward", ["LeakyRelu"], [0.1], [], True),
             ("sigmoid_rev", "reverse", ["Sigmoid"], [], [], True),
             ("affine_bi", "bidirectional", ["Affine", "ThresholdedRelu"], [0.7, 0.05], [0.1], True),
             ("softplus_nobias", "forward", ["Softplus"], [], [], False)]
    for name, direction, acts, alphas, betas, bias in cases:
        D = 2 if direction == "bidirectional" else 1
        W, R, B = rnd(rng, D, H, I), rnd(rng, D, H, H), rnd(rng, D, 2 * H)
        ins = [x, g.const("W_" + name, W), g.const("R_" + name, R)] + ([g.const("B_" + name, B)] if bias else [])
        attrs = dict(direction=direction, hidden_size=H, activations=acts)
        if alphas:
            attrs["activation_alpha"] = alphas
        if betas:
            attrs["activation_beta"] = betas
        g.node("RNN", name, ins, ["y_" + name, "h_" + name],
               reference("RNN", X, W, R, B if bias else None, direction=direction, acts=acts, alphas=alphas,
                         betas=betas), **attrs)
    g.save(out_dir, 13, {"": (dict(g.feeds), dict(g.refs))})


def graph_layout1(out_dir):
    """Opset 14's layout 1 (batch first): a bidirectional LSTM with sequence_lens and initial
    states, and a bidirectional GRU without (oneDNN's ntc layouts)."""
    T, N, I, H = 5, 3, 4, 3

    def build(full):
        rng = np.random.default_rng(24)
        g = GraphBuilder("rnn_graph_layout1")
        X = rnd(rng, N, T, I, scale=1.0)
        lens = np.array([T, T, T] if full else [2, 5, 4], dtype=np.int32)
        h0, c0 = rnd(rng, N, 2, H), rnd(rng, N, 2, H)
        x = g.input("x", X)
        sl = g.input("seq_lens", lens, TensorProto.INT32)
        W, R, B = rnd(rng, 2, 4 * H, I), rnd(rng, 2, 4 * H, H), rnd(rng, 2, 8 * H)
        g.node("LSTM", "lstm_l1", [x, g.const("W", W), g.const("R", R), g.const("B", B), sl, g.input("h0", h0),
                                   g.input("c0", c0)], ["y", "y_h", "y_c"],
               reference("LSTM", X, W, R, B, lens, h0, c0, direction="bidirectional", layout=1),
               direction="bidirectional", hidden_size=H, layout=1)
        W2, R2, B2 = rnd(rng, 2, 3 * H, I), rnd(rng, 2, 3 * H, H), rnd(rng, 2, 6 * H)
        g.node("GRU", "gru_l1", [x, g.const("W2", W2), g.const("R2", R2), g.const("B2", B2)], ["y2", "y2_h"],
               reference("GRU", X, W2, R2, B2, direction="bidirectional", layout=1, linear_before_reset=1),
               direction="bidirectional", hidden_size=H, layout=1, linear_before_reset=1)
        return g

    g, refs = ragged_and_full(build)
    g.save(out_dir, 14, refs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    opts = parser.parse_args()
    check_reference_against_torch()
    export_torch(opts.out)
    graph_lstm_seqlens(opts.out)
    graph_gru_seqlens(opts.out)
    graph_rnn_activations(opts.out)
    graph_layout1(opts.out)


if __name__ == "__main__":
    main()
