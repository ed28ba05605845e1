"""A separable conv and the pointwise conv expanding its output as one op (graph.passes.fuse_expansions) and one
kernel (kernels.separable_expand): the pass's conditions, every variant against LiteRT at FP32 and FP16, the
defaults, and MobileNet v2 with every block fused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tflgpu import GpuDelegate, Interpreter
from tflgpu.cpu.executor import ModelRunner
from tflgpu.graph.passes import (
    EXPAND_DEPTHWISE,
    SEPARABLE_CONV,
    SEPARABLE_EXPAND,
    PassStep,
    fuse_elementwise,
    fuse_expansions,
    fuse_separable,
)
from tflgpu.model import read_model
from tflgpu.model.builder import ModelBuilder
from tflgpu.runtime.config import PlanConfig

from .conftest import MODELS_DIR, assert_close, litert, run_model

PRECISIONS = [pytest.param(False, id="fp32"), pytest.param(True, id="fp16")]


def _out(size: int, k: int, stride: int, dil: int, pad: str) -> int:
    return -(-size // stride) if pad == "SAME" else (size - (k - 1) * dil - 1) // stride + 1


def expand_model(rng, shape=(1, 9, 11, 12), cout=12, cexp=40, k=3, stride=1, dil=1, pad="SAME", residual=True,
                 expand_k=1, expand_act="RELU6", second=True, tap=False, between=()):
    """x -> DEPTHWISE_CONV_2D [-> each unary op of ``between``] -> CONV_2D 1x1 [-> ADD x] -> CONV_2D expand_k x
    expand_k (cexp) [-> DEPTHWISE_CONV_2D -> CONV_2D 1x1]: a MobileNet v2 block's end and the next block (``tap``: the
    first block's output a graph output too); (model bytes, feeds)."""
    n, h, w, c = shape
    oh, ow = _out(h, k, stride, dil, pad), _out(w, k, stride, dil, pad)
    b = ModelBuilder()
    x = b.input("x", shape)
    normal = lambda name, *s, scale=1.0: b.const(name, (rng.standard_normal(s) * scale).astype(np.float32))

    def dw(name, src, ch, hw, **opts):
        out = b.tensor(name, (n, *hw, ch))
        b.op("DEPTHWISE_CONV_2D", [src, normal(f"{name}_w", 1, k, k, ch), normal(f"{name}_b", ch)], [out],
             depth_multiplier=1, fused_activation_function="RELU6", **opts)
        return out

    def conv(name, src, cin, co, hw, kk=1, act="NONE"):
        out = b.tensor(name, (n, *hw, co))
        b.op("CONV_2D", [src, normal(f"{name}_w", co, kk, kk, cin, scale=1 / np.sqrt(cin * kk * kk)),
                         normal(f"{name}_b", co)], [out], padding="SAME", stride_w=1, stride_h=1,
             fused_activation_function=act)
        return out

    d = dw("dw", x, c, (oh, ow), padding=pad, stride_w=stride, stride_h=stride, dilation_w_factor=dil,
           dilation_h_factor=dil)
    for i, name in enumerate(between):
        t = b.tensor(f"between{i}", (n, oh, ow, c))
        b.op(name, [d], [t])
        d = t
    y = conv("pw", d, c, cout, (oh, ow))
    if residual:
        r = b.tensor("res", (n, oh, ow, cout))
        b.op("ADD", [y, x], [r])
        y = r
    e = conv("expand", y, cout, cexp, (oh, ow), expand_k, expand_act)
    out = conv("pw2", dw("dw2", e, cexp, (oh, ow), padding="SAME", stride_w=1, stride_h=1), cexp, 8, (oh, ow)) \
        if second else e
    b.output(out, *([y] if tap else []))
    return b.build(), [rng.uniform(-1, 1, shape).astype(np.float32)]


def _passes(model: bytes):
    runner = ModelRunner(read_model(model)).runner(0)
    steps = [PassStep(op, [(op, fn)], [], True) for op, fn in runner.steps]
    steps, _ = fuse_separable(steps, runner.sg, runner.consts)
    steps, _ = fuse_elementwise(steps, runner.sg, runner.consts)
    return runner, steps


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual-add"])
def test_pass_merges_a_block_and_the_next_expansion(rng, residual):
    """The separable step (with its fused residual ADD) takes the conv expanding its output, at its own place; its
    output is not stored where the expansion is its only reader."""
    runner, steps = _passes(expand_model(rng, residual=residual)[0])
    merged, n = fuse_expansions(steps, runner.sg, runner.consts)
    assert n == 1 and len(merged) == len(steps) - 1
    s = merged[0]
    assert s.op.name == SEPARABLE_EXPAND and [op.name for op, _ in s.members] == \
        ["DEPTHWISE_CONV_2D", "CONV_2D", *(["ADD"] if residual else []), "CONV_2D"]
    assert s.op.options["separable"] is steps[0].op and s.op.options["keep"] is False
    assert bool(s.epilogue) == residual and len(s.op.inputs) == 7
    assert s.op.outputs == s.op.options["expand"].outputs == steps[1].op.outputs
    assert merged[1].op.name == SEPARABLE_CONV  # (the next block's: nothing expands its output)


def test_pass_keeps_an_output_another_op_reads(rng):
    """A block output that is also a graph output (or another op's input) is stored by the fused step."""
    runner, steps = _passes(expand_model(rng, residual=True, tap=True)[0])
    merged, n = fuse_expansions(steps, runner.sg, runner.consts)
    assert n == 1 and merged[0].op.options["keep"] is True


@pytest.mark.parametrize("why", ["3x3 expansion", "vetoed", "fused op after it"])
def test_pass_leaves_what_it_cannot_fuse(rng, why):
    kw = {"3x3 expansion": {"expand_k": 3}, "vetoed": {}, "fused op after it": {"expand_act": "NONE"}}[why]
    model, _ = expand_model(rng, second=False, **kw)
    runner, steps = _passes(model)
    if why == "fused op after it":  # (a RELU after the expansion joins it as an epilogue: the expansion keeps it)
        steps[-1] = PassStep(steps[-1].op, steps[-1].members, [object()], True)
    allowed = (lambda a, b: False) if why == "vetoed" else (lambda a, b: True)
    merged, n = fuse_expansions(steps, runner.sg, runner.consts, allowed)
    assert n == 0 and [s.op.name for s in merged] == [s.op.name for s in steps]


def _plan(model: bytes, fp16: bool, params: dict | None):
    """The model's plan with fuse_expansions (an Interpreter's, with ``params=None``), or one whose fused block
    takes ``params`` (built once: over a CPU interpreter's runner)."""
    from tflgpu.runtime.device import choose_device
    from tflgpu.runtime.executor import GpuPlan

    if params is None:
        it = Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=fp16, cache=False,
                                                                   tuning_db=False, fuse_expansions=True))
        return it, it.gpu_plan
    it = Interpreter(model_content=model)
    runner = it.cpu_runner()
    # (the fused block: at the separable conv's place, its pointwise conv's, the model's first CONV_2D)
    index = next(op.index for op, _ in runner.steps if op.name == "CONV_2D")
    return it, GpuPlan(runner, choose_device(), PlanConfig(fp16=fp16, fuse_expansions=True), params={index: params})


POINTS = {  # knobs -> kernels launched for the two ops (the unfused separable conv: one kernel, or two)
    "8x8 tile": ({"fused": True, "group_tile": (8, 8), "k_chunk": 8, "ts2": 2, "split": 1}, 1),
    "32x8 tile, 4 slices a step": ({"fused": True, "group_tile": (32, 8), "k_chunk": 4, "ts2": 1, "split": 1}, 1),
    "4x16 tile, split 2": ({"fused": True, "group_tile": (4, 16), "k_chunk": 8, "ts2": 4, "split": 2}, 1),
    "4x8 tile, split 4": ({"fused": True, "group_tile": (4, 8), "k_chunk": 4, "ts2": 1, "split": 4}, 1),
    "unfused": ({"fused": False}, None),
}

FP16_POINTS = ("8x8 tile", "unfused")

BLOCKS = {  # expand_model arguments
    "stride 1, residual": {},
    "stride 1, residual, its output read too": {"tap": True},
    "stride 2 VALID, batch 2, padded lanes": {"shape": (2, 10, 9, 8), "cout": 37, "cexp": 50, "stride": 2,
                                              "pad": "VALID", "residual": False},
    "dilated 5x5, no activation": {"shape": (1, 12, 10, 16), "cout": 24, "cexp": 96, "k": 5, "dil": 2,
                                   "residual": False, "expand_act": "NONE"},
    # (unary ops of their own between the depthwise and the pointwise conv, as a quantized model's QUANT_SIM)
    "unary ops between": {"shape": (1, 7, 8, 12), "cout": 12, "cexp": 36, "between": ("TANH", "HARD_SWISH")},
}


@pytest.mark.parametrize(("block", "point", "fp16"), [
    pytest.param(b, p, fp16, id=f"{b}-{p}-{'fp16' if fp16 else 'fp32'}") for b in sorted(BLOCKS) for p in sorted(POINTS)
    for fp16 in ((False, True) if p in FP16_POINTS else (False,))])  # (FP16: the default tile and the unfused pair)
def test_fused_block_variants_match_litert(opencl_device, rng, fp16, point, block):
    """Every variant computes what LiteRT does (FP32 within 1e-4, FP16 within 1e-2 of the output's scale): the
    block's output where the residual ADD is fused and where it is not, strides, padding, dilation, batches, output
    slices with padded lanes, and expanded slices shared by several groups."""
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    params, kernels = POINTS[point]
    model, feeds = expand_model(rng, **BLOCKS[block])
    it, plan = _plan(model, fp16, params)
    (step,) = [s for s in plan.steps if s.device == "gpu" and s.op.name == SEPARABLE_EXPAND]
    assert plan.cpu_op_count == 0 and step.specs[0].params["fused"] is params["fused"]
    if kernels is not None:
        assert len(step.specs) == kernels
        assert {k: step.specs[0].params[k] for k in params} == params
    else:
        assert len(step.specs) >= 2
    got = plan.run(feeds)
    for t, want in zip(it.model.main.outputs, run_model(litert(), model, feeds)):
        assert_close(got[t], want, 1e-2 if fp16 else 1e-4)


def test_defaults():
    """Fused on a GPU (pixel tile by image size, groups sharing the expansion where an image has few tiles, 4
    depthwise slices a step where 8 would not fit local memory), never on a CPU device."""
    from tflgpu.kernels.knobs import InvalidKnobs
    from tflgpu.kernels.separable_expand import CHAIN_LOCAL_BYTES, ExpandKnobs, ExpandShape

    big = ExpandKnobs.default(ExpandShape(sin=36, sout=6, sexp=36, pixels=56 * 56, gpu=True))
    assert (big.fused, big.group_tile, big.k_chunk, big.split) == (True, (32, 8), 8, 1)
    small = ExpandKnobs.default(ExpandShape(sin=240, sout=40, sexp=240, pixels=49, gpu=True))
    assert (small.fused, small.group_tile, small.split) == (True, (4, 8), 4)
    assert small.local_bytes(ExpandShape(240, 40, 240, 49)) <= CHAIN_LOCAL_BYTES
    wide = ExpandShape(sin=240, sout=80, sexp=320, pixels=49, gpu=True)
    assert ExpandKnobs.default(wide).k_chunk == 4
    assert not ExpandKnobs.default(ExpandShape(sin=36, sout=6, sexp=36, pixels=3136)).fused  # (a CPU device)
    with pytest.raises(InvalidKnobs, match="local memory"):
        ExpandKnobs.resolve(wide, {"group_tile": (32, 8), "k_chunk": 8})
    with pytest.raises(InvalidKnobs, match="over 256"):
        ExpandKnobs.resolve(wide, {"group_tile": (32, 16)})
    with pytest.raises(InvalidKnobs, match="ts2"):
        ExpandKnobs.resolve(wide, {"ts2": 3})
    # the pair takes its ops' own defaults: other knobs beside fused=False are moot
    assert ExpandKnobs.resolve(wide, {"fused": False, "split": 2}) == \
        ExpandKnobs(False, *[getattr(ExpandKnobs.default(wide), k) for k in ("group_tile", "k_chunk", "ts2",
                                                                            "split")])


@pytest.mark.parametrize("fp16", PRECISIONS)
def test_mobilenet_v2_one_launch_per_block(opencl_device, monkeypatch, fp16):
    """MobileNet v2 under a GPU's defaults with fuse_expansions: every one of its 17 blocks' separable convs takes
    the next conv (20 launches instead of 43, its head one kernel in both), and the outputs are LiteRT's."""
    from tflgpu.kernels.base import Target

    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    path = MODELS_DIR / "mobilenet_v2_1.0_224.tflite"
    x = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
    want = run_model(litert(), path, [x])[0]
    plans = {}
    for fused in (False, True):
        it = Interpreter(str(path), delegate=GpuDelegate(cache=False, tuning_db=False, fuse_expansions=fused,
                                                         precision_loss_allowed=fp16, tiered_compile=False))
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        plans[fused] = it.gpu_plan
        assert it.gpu_plan.cpu_op_count == 0
        assert_close(it.get_tensor(it.get_output_details()[0]["index"]), want, 1e-2 if fp16 else 1e-4)
    assert plans[True].pass_counts["fuse_expansions"] == 17
    fused = [s for s in plans[True].steps if s.op.name == SEPARABLE_EXPAND]
    assert len(fused) == 17 and all(len(s.specs) == 1 for s in fused)
    # (a block whose depthwise conv and projection are two kernels: a split separable conv or, under a GPU's
    # defaults, the expansion and depthwise conv before the projection, graph.passes.fuse_expand_depthwise)
    split = sum(1 for s in plans[False].steps if s.op.name in (SEPARABLE_CONV, EXPAND_DEPTHWISE) and len(s.specs) == 2)
    assert plans[True].launch_count() == plans[False].launch_count() - 17 - split


def test_the_tuner_times_the_fused_block_both_ways(opencl_device, rng, monkeypatch, tmp_path):
    """A search of a fused block times its two ops' own kernels among its first trials, so the fusion is a
    per-block choice the tuner turns off where it measures slower; the tuned plan matches LiteRT."""
    from tflgpu.autotune.tuner import KernelTuner

    seen = []
    evaluate = KernelTuner.evaluate
    monkeypatch.setattr(KernelTuner, "evaluate", lambda self, params: seen.append(dict(params)) or
                        evaluate(self, params))
    model, feeds = expand_model(rng, shape=(1, 14, 14, 16), cout=16, cexp=48, second=False)
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="fast", tuning_db=tmp_path / "records.json",
                                                               tuning_budget_s=20, cache=False, fuse_expansions=True))
    (result,) = [r for r in it.gpu_plan.tuning_results if r.op == SEPARABLE_EXPAND]
    assert result.source == "tuned" and {p["fused"] for p in seen if "split" in p} == {True, False}
    assert_close(it.gpu_plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0])


def test_the_option_is_part_of_a_stored_plans_identity(opencl_device, rng, monkeypatch, tmp_path):
    """A plan stored with one fuse_expansions (False: no blocks; True: blocks starting fused; None, the default:
    on a GPU, blocks starting unfused) is not the one a delegate asking for another gets; the CLI's
    --fuse-expansions asks for True, its default is the delegate's; a value of another type is refused."""
    from tflgpu.cli import _delegate, build_parser
    from tflgpu.kernels.base import Target

    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    model, feeds = expand_model(rng)
    for fused, plan in ((False, "built"), (True, "built"), (None, "built"), (False, "cache"), (True, "cache"),
                        (None, "cache")):
        it = Interpreter(model_content=model, delegate=GpuDelegate(serialization_dir=tmp_path, tuning="none",
                                                                   fuse_expansions=fused))
        blocks = [s for s in it.gpu_plan.steps if s.op.name == SEPARABLE_EXPAND]
        assert len(blocks) == (0 if fused is False else 1), fused
        assert all(b.specs[0].params["fused"] is bool(fused) for b in blocks)
        assert it.gpu_plan.build_stats["plan"] == plan
        assert_close(it.gpu_plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0])
    args = build_parser().parse_args(["bench", "m.tflite", "--fuse-expansions"])
    assert _delegate(args).fuse_expansions is True
    assert _delegate(build_parser().parse_args(["bench", "m.tflite"])).fuse_expansions is None
    assert PlanConfig(fuse_expansions=True).summary().endswith("fused expansions")
    assert PlanConfig(fuse_expansions=False).summary().endswith("no expansion blocks")
    assert PlanConfig().summary() == "fp32"
    with pytest.raises(ValueError, match="fuse_expansions must be None"):
        GpuDelegate(fuse_expansions="yes")


def test_a_gpus_default_starts_each_block_unfused(opencl_device, rng, monkeypatch):
    """Under a GPU's defaults (fuse_expansions=None) every block is a step whose kernels are, at the start, exactly
    what the plan without the pass launches (the same code, grids and work-groups, FP32 and FP16), a tunable
    kernel whose search times it fused first; a CPU device's defaults have no such step."""
    import re

    import pyopencl as cl

    from tflgpu.autotune.measure import KernelBench
    from tflgpu.autotune.tuner import KernelTuner, TuneTask
    from tflgpu.kernels.base import Target
    from tflgpu.runtime.tuning import _identities

    model, _ = expand_model(rng)
    delegate = lambda fused, fp16=False: GpuDelegate(cache=False, tuning_db=False, tuning="none",
                                                      fuse_expansions=fused, precision_loss_allowed=fp16)
    plan = lambda fused, fp16=False: Interpreter(model_content=model, delegate=delegate(fused, fp16)).gpu_plan
    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=16, gpu=False)))
    assert SEPARABLE_EXPAND not in [s.op.name for s in plan(None).steps]  # (a CPU device's target)
    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    code = lambda p: [(re.sub(r"\bk[0-9a-f]{16}\w*", "K", sp.source), sp.global_size, sp.local_size)
                      for s in p.steps if s.device == "gpu" for sp in s.specs]
    for fp16 in (False, True):
        default, without = plan(None, fp16), plan(False, fp16)
        assert default.pass_counts["fuse_expansions"] == 1 and code(default) == code(without)
    blocks = [s for s in default.steps if s.op.name == SEPARABLE_EXPAND]
    found = _identities(default.steps, default.make, set(), None)
    ident = next(i for i in found.values() if i.steps[0] is blocks[0])
    space = ident.specs[0].space
    task = TuneTask("k", SEPARABLE_EXPAND, lambda p: default.make(ident.op, ident.epilogue, p), space,
                    {k: ident.specs[0].params[k] for k in space}, {})
    bench = KernelBench(cl, cl.Context([opencl_device.cl_device]), opencl_device, False, {})
    assert KernelTuner(task, bench, "dev", mode="fast", trials=4).neighbors()[0]["fused"] is True


@settings(max_examples=12)
@given(n=st.integers(1, 2), h=st.integers(3, 12), w=st.integers(3, 12), c=st.integers(1, 20), cout=st.integers(1, 40),
       cexp=st.integers(1, 80), k=st.sampled_from([3, 5]), stride=st.integers(1, 2),
       pad=st.sampled_from(["SAME", "VALID"]), residual=st.booleans(), tap=st.booleans(),
       expand_act=st.sampled_from(["NONE", "RELU6", "RELU"]), seed=st.integers(0, 2**16))
def test_random_blocks_match_litert(opencl_device, n, h, w, c, cout, cexp, k, stride, pad, residual, tap, expand_act,
                                    seed):
    """Blocks of any shape (odd channel counts, images smaller than a tile, batches, a residual ADD where the shapes
    allow one, the block's output read by the caller too) under a GPU's defaults, fused: LiteRT's values."""
    from tflgpu.kernels.base import Target

    if pad == "VALID" and min(h, w) < k:
        return
    residual = residual and stride == 1 and pad == "SAME" and cout == c
    model, feeds = expand_model(np.random.default_rng(seed), shape=(n, h, w, c), cout=cout, cexp=cexp, k=k,
                                stride=stride, pad=pad, residual=residual, expand_act=expand_act, tap=tap)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
        it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False, fuse_expansions=True,
                                                                   tiered_compile=False))
        it.allocate_tensors()
    (step,) = [s for s in it.gpu_plan.steps if s.op.name == SEPARABLE_EXPAND]
    assert it.gpu_plan.cpu_op_count == 0 and step.specs[0].params["fused"] is True
    got = it.gpu_plan.run(feeds)
    for t, want in zip(it.model.main.outputs, run_model(litert(), model, feeds)):
        assert_close(got[t], want, 1e-4)


def test_a_nested_parts_records_are_its_own(opencl_device, rng, monkeypatch):
    """An unfused block's separable conv is itself a composite op (its depthwise and pointwise convs) and shares
    its op index with its pointwise conv: each of the two gets its own record (the separable conv's knobs, the
    pointwise conv's), never the other's; before, the second looked up was handed the first's, a CONV_2D given
    the separable conv's knobs (``fused``, ``per``, ``whole``), and the block fell back to the CPU kernels."""
    from tflgpu.autotune import MemoryTuningDB, TuningRecord, kernel_key
    from tflgpu.kernels.base import Target
    from tflgpu.kernels.program import shared_base

    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    model, feeds = expand_model(rng, shape=(1, 14, 14, 16), cout=16, cexp=48, second=False)
    plain = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False,
                                                                  fuse_expansions=False)).gpu_plan
    (sep,) = [s for s in plain.steps if s.op.name == SEPARABLE_CONV]
    db = MemoryTuningDB()
    # (the separable conv split in two: its convs' kernels, the pointwise conv's own knobs then asked for)
    db.put(opencl_device.identity.key(), kernel_key(sep.op.name, sep.specs, False, shared_base(sep.specs)),
           TuningRecord({**sep.params, "fused": False}, 10.0, 9.0, 3, SEPARABLE_CONV))
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=db, tuning="none"))
    (block,) = [s for s in it.gpu_plan.steps if s.op.name == SEPARABLE_EXPAND]
    assert all(s.device == "gpu" for s in it.gpu_plan.steps) and len(block.specs) == 3
    assert_close(run_model(lambda **_: it, model, feeds)[0], run_model(litert(), model, feeds)[0], 1e-4)
