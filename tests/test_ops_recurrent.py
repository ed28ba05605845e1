"""The recurrent ops beyond the unidirectional LSTM: BIDIRECTIONAL_SEQUENCE_LSTM and BIDIRECTIONAL_SEQUENCE_RNN
(speech and text models: a forward and a backward cell over one sequence, TFLite's auxiliary input stacking two
layers or feeding the backward cell) and SVDF (keyword spotting: a rank-r filter over a memory of past feature
activations). Each against LiteRT's kernels, several invokes in a row: the state variables carry over."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import litert
from .oputil import VARIANTS, hybrid_const, lstm_model
from .test_ops_indexing import invokes

F = np.float32


def against_litert(model: bytes, feeds: list, runs: int = 3, **kw) -> list:
    """Our outputs over ``runs`` invokes (the same feeds, so only a carried state changes them) against LiteRT's
    on one thread; returns ours."""
    got = invokes(Interpreter(model_content=model, **kw), [feeds] * runs)
    want = invokes(litert()(model_content=model, num_threads=1), [feeds] * runs)
    for (g, g_shapes), (w, w_shapes) in zip(got, want):
        assert g_shapes == w_shapes
        for a, b in zip(g, w):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    return got


def svdf_model(rng, *, batch=2, inputs=5, units=4, rank=1, memory=6, bias=True, act="NONE",
               around=False) -> bytes:
    """An SVDF (``around``: between two fully connected layers, which a GpuDelegate runs)."""
    filters = units * rank
    b = ModelBuilder()
    x = b.input("x", [batch, inputs])
    if around:
        h = b.tensor("fc0", [batch, inputs])
        b.op("FULLY_CONNECTED", [x, b.const("w0", rng.normal(0, .5, (inputs, inputs)).astype(F)), -1], [h])
        x = h
    wf = b.const("wf", rng.normal(0, .5, (filters, inputs)).astype(F))
    wt = b.const("wt", rng.normal(0, .5, (filters, memory)).astype(F))
    bb = b.const("b", rng.normal(0, .5, units).astype(F)) if bias else -1
    state = b.tensor("state", [batch, memory * filters], is_variable=True)
    y = b.tensor("y", [batch, units])
    b.op("SVDF", [x, wf, wt, bb, state], [y], rank=rank, fused_activation_function=act)
    if around:
        z = b.tensor("fc1", [batch, 3])
        b.op("FULLY_CONNECTED", [y, b.const("w1", rng.normal(0, .5, (3, units)).astype(F)), -1], [z],
             fused_activation_function="RELU")
        y = z
    b.output(y)
    return b.build()


@pytest.mark.parametrize("rank, bias, act", [(1, True, "NONE"), (2, False, "RELU"), (3, True, "TANH"),
                                             (1, True, "RELU6")])
def test_svdf_carries_its_memory(rng, rank, bias, act):
    """Eight invokes: the memory (6 steps) fills and then shifts; each output against LiteRT's."""
    model = svdf_model(rng, rank=rank, bias=bias, act=act)
    feeds = [[rng.normal(0, 1, (2, 5)).astype(F)] for _ in range(8)]
    got = invokes(Interpreter(model_content=model), feeds)
    want = invokes(litert()(model_content=model, num_threads=1), feeds)
    for (g, _), (w, _) in zip(got, want):
        np.testing.assert_allclose(g[0], w[0], rtol=2e-5, atol=2e-6)
    assert not np.allclose(got[6][0][0], got[7][0][0])


def test_svdf_beside_the_device(opencl_device, rng):
    """Between two device layers, through a GpuDelegate: the SVDF on the CPU kernels keeps its state across the
    partition, invoke after invoke."""
    model = svdf_model(rng, rank=2, around=True)
    feeds = [rng.normal(0, 1, (2, 5)).astype(F)]
    got = invokes(Interpreter(model_content=model, experimental_delegates=[GpuDelegate()]),
                  [feeds] * 4)
    want = invokes(litert()(model_content=model, num_threads=1), [feeds] * 4)
    for (g, _), (w, _) in zip(got, want):
        np.testing.assert_allclose(g[0], w[0], rtol=1e-4, atol=1e-5)


def test_svdf_refusals(rng):
    model = svdf_model(rng, rank=3, units=4)  # 12 filters: fine
    Interpreter(model_content=model).allocate_tensors()
    b = ModelBuilder()
    x = b.input("x", [1, 5])
    st = b.tensor("s", [1, 7 * 6], is_variable=True)
    y = b.tensor("y", [1, 3])
    b.op("SVDF", [x, b.const("wf", np.ones((7, 5), F)), b.const("wt", np.ones((7, 6), F)), -1, st], [y], rank=2)
    b.output(y)
    with pytest.raises(RuntimeError, match="rank 2 must be positive and divide the 7 filters"):
        Interpreter(model_content=b.build()).allocate_tensors()


AUX = ["none", "stacked", "backward"]  # no auxiliary input; one with weights; one feeding the backward cell


def sequence_shape(time_major: bool, batch: int, steps: int, n: int) -> list[int]:
    return [steps, batch, n] if time_major else [batch, steps, n]


def both_directions(b: ModelBuilder, x: int, aux: int, mode: str, time_major: bool, cell) -> tuple[int, int]:
    """The unidirectional equivalent of a bidirectional op: ``cell(b, name, input, reverse)`` adds one direction's
    sequence op and returns its output; the backward one runs on the input reversed in time, its output reversed
    back. A stacked auxiliary input is concatenated to the input (its weights to the input weights)."""
    time_axis = b.const("time_axis", np.array([0 if time_major else 1], np.int32))

    def reverse(t: int, name: str) -> int:
        out = b.tensor(name, b.main.tensors[t].shape)
        b.op("REVERSE_V2", [t, time_axis], [out])
        return out

    def concat(ts: list[int], name: str) -> int:
        shape = list(b.main.tensors[ts[0]].shape)
        shape[2] = sum(b.main.tensors[t].shape[2] for t in ts)
        out = b.tensor(name, shape)
        b.op("CONCATENATION", ts, [out], axis=2)
        return out

    x_fw = concat([x, aux], "x_cat") if mode == "stacked" else x
    x_bw = aux if mode == "backward" else x_fw
    fw = cell(b, "fw", x_fw)
    bw = reverse(cell(b, "bw", reverse(x_bw, "x_reversed")), "bw_reversed")
    return fw, bw


def equivalent(rng, cell, shape, n_in: int, n_aux: int, aux: str, time_major: bool, merge: bool
               ) -> tuple[bytes, list]:
    """The unidirectional equivalent model (``both_directions`` of ``cell``, its outputs concatenated where
    ``merge``) and feeds for it and the bidirectional op (the input, and the auxiliary input where there is one)."""
    o = ModelBuilder()
    fw, bw = both_directions(o, o.input("x", shape(n_in)), o.input("aux", shape(n_aux)) if aux != "none" else -1,
                             aux, time_major, cell)
    if merge:
        width = o.main.tensors[fw].shape[2] + o.main.tensors[bw].shape[2]
        y = o.tensor("y", shape(width))
        o.op("CONCATENATION", [fw, bw], [y], axis=2)
        o.output(y)
    else:
        o.output(fw, bw)
    feeds = [rng.normal(0, 1, shape(n_in)).astype(F)] + ([rng.normal(0, 1, shape(n_aux)).astype(F)]
                                                          if aux != "none" else [])
    return o.build(), feeds


def check_bidirectional(model: bytes, oracle: bytes, feeds: list, fused_ok: bool) -> None:
    """Ours against LiteRT running the unidirectional equivalent (``oracle``), three invokes; and against
    LiteRT's own bidirectional kernel where ``fused_ok`` (the layouts in which that kernel has none of the known
    faults named by the callers)."""
    got = invokes(Interpreter(model_content=model), [feeds] * 3)
    references = [oracle] + ([model] if fused_ok else [])
    for reference in references:
        want = invokes(litert()(model_content=reference, num_threads=1), [feeds] * 3)
        for (g, g_shapes), (w, w_shapes) in zip(got, want):
            assert g_shapes == w_shapes
            for a, c in zip(g, w):
                np.testing.assert_allclose(a, c, rtol=2e-5, atol=2e-6)
    assert not np.allclose(got[0][0][0], got[1][0][0])  # (the state carried)


def rnn_weights(rng, n_in: int, n_aux: int, units: int) -> dict[str, np.ndarray]:
    w = lambda *s: rng.normal(0, .5, s).astype(F)
    return {"w": w(units, n_in), "aux": w(units, n_aux), "r": w(units, units), "b": w(units)}


RNN_LAYOUTS = [(False, False, "TANH"), (True, True, "RELU"), (True, False, "NONE"), (False, True, "RELU6")]


def bidirectional_rnn(rng, aux: str, merge: bool, time_major: bool, act: str, hybrid: bool = False):
    """A BIDIRECTIONAL_SEQUENCE_RNN, its unidirectional equivalent, feeds, and whether LiteRT's own kernel
    computes it right (``hybrid``: int8 weights)."""
    batch, steps, n_in = 2, 4, 3
    n_aux = n_in if aux == "backward" else 5  # (LiteRT wants the backward weights as wide as the input)
    units = {"fw": 4, "bw": 6}
    shape = lambda n: sequence_shape(time_major, batch, steps, n)
    bw_in = n_aux if aux == "backward" else n_in
    weights = {"fw": rnn_weights(rng, n_in, n_aux, units["fw"]), "bw": rnn_weights(rng, bw_in, n_aux, units["bw"])}
    outputs = lambda b: ([b.tensor("y", shape(units["fw"] + units["bw"]))] if merge else
                         [b.tensor("fw_y", shape(units["fw"])), b.tensor("bw_y", shape(units["bw"]))])

    const = lambda m, name, v: hybrid_const(m, name, v) if hybrid and not name.endswith("_b") else m.const(name, v)
    b = ModelBuilder()
    x = b.input("x", shape(n_in))
    a = b.input("aux", shape(n_aux)) if aux != "none" else -1
    ins = [x]
    for name in ("fw", "bw"):
        ws = weights[name]
        ins += [const(b, f"{name}_{k}", ws[k]) for k in ("w", "r", "b")]
        ins.append(b.tensor(f"{name}_h", [batch, units[name]], is_variable=True))
    ins += [a] + ([const(b, f"{name}_aux", weights[name]["aux"]) for name in ("fw", "bw")] if aux == "stacked"
                  else [-1, -1])
    outs = outputs(b)
    b.op("BIDIRECTIONAL_SEQUENCE_RNN", ins, outs, time_major=time_major, merge_outputs=merge,
         fused_activation_function=act)
    b.output(*outs)

    def cell(o: ModelBuilder, name: str, inp: int) -> int:
        ws = weights[name]
        w = np.concatenate([ws["w"], ws["aux"]], axis=1) if aux == "stacked" else ws["w"]
        y = o.tensor(f"{name}_out", shape(units[name]))
        o.op("UNIDIRECTIONAL_SEQUENCE_RNN", [inp, const(o, f"{name}_w", w), const(o, f"{name}_r", ws["r"]),
                                             const(o, f"{name}_b", ws["b"]),
                                             o.tensor(f"{name}_h", [batch, units[name]], is_variable=True)],
             [y], time_major=time_major, fused_activation_function=act)
        return y

    oracle, feeds = equivalent(rng, cell, shape, n_in, n_aux, aux, time_major, merge)
    # LiteRT's kernel: time-major, it steps the auxiliary input by the input's width; batch-major, its backward
    # cell reads the input, not the auxiliary input it was given; time-major and unmerged, it gives the backward
    # output the shape [batch, time, units] over time-major data; its hybrid kernel, time-major, runs the whole
    # sequence once per time step (and crashes where the outputs are merged)
    fused_ok = not ((time_major and aux == "stacked") or (not time_major and aux == "backward")
                    or (time_major and not merge) or (time_major and hybrid))
    return b.build(), oracle, feeds, fused_ok


@pytest.mark.parametrize("aux", AUX)
@pytest.mark.parametrize("merge, time_major, act", RNN_LAYOUTS)
def test_bidirectional_sequence_rnn(rng, aux, merge, time_major, act):
    check_bidirectional(*bidirectional_rnn(rng, aux, merge, time_major, act))


@pytest.mark.parametrize("aux", ["none", "backward"])  # (a stacked input's rows are quantized apart, not as one)
@pytest.mark.parametrize("merge, time_major, act", RNN_LAYOUTS)
def test_hybrid_bidirectional_sequence_rnn(rng, aux, merge, time_major, act):
    check_bidirectional(*bidirectional_rnn(rng, aux, merge, time_major, act, hybrid=True))


@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("op", ["RNN", "UNIDIRECTIONAL_SEQUENCE_RNN"])
def test_hybrid_rnn(rng, op, asymmetric):
    """A dynamic-range basic RNN (int8 weights): LiteRT's hybrid steps, three invokes, state carried."""
    batch, steps, n_in, units = 2, 5, 4, 6
    for time_major, act in ((False, "TANH"), (True, "RELU")):
        shape = [batch, n_in] if op == "RNN" else ([steps, batch, n_in] if time_major else [batch, steps, n_in])
        b = ModelBuilder()
        x = b.input("x", shape)
        ins = [x, hybrid_const(b, "w", rng.normal(0, .5, (units, n_in)).astype(F)),
               hybrid_const(b, "r", rng.normal(0, .5, (units, units)).astype(F)),
               b.const("b", rng.normal(0, .5, units).astype(F)), b.tensor("h", [batch, units], is_variable=True)]
        y = b.tensor("y", shape[:-1] + [units])
        options = {"fused_activation_function": act, "asymmetric_quantize_inputs": asymmetric}
        b.op(op, ins, [y], **options | ({} if op == "RNN" else {"time_major": time_major}))
        b.output(y)
        model = b.build()
        feeds = [[rng.normal(0, 2, shape).astype(F)] for _ in range(3)]
        got = invokes(Interpreter(model_content=model), feeds)
        want = invokes(litert()(model_content=model, num_threads=1), feeds)
        for (g, _), (w, _) in zip(got, want):
            np.testing.assert_allclose(g[0], w[0], rtol=1e-5, atol=1e-6)


GATES = "ifco"


def lstm_weights(rng, n_in: int, n_aux: int, units: int, n_out: int, cifg: bool, peephole: bool) -> dict:
    """One direction's weights by name (gates i, f, c, o; i absent under CIFG)."""
    w = lambda *s: rng.uniform(-.5, .5, s).astype(F)
    gates = GATES[1:] if cifg else GATES
    ws = {f"w{g}": w(units, n_in) for g in gates} | {f"aux{g}": w(units, n_aux) for g in gates}
    ws |= {f"r{g}": w(units, n_out) for g in gates} | {f"b{g}": w(units) for g in gates}
    if peephole:
        ws |= {f"p{g}": w(units) for g in ("fo" if cifg else "ifo")}
    if n_out != units:
        ws |= {"proj": w(n_out, units), "proj_bias": w(n_out)}
    return ws


def lstm_inputs(b: ModelBuilder, name: str, ws: dict, input_weights: dict, hybrid: bool = False) -> list[int]:
    """The 17 weight inputs of one LSTM direction, in TFLite's order (absent: -1); ``hybrid``: the weights (not
    the biases) int8."""

    def c(k, v=None):
        if v is None and k not in ws:
            return -1
        value = ws[k] if v is None else v
        weight = hybrid and k[0] in "wrp" and k != "proj_bias"
        return hybrid_const(b, f"{name}_{k}", value) if weight else b.const(f"{name}_{k}", value)

    ins = [c(f"w{g}", input_weights.get(g)) if f"w{g}" in ws else -1 for g in GATES]
    ins += [c(f"r{g}") for g in GATES] + [c(f"p{g}") for g in "ifo"] + [c(f"b{g}") for g in GATES]
    return ins + [c("proj"), c("proj_bias")]


LSTM_VARIANTS = {
    "plain": {"merge": True},
    "cifg_peephole": {"cifg": True, "peephole": True},
    "projection": {"projection": True, "merge": True, "time_major": True},
    "clipped": {"clip": True, "time_major": True},
}


def bidirectional_lstm(rng, aux: str, variant: str, hybrid: bool = False) -> tuple[bytes, bytes, list, bool]:
    """A BIDIRECTIONAL_SEQUENCE_LSTM of ``variant``, its unidirectional equivalent, feeds, and whether LiteRT's
    own kernel computes it right."""
    opts = LSTM_VARIANTS[variant]
    cifg, peephole, merge, time_major = (opts.get(k, False) for k in ("cifg", "peephole", "merge", "time_major"))
    batch, steps, n_in, units = 2, 4, 3, 5  # (LiteRT wants both cells of one size, inputs as wide as the input)
    n_aux = n_in if aux == "backward" else 4
    n_out = 3 if opts.get("projection") else units
    shape = lambda n: sequence_shape(time_major, batch, steps, n)
    weights = {name: lstm_weights(rng, n_in, n_aux, units, n_out, cifg, peephole) for name in ("fw", "bw")}
    clip = 0.5 if opts.get("clip") else 0.0
    options = {"fused_activation_function": "TANH", "cell_clip": clip, "proj_clip": clip, "time_major": time_major}
    states = lambda b, name: [b.tensor(f"{name}_h", [batch, n_out], is_variable=True),
                              b.tensor(f"{name}_c", [batch, units], is_variable=True)]

    b = ModelBuilder()
    x = b.input("x", shape(n_in))
    a = b.input("aux", shape(n_aux)) if aux != "none" else -1
    ins = [x, *lstm_inputs(b, "fw", weights["fw"], {}, hybrid), *lstm_inputs(b, "bw", weights["bw"], {}, hybrid)]
    ins += states(b, "fw") + states(b, "bw") + [a]
    const = (lambda name, v: hybrid_const(b, name, v)) if hybrid else b.const
    for name in ("fw", "bw"):
        ins += [const(f"{name}_aux{g}", weights[name][f"aux{g}"]) if aux == "stacked" and f"aux{g}" in
                weights[name] else -1 for g in GATES]
    outs = ([b.tensor("y", shape(2 * n_out))] if merge else [b.tensor("fw_y", shape(n_out)),
                                                            b.tensor("bw_y", shape(n_out))])
    b.op("BIDIRECTIONAL_SEQUENCE_LSTM", ins, outs, merge_outputs=merge, **options)
    b.output(*outs)

    def cell(o: ModelBuilder, name: str, inp: int) -> int:
        ws = weights[name]
        stacked = {g: np.concatenate([ws[f"w{g}"], ws[f"aux{g}"]], axis=1) for g in GATES
                   if aux == "stacked" and f"w{g}" in ws}
        y = o.tensor(f"{name}_out", shape(n_out))
        o.op("UNIDIRECTIONAL_SEQUENCE_LSTM", [inp, *lstm_inputs(o, name, ws, stacked, hybrid), *states(o, name)],
             [y], **options)
        return y

    oracle, feeds = equivalent(rng, cell, shape, n_in, n_aux, aux, time_major, merge)
    # LiteRT's kernel, batch-major and merged, offsets the second batch row's state by the merged width
    return b.build(), oracle, feeds, time_major or not merge


@pytest.mark.parametrize("aux", AUX)
@pytest.mark.parametrize("variant", sorted(LSTM_VARIANTS))
def test_bidirectional_sequence_lstm(rng, aux, variant):
    check_bidirectional(*bidirectional_lstm(rng, aux, variant))


@pytest.mark.parametrize("aux", ["none", "backward"])  # (a stacked input's rows are quantized apart, not as one)
@pytest.mark.parametrize("variant", sorted(LSTM_VARIANTS))
def test_hybrid_bidirectional_sequence_lstm(rng, aux, variant):
    """Dynamic-range (int8 weights): against LiteRT's hybrid unidirectional LSTMs, and its hybrid bidirectional
    kernel (where it is right, as for float weights)."""
    check_bidirectional(*bidirectional_lstm(rng, aux, variant, hybrid=True))


def integer_svdf_model(rng, *, batch=2, inputs=5, units=4, rank=2, memory=6, act="RELU", bias=True) -> bytes:
    q = lambda scale, zero_point=0: {"scale": np.float32([scale]), "zero_point": np.int64([zero_point])}
    filters = units * rank
    b = ModelBuilder()
    x = b.input("x", [batch, inputs], np.int8, quant=q(0.05, 3))
    wf = b.const("wf", rng.integers(-127, 128, (filters, inputs)).astype(np.int8), np.int8, quant=q(0.01))
    wt = b.const("wt", rng.integers(-3000, 3000, (filters, memory)).astype(np.int16), np.int16, quant=q(2e-4))
    bb = b.const("b", rng.integers(-500, 500, units).astype(np.int32), np.int32, quant=q(5e-4)) if bias else -1
    state = b.tensor("state", [batch, memory * filters], np.int16, quant=q(0.004), is_variable=True)
    y = b.tensor("y", [batch, units], np.int8, quant=q(0.3, -2))
    b.op("SVDF", [x, wf, wt, bb, state], [y], rank=rank, fused_activation_function=act)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("rank, bias", [(1, True), (2, False), (3, True)])
def test_integer_svdf_equals_litert(rng, rank, bias):
    """The integer SVDF (int8 in and out, int16 state and time weights): LiteRT's values exactly over eight
    invokes, the int16 state carried."""
    model = integer_svdf_model(rng, rank=rank, bias=bias)
    feeds = [[rng.integers(-128, 128, (2, 5)).astype(np.int8)] for _ in range(8)]
    got = invokes(Interpreter(model_content=model), feeds)
    want = invokes(litert()(model_content=model, num_threads=1), feeds)
    for (g, _), (w, _) in zip(got, want):
        np.testing.assert_array_equal(g[0], w[0])
    outputs = np.stack([g[0] for g, _ in got])
    assert len(np.unique(outputs)) > 20 and (np.abs(outputs) < 127).mean() > 0.5  # (not saturated)


def test_integer_svdf_takes_relu_only(rng):
    with pytest.raises(RuntimeError, match="an integer SVDF takes the RELU activation only"):
        Interpreter(model_content=integer_svdf_model(rng, act="NONE")).allocate_tensors()


def integer_lstm_model(rng, batch: int, steps: int, n_in: int, units: int) -> bytes:
    """A full-integer UNIDIRECTIONAL_SEQUENCE_LSTM as TFLite's quantizer writes one (8x8->16: int8 input, output
    and hidden state, int16 cell state, int32 biases, five intermediates giving its internal scales)."""
    q = lambda scale, zero_point=0: {"scale": np.float32([scale]), "zero_point": np.int64([zero_point])}
    in_q, w_scale, out_q = q(0.03, 2), 0.005, q(1 / 128)
    b = ModelBuilder()
    x = b.input("x", (batch, steps, n_in), np.int8, quant=in_q)
    w = lambda name, shape: b.const(name, rng.integers(-127, 128, shape).astype(np.int8), np.int8, quant=q(w_scale))
    ins = [x] + [w(f"w{g}", (units, n_in)) for g in "ifco"] + [w(f"r{g}", (units, units)) for g in "ifco"]
    ins += [-1, -1, -1]
    ins += [b.const(f"b{g}", rng.integers(-2000, 2000, units).astype(np.int32), np.int32, quant=q(0.03 * w_scale))
            for g in "ifco"]
    ins += [-1, -1, b.tensor("h", (batch, units), np.int8, quant=out_q, is_variable=True),
            b.tensor("c", (batch, units), np.int16, quant=q(2 ** -11), is_variable=True)]
    mids = [b.tensor(f"gate{i}", (0,), np.int16, quant=q(2 ** -12)) for i in range(4)]
    mids.append(b.tensor("hidden", (0,), np.int8, quant=out_q))
    y = b.tensor("y", (batch, steps, units), np.int8, quant=out_q)
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [y], intermediates=mids, fused_activation_function="TANH",
         time_major=False)
    b.output(y)
    return b.build()


def test_integer_lstm_carries_its_state(rng):
    """A full-integer LSTM runs as the float LSTM between dequantize and quantize; its int16 / int8 state
    variables are quantized back after each invoke (they were left as they were, so every invoke started from
    zeros: LiteRT's second invoke differed by up to 51 steps). Five invokes within one step of LiteRT's."""
    model = integer_lstm_model(rng, batch=2, steps=12, n_in=7, units=9)
    feeds = [[rng.integers(-128, 128, (2, 12, 7)).astype(np.int8)] for _ in range(5)]
    got = invokes(Interpreter(model_content=model), feeds)
    want = invokes(litert()(model_content=model, num_threads=1), feeds)
    for (g, _), (w, _) in zip(got, want):
        assert np.abs(g[0].astype(np.int32) - w[0]).max() <= 1
    again = invokes(Interpreter(model_content=model), [feeds[1]])  # (the same input from the zero state)
    assert np.abs(again[0][0][0].astype(np.int32) - got[1][0][0]).max() > 4


@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("op", ["UNIDIRECTIONAL_SEQUENCE_LSTM", "LSTM"])
def test_hybrid_lstm_takes_litert_s_quantized_steps(rng, op, variant, asymmetric):
    """A dynamic-range LSTM (int8 weights, float input and state), every variant, inputs quantized symmetrically
    or not: LiteRT's values to float32 rounding over three invokes. Its weights dequantized instead gave
    outputs a few thousandths of their range off."""
    model, feeds = lstm_model(op, rng, hybrid=True, asymmetric=asymmetric, **VARIANTS[variant])
    feeds = [feeds[0] * 3]  # (wide rows: coarse quantization steps, so a wrong step shows)
    got = invokes(Interpreter(model_content=model), [feeds] * 3)
    want = invokes(litert()(model_content=model, num_threads=1), [feeds] * 3)
    for (g, _), (w, _) in zip(got, want):
        np.testing.assert_allclose(g[0], w[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("asymmetric", [False, True])
def test_hybrid_svdf(rng, asymmetric):
    """A dynamic-range SVDF (int8 feature and time weights): LiteRT's hybrid values over eight invokes."""
    batch, inputs, units, rank, memory = 2, 5, 4, 2, 6
    filters = units * rank
    b = ModelBuilder()
    x = b.input("x", [batch, inputs])
    wf = hybrid_const(b, "wf", rng.normal(0, .5, (filters, inputs)).astype(F))
    wt = hybrid_const(b, "wt", rng.normal(0, .5, (filters, memory)).astype(F))
    state = b.tensor("state", [batch, memory * filters], is_variable=True)
    y = b.tensor("y", [batch, units])
    b.op("SVDF", [x, wf, wt, b.const("b", rng.normal(0, .5, units).astype(F)), state], [y], rank=rank,
         fused_activation_function="RELU", asymmetric_quantize_inputs=asymmetric)
    b.output(y)
    model = b.build()
    feeds = [[rng.normal(0, 2, (batch, inputs)).astype(F)] for _ in range(8)]
    got = invokes(Interpreter(model_content=model), feeds)
    want = invokes(litert()(model_content=model, num_threads=1), feeds)
    for (g, _), (w, _) in zip(got, want):
        np.testing.assert_allclose(g[0], w[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", sorted(LSTM_VARIANTS))
def test_bidirectional_lstm_runs_on_the_device_as_two_cells(opencl_device, rng, variant):
    """Under a GpuDelegate a float BIDIRECTIONAL_SEQUENCE_LSTM is split into its two unidirectional cells and the
    time reversals (graph.bidirectional), which the device runs (the peephole / projection cells on the CPU kernels,
    as for a unidirectional LSTM), each cell keeping the op's state variables: three invokes against LiteRT running
    the same cells, the state carried and each direction's in its own variables. Before, the whole op ran on the
    CPU kernels."""
    from tflgpu import GpuDelegate

    model, oracle, feeds, _ = bidirectional_lstm(rng, "none", variant)
    it, ref = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()]), litert()(
        model_content=oracle, num_threads=1)
    got, want = invokes(it, [feeds] * 3), invokes(ref, [feeds] * 3)
    states = lambda i: {d["name"]: i.get_tensor(d["index"]) for d in i.get_tensor_details()
                        if d["name"] in ("fw_h", "fw_c", "bw_h", "bw_c")}
    ours, theirs = states(it), states(ref)
    assert len(ours) == 4 and all(np.allclose(ours[k], theirs[k], rtol=2e-5, atol=2e-6) for k in ours)
    for (g, g_shapes), (w, w_shapes) in zip(got, want):
        assert g_shapes == w_shapes
        for a, c in zip(g, w):
            np.testing.assert_allclose(a, c, rtol=2e-5, atol=2e-6)
    assert not np.allclose(got[0][0][0], got[1][0][0])  # (the state carried)
    plan = it.gpu_plan
    assert plan.pass_counts["split_bidirectional"] == 1
    assert plan.cpu_op_count == (0 if variant in ("plain", "clipped") else 2)


def test_inspect_says_a_bidirectional_lstm_reaches_the_device(tmp_path, rng, capsys):
    from tflgpu.cli import main

    path = tmp_path / "bidirectional.tflite"
    path.write_bytes(bidirectional_lstm(rng, "none", "plain")[0])
    assert main(["inspect", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("BIDIRECTIONAL_SEQUENCE_LSTM"))
    assert line.endswith("float32 as UNIDIRECTIONAL_SEQUENCE_LSTM; else no (runs on cpu)")
