"""Per-op precision in FP16 plans (graph.precision, runtime.precision): ops whose FP16 storage costs accuracy
keep FP32 storage, decided on calibration inputs, stored with the plan, listed by ``inspect --precision``;
checked against LiteRT's FP32 output."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.graph.precision import STORAGE_CAST, insert_casts, stored_fp16
from tflgpu.model import read_model
from tflgpu.model.builder import ModelBuilder
from tflgpu.runtime import precision as runtime_precision

from .conftest import corpus_model, litert, run_model


def rel_errors(got, want) -> list[float]:
    return [float(np.abs(g.astype(np.float64) - w).max() / np.abs(w).max()) for g, w in zip(got, want)]


def fragile_model() -> bytes:
    """Two ways FP16 storage fails. Output 0: a cancellation, (h·(W + w)) - (h·W) with |h·W| ~ 1e3 and the
    difference ~ 1, of which FP16 storage of h·W keeps nothing. Output 1: h·W x 60 (past 65,504) x 1e-4."""
    rng = np.random.default_rng(7)
    b = ModelBuilder()
    x = b.input("x", (1, 16, 16, 8))

    def conv(name, src, w):
        y = b.tensor(name, (1, 16, 16, w.shape[0]))
        b.op("CONV_2D", [src, b.const(name + "_w", w), b.const(name + "_b", np.zeros(w.shape[0], np.float32))], [y],
             padding="SAME", stride_h=1, stride_w=1, fused_activation_function="NONE")
        return y

    def binop(op, name, p, q):
        y = b.tensor(name, (1, 16, 16, 16))
        b.op(op, [p, q], [y], fused_activation_function="NONE")
        return y

    def weights(cout, cin, scale):
        return (rng.standard_normal((cout, 1, 1, cin)) * scale).astype(np.float32)

    h = conv("h", x, weights(16, 8, 0.35))
    w_big, w_small = weights(16, 16, 500.0), weights(16, 16, 0.25)
    big = conv("big", h, w_big)
    diff = binop("SUB", "diff", conv("shifted", h, w_big + w_small), big)
    out0 = conv("out0", diff, weights(8, 16, 0.25))
    huge = binop("MUL", "huge", big, b.const("k", np.full((1, 1, 1, 16), 60.0, np.float32)))
    back = binop("MUL", "back", huge, b.const("k2", np.full((1, 1, 1, 16), 1e-4, np.float32)))
    out1 = conv("out1", back, weights(8, 16, 0.25))
    b.output(out0, out1)
    return b.build()


def deep_model(layers: int = 16, c: int = 16) -> bytes:
    """A chain of 1x1 convs, each an orthogonal map with singular values over a decade (normalized): every layer
    passes on, and moves a little, the rounding of all before it; none stands out."""
    rng = np.random.default_rng(3)
    b = ModelBuilder()
    y = b.input("x", (1, 8, 8, c))
    for i in range(layers):
        u, _ = np.linalg.qr(rng.standard_normal((c, c)))
        v, _ = np.linalg.qr(rng.standard_normal((c, c)))
        s = np.logspace(0, 1, c)[:: 1 if i % 2 == 0 else -1]
        w = (u @ np.diag(s / np.sqrt(np.mean(s**2))) @ v.T).astype(np.float32)
        out = b.tensor(f"y{i}", (1, 8, 8, c))
        b.op("CONV_2D", [y, b.const(f"w{i}", w.reshape(c, 1, 1, c)), b.const(f"b{i}", np.zeros(c, np.float32))],
             [out], padding="SAME", stride_h=1, stride_w=1, fused_activation_function="NONE")
        y = out
    b.output(y)
    return b.build()


@pytest.fixture
def fp16_device(opencl_device):
    if not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    return opencl_device


@pytest.fixture(scope="module")
def fragile():
    data = fragile_model()
    x = [np.random.default_rng(0).uniform(-1, 1, (1, 16, 16, 8)).astype(np.float32)]
    return data, x, run_model(litert(), data, x)


def _fp16(data, **kw):
    return Interpreter(model_content=data, delegate=GpuDelegate(precision_loss_allowed=True, cache=False,
                                                               tuning="none", **kw))


def test_storage_that_costs_accuracy_stays_fp32(fp16_device, fragile):
    data, x, want = fragile
    # FP16 everywhere FP16 can hold the values (an unbounded budget): the cancellation is lost whole
    loose = _fp16(data, fp16_error_budget=math.inf)
    assert rel_errors(run_model(lambda **kw: loose, data, x), want)[0] > 0.1
    it = _fp16(data)
    got = run_model(lambda **kw: it, data, x)
    assert max(rel_errors(got, want)) < 1e-2, rel_errors(got, want)
    plan = it.gpu_plan
    reasons = plan.precision.fp32
    ops = {op.index: op.name for op in plan.sg.operators}
    assert any("amplifies FP16 rounding" in why and ops[i] == "SUB" for i, why in reasons.items()), reasons
    assert any("FP16's largest is 65,504" in why and ops[i] == "MUL" for i, why in reasons.items()), reasons
    assert 0 < plan.io.fp16_share < 1
    casts = [s for s in plan.steps if s.op.name == STORAGE_CAST]
    assert casts and all(s.device == "gpu" for s in casts)
    for s in plan.steps:  # every kernel stores in its op's precision, the casts in the one they convert to
        if s.device == "gpu" and s.op.name != STORAGE_CAST:
            assert all(sp.fp16 == (s.op.index not in reasons) for sp in s.specs), s.op.name
    assert plan.gpu_op_count == len(read_model(data).subgraphs[0].operators)  # (casts are not the model's ops)


def test_values_past_fp16_range_are_kept_with_their_readers(fp16_device, fragile):
    data, x, want = fragile
    it = _fp16(data, fp16_error_budget=math.inf)  # the range rule alone
    got = run_model(lambda **kw: it, data, x)
    assert np.isfinite(got[1]).all() and rel_errors(got, want)[1] < 1e-2
    names = {op.index: op.name for op in it.gpu_plan.sg.operators}
    assert sorted(names[i] for i in it.gpu_plan.precision.fp32) == ["MUL", "MUL"]


def test_fp32_plans_and_well_conditioned_models_have_no_casts(opencl_device, rng):
    path = corpus_model("mobilenet_v2_1.0_224.tflite")
    # (the session's cache: test_gpu_corpus's plans of the model, where it ran first, stored with their choices)
    plan = Interpreter(str(path), delegate=GpuDelegate(tuning="none")).gpu_plan
    assert not plan.precision.fp32 and not any(s.op.name == STORAGE_CAST for s in plan.steps)
    if opencl_device.identity.fp16:
        plan = Interpreter(str(path), delegate=GpuDelegate(precision_loss_allowed=True, tuning="none")).gpu_plan
        assert not plan.precision.fp32 and plan.io.fp16_share == 1.0 and 0 <= plan.precision.error < 4e-3


def test_where_no_op_stands_out_whole_parts_stay_fp16(fp16_device):
    """All-FP16 storage of the deep chain moves its output by ~1.4e-3, spread over every layer. Under a budget
    of 1e-3 the parts of the chain that add least stay FP16 and the rest FP32; under 1e-5 nothing fits and the
    whole plan stores FP32."""
    data = deep_model()
    x = [np.random.default_rng(0).uniform(-1, 1, (1, 8, 8, 16)).astype(np.float32)]
    want = run_model(litert(), data, x)
    it = _fp16(data, fp16_error_budget=1e-3, calibration_inputs=[x])
    choice = it.gpu_plan.precision
    assert 0 < len(choice.fp32) < 16 and choice.error <= 1e-3
    assert all(why.startswith("in a part of the graph") for why in choice.fp32.values()), choice.fp32
    assert rel_errors(run_model(lambda **kw: it, data, x), want)[0] < 2e-3
    it = _fp16(data, fp16_error_budget=1e-5, calibration_inputs=[x])
    assert len(it.gpu_plan.precision.fp32) == 16 and it.gpu_plan.io.fp16_share == 0
    assert rel_errors(run_model(lambda **kw: it, data, x), want)[0] < 1e-5


def test_a_ranking_op_reads_exact_values(fp16_device):
    """fallback_ops' ARG_MAX output is an index per pixel: a near-tie FP16 swapped moved it by up to 15 (a
    relative error of 1); now the ops it compares are computed exactly and it matches LiteRT exactly. The sums
    the conv also stores (a CONCATENATION reads them) stay half: every intermediate byte is FP16."""
    path = corpus_model("fallback_ops.tflite")
    it = Interpreter(str(path), delegate=GpuDelegate(precision_loss_allowed=True, cache=False, tuning="none"))
    x = [np.random.default_rng(0).uniform(-1, 1, d["shape"]).astype(np.float32) for d in it.get_input_details()]
    got, want = run_model(lambda **kw: it, path, x), run_model(litert(), path, x)
    assert max(rel_errors(got, want)) < 1e-2
    for g, w in zip(got, want):
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w)
    # (its conv and the ARG_MAX are one op, graph.conv_arg: FP32 for the index, its sums stored half; the CAST of
    # the index to float reads it in FP32 and stores its float copy half, as the conv its sums)
    assert list(it.gpu_plan.precision.fp32.values()) == [
        "its answer FP16 rounding of near-equal values changes",
        "reads FP32 storage (it makes no float value of its own, or only from integers)"]
    assert it.gpu_plan.io.fp16_share == 1.0


def test_a_quantized_models_output_step_is_not_an_error(fp16_device):
    """int8 MobileNet v2's float view ends in a quantization simulator (steps of 1/256): a value on a rounding
    edge moves it by one step (LiteRT's own two CPU paths differ by one step on most inputs), which is 1.4%
    of its largest value. That step is not an FP16 error: the plan keeps every tensor FP16, within one step."""
    path = corpus_model("mobilenet_v2_1.0_224_int8.tflite")
    it = Interpreter(str(path), delegate=GpuDelegate(precision_loss_allowed=True, tuning="none"))  # (as above)
    assert not it.gpu_plan.precision.fp32 and it.gpu_plan.io.fp16_share == 1.0
    x = [np.random.default_rng(0).uniform(-1, 1, d["shape"]).astype(np.float32) for d in it.get_input_details()]
    got, want = run_model(lambda **kw: it, path, x), run_model(litert(), path, x)
    assert np.abs(got[0] - want[0]).max() <= 1 / 256 + 1e-6


@pytest.mark.parametrize("seed,ops,merged", [(600022, 1, None), (600022, 4, None), (803237, 4, "SEPARABLE_CONV"),
                                             (804667, 6, None), (900427, 4, None), (22, None, None),
                                             (1867, None, "POOLED_DENSE"), (2292, None, "POOLED_DENSE")])
def test_the_simulation_rounds_what_the_device_rounds(fp16_device, seed, ops, merged, monkeypatch):
    """The choice is only as good as its simulation of the FP16 plan. On int8 chains (a float view: every conv
    ends in a quantization simulator, which turns any difference in rounding into whole steps), the plan forced
    all-FP16 gives exactly the simulation's output on the device. It was up to 10 steps off: the CPU kernels keep
    the weights they were made with (the simulation rounded only what it passed them), and the simulation
    rounded a conv's sum to half before its simulator, which the device applies to the float32 sum. ``merged``:
    the plan runs that merged op's fused kernel (POOLED_DENSE: a GPU's plan, its kernels on this device), which
    must round its first op's values as the pair's storage does (a step off where it kept them in float)."""
    from tflgpu.graph.precision import PrecisionChoice
    from tflgpu.kernels.base import Target

    from .randmodels import model_for

    if merged == "POOLED_DENSE":
        monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    m, sim = model_for(seed, ops), {}

    def all_fp16(runner, samples, budget, floors=None, shaped=None):
        cal = runtime_precision._Calibration(runner, samples, floors or {}, shaped)
        sim["out"] = cal.simulate({})[0][runner.sg.outputs[0]]
        return PrecisionChoice({}, 0.0)

    monkeypatch.setattr("tflgpu.runtime.executor.choose_precision", all_fp16)
    it = Interpreter(model_content=m.data, delegate=GpuDelegate(precision_loss_allowed=True, cache=False,
                                                                tuning="none", calibration_inputs=[m.inputs]))
    assert it.gpu_plan.io.fp16_share == 1.0 and it.gpu_plan.cpu_op_count == 0
    if merged:
        assert [s.specs[0].params["fused"] for s in it.gpu_plan.steps if s.op.name == f"TFLGPU_{merged}"] == [True]
    (got,) = run_model(lambda **kw: it, m.data, m.inputs)
    np.testing.assert_array_equal(got, sim["out"])


def test_the_choice_is_stored_with_the_plan(fp16_device, fragile, tmp_path, monkeypatch):
    data, x, _ = fragile
    first = Interpreter(model_content=data, delegate=GpuDelegate(precision_loss_allowed=True, tuning="none",
                                                                 serialization_dir=tmp_path))
    a = run_model(lambda **kw: first, data, x)
    chosen = first.gpu_plan.precision

    def no_search(*args, **kw):
        raise AssertionError("a stored plan's precision was chosen again")

    monkeypatch.setattr(runtime_precision, "choose_precision", no_search)
    monkeypatch.setattr("tflgpu.runtime.executor.choose_precision", no_search)
    second = Interpreter(model_content=data, delegate=GpuDelegate(precision_loss_allowed=True, tuning="none",
                                                                  serialization_dir=tmp_path))
    assert second.gpu_plan.build_stats["plan"] == "cache"
    assert second.gpu_plan.precision == chosen
    np.testing.assert_array_equal(run_model(lambda **kw: second, data, x)[0], a[0])
    # another budget is another plan (its own choice), not the stored one
    monkeypatch.undo()
    third = Interpreter(model_content=data, delegate=GpuDelegate(precision_loss_allowed=True, tuning="none",
                                                                 serialization_dir=tmp_path, fp16_error_budget=0.5))
    assert third.gpu_plan.build_stats["plan"] == "built"
    # so is a choice made by other rules (an older tflgpu's runtime.precision): chosen again
    monkeypatch.setattr(runtime_precision, "policy", lambda: "older rules")
    fourth = Interpreter(model_content=data, delegate=GpuDelegate(precision_loss_allowed=True, tuning="none",
                                                                  serialization_dir=tmp_path))
    assert fourth.gpu_plan.build_stats["plan"] == "built"


def test_calibration_inputs(fp16_device, fragile):
    data, x, _ = fragile
    # the caller's own samples: inputs fifty times smaller keep every value well inside FP16's range
    it = _fp16(data, calibration_inputs=[[x[0] * 0.02]], fp16_error_budget=math.inf)
    assert not it.gpu_plan.precision.fp32
    # (checked against the input shapes the plan is built for, by allocate_tensors(): a resize may come first)
    with pytest.raises(ValueError, match=r"calibration_inputs.*shape \[1, 16, 16\]"):
        _fp16(data, calibration_inputs=[np.zeros((1, 16, 16), np.float32)]).allocate_tensors()
    with pytest.raises(ValueError, match="calibration_inputs.*2 arrays"):
        _fp16(data, calibration_inputs=[[x[0], x[0]]]).allocate_tensors()


@pytest.mark.parametrize("budget", [0, -1e-3, float("nan"), "small", True])
def test_bad_budget(budget):
    with pytest.raises(ValueError, match="fp16_error_budget must be a positive number"):
        GpuDelegate(fp16_error_budget=budget)


def test_insert_casts_one_copy_per_tensor_and_precision():
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 4))
    ys = []
    for i in range(3):
        y = b.tensor(f"y{i}", (1, 4, 4, 4))
        b.op("RELU", [x], [y])
        ys.append(y)
    z = b.tensor("z", (1, 4, 4, 4))
    b.op("ADD", [ys[0], ys[1]], [z], fused_activation_function="NONE")
    b.output(z, ys[2])
    sg = read_model(b.build()).subgraphs[0]
    # ops 0 (RELU) and 3 (ADD) in FP32: x is read by two FP16 RELUs, so it is stored as half
    assert stored_fp16(sg, {0, 3})[x] is True
    cg = insert_casts(sg, {0, 3}, constants=set())
    names = [op.name for op in cg.sg.operators]
    # x -> fp32 for op 0, y1 (an FP16 RELU's) -> fp32 for the ADD; y0 is FP32 already, y2 read by no FP32 op
    assert names.count(STORAGE_CAST) == 2
    casts = [op for op in cg.sg.operators if op.name == STORAGE_CAST]
    assert [op.index for op in casts] == [4, 5] and not any(op.options["to_fp16"] for op in casts)
    assert cg.fp32_ops == frozenset({0, 3, 4, 5})
    add = next(op for op in cg.sg.operators if op.name == "ADD")
    assert add.inputs[0] == ys[0] and cg.sg.tensors[add.inputs[1]].name == "y1/fp32"
    assert insert_casts(sg, set(), constants=set()).sg is sg


def test_an_integer_tensor_gets_no_storage_cast():
    """An index (ARG_MAX's output) lives on the host in its own type: an FP32 ARG_MAX read by an FP16 CAST needs
    no copy (there was one, a CPU step of its own); the CAST's float output, read by an FP32 op, does."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 4))
    i = b.tensor("i", (1, 4, 4), np.int32)
    axis = b.const("axis", np.array([3], np.int32))
    b.op("ARG_MAX", [x, axis], [i], output_type=2)
    f, g = b.tensor("f", (1, 4, 4)), b.tensor("g", (1, 4, 4))
    b.op("CAST", [i], [f])
    b.op("RELU", [f], [g])
    b.output(g)
    sg = read_model(b.build()).subgraphs[0]
    cg = insert_casts(sg, {0, 2}, constants={axis})
    assert [(op.name, sg.tensors[op.inputs[0]].name) for op in cg.sg.operators if op.name == STORAGE_CAST] \
        == [(STORAGE_CAST, "f")]


def test_inspect_precision_lists_what_stays_fp32(fp16_device, tmp_path, capsys):
    from tflgpu.cli import main

    path = tmp_path / "fragile.tflite"
    path.write_bytes(fragile_model())
    assert main(["inspect", str(path), "--precision"]) == 0
    out = capsys.readouterr().out
    assert "keep FP32 storage" in out and "amplifies FP16 rounding" in out and "65,504" in out


@pytest.mark.parametrize("other_reader,fp32_reader,graph_output,half", [
    ("RELU", False, False, True),  # only an FP16 op reads the sums: stored half, no cast
    ("RELU", True, False, False),  # an FP32 op reads them too: FP32 (and a cast for the FP16 ones)
    (None, False, True, False),  # the user reads them
])
def test_a_ranked_conv_stores_the_sums_its_fp16_readers_read_in_half(other_reader, fp32_reader, graph_output, half):
    """graph.conv_arg + traits.casts_own_output: a CONV_ARG kept FP32 for its index stores its sums half where
    only FP16 ops read them (they would read a half copy anyway); a plain FP32 CONV_2D keeps FP32 storage."""
    from tflgpu.graph.conv_arg import CONV_ARG, merge_channel_args

    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 3))
    y, i = b.tensor("y", (1, 4, 4, 8)), b.tensor("i", (1, 4, 4), np.int32)
    b.op("CONV_2D", [x, b.const("w", rng.standard_normal((8, 1, 1, 3)).astype(np.float32)),
                     b.const("b", np.zeros(8, np.float32))], [y], padding="SAME", stride_w=1, stride_h=1)
    axis = b.const("axis", np.array([3], np.int32))
    b.op("ARG_MAX", [y, axis], [i], output_type=2)
    outs = [i] + ([y] if graph_output else [])
    if other_reader:
        r = b.tensor("r", (1, 4, 4, 8))
        b.op(other_reader, [y], [r])
        outs.append(r)
    b.output(*outs)
    sg = read_model(b.build()).subgraphs[0]
    consts = {t.index: t.data for t in sg.tensors if t.data is not None}
    merged, n = merge_channel_args(sg, consts)
    assert n == 1 and merged.operators[0].name == CONV_ARG and len(merged.operators) == len(sg.operators) - 1
    assert merged.operators[0].outputs == (y if other_reader or graph_output else -1, i)
    fp32 = {0} | ({2} if fp32_reader else set())
    assert stored_fp16(merged, fp32)[y] == half
    assert stored_fp16(sg, {0})[y] is False  # (the unmerged CONV_2D: FP32 storage)


@pytest.mark.parametrize("tie", [pytest.param(True, id="two equal logits"), pytest.param(False, id="a clear winner")])
def test_an_argmax_within_the_roundings_reach_reads_exact_values(fp16_device, tie):
    """An ARG_MAX whose best and runner-up lie within the rounding FP16 puts on its input reads exact values whatever
    the budget, even where the calibration's simulation kept its answer (runtime.precision._near_tie: the device
    rounds in another order); one with a clear winner leaves what it reads in half."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((12, 40)).astype(np.float32)
    w[7] = w[3] + 3.0  # (on a positive input logit 7 is far ahead of the others, and logit 3 with it where tied)
    if tie:
        w[3] = w[7]
    b = ModelBuilder()
    x = b.input("x", (1, 40))
    logits = b.tensor("logits", (1, 12))
    b.op("FULLY_CONNECTED", [x, b.const("w", w), b.const("b", np.zeros(12, np.float32))], [logits])
    index = b.tensor("index", (1,), np.int32)
    b.op("ARG_MAX", [logits, b.const("axis", np.int32([1]))], [index], output_type=2)
    b.output(logits, index)
    data = b.build()
    feed = [np.abs(rng.standard_normal((1, 40))).astype(np.float32)]
    it = Interpreter(model_content=data, delegate=GpuDelegate(precision_loss_allowed=True, cache=False, tuning="none",
                                                              calibration_inputs=[feed]))
    got, want = run_model(lambda **kw: it, data, feed), run_model(litert(), data, feed)
    fp32 = it.gpu_plan.precision.fp32
    if tie:
        why = "FP16 rounding of near-equal values could change"
        assert sorted(fp32.values()) == [f"its answer {why}", f"read by ARG_MAX (node 1), whose answer {why}"]
        np.testing.assert_array_equal(got[1], want[1])
    else:
        assert fp32 == {} and got[1][0] == want[1][0] == 7


def test_a_probability_output_is_judged_on_its_own_scale(fp16_device):
    """A LOGISTIC output near 2e-9 (logits near -20, from a conv whose values lie near 30): FP16 storage rounds
    the logits by ~0.01 and the probability to 0, an error of ~1e-9 on a probability, which the choice judges
    against 1 (``output_scales``), not against the output's own largest value (by which it was the whole of it,
    and every op stayed FP32). The same conv read as its own output is judged by its largest value as before."""
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 4))
    logits, flag, raw = b.tensor("logits", (1, 8, 8, 2)), b.tensor("flag", (1, 128)), b.tensor("raw", (1, 8, 8, 2))
    w = (rng.standard_normal((2, 1, 1, 4)) * 0.5).astype(np.float32)
    b.op("CONV_2D", [x, b.const("w", w), b.const("b", np.full(2, -20.0, np.float32))], [logits], padding="SAME",
         stride_h=1, stride_w=1, fused_activation_function="NONE")
    squashed = b.tensor("squashed", (1, 8, 8, 2))
    b.op("LOGISTIC", [logits], [squashed])
    b.op("RESHAPE", [squashed, b.const("shape", np.array([1, 128], np.int32))], [flag])
    b.op("CONV_2D", [x, b.const("w2", w), b.const("b2", np.full(2, 30.0, np.float32))], [raw], padding="SAME",
         stride_h=1, stride_w=1, fused_activation_function="NONE")
    b.output(flag, raw)
    data = b.build()
    sg = read_model(data).subgraphs[0]
    assert runtime_precision.output_scales(sg) == {sg.outputs[0]: 1.0}
    xs = [rng.uniform(-1, 1, (1, 8, 8, 4)).astype(np.float32)]
    it = _fp16(data, calibration_inputs=[xs])
    assert it.gpu_plan.precision.fp32_ops == frozenset(), it.gpu_plan.precision.fp32
    got, want = run_model(lambda **kw: it, data, xs), run_model(litert(), data, xs)
    assert float(want[0].max()) < 1e-7  # (below FP16's smallest subnormal's half: stored in half, it is 0)
    assert float(np.abs(got[0] - want[0]).max()) < 1e-7
    assert rel_errors(got[1:], want[1:])[0] < 1e-3
