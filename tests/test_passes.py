"""The graph passes as pure functions over steps (no OpenCL needed)."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu.cpu.executor import ModelRunner
from tflgpu.graph.passes import (
    CONCAT_VIEWS,
    PassStep,
    cull_dead,
    drop_identities,
    fold_reshapes,
    fuse_elementwise,
    merge_pad,
)
from tflgpu.model import read_model
from tflgpu.model.builder import ModelBuilder

from .oputil import while_model, widened_block


def _steps(b: ModelBuilder):
    runner = ModelRunner(read_model(b.build())).runner(0)
    return runner, [PassStep(op, [(op, fn)], [], True) for op, fn in runner.steps]


def _conv(b, x, name, rng):
    w, bias = b.const(f"{name}_w", rng.standard_normal((4, 1, 1, 4)).astype(np.float32)), b.const(
        f"{name}_b", np.zeros(4, np.float32))
    y = b.tensor(name, (1, 3, 3, 4))
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1)
    return y


def test_cull_dead_removes_unused_ops_only():
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 4))
    used = _conv(b, x, "used", rng)
    _conv(b, x, "dead", rng)  # nothing reads it
    out = b.tensor("out", (1, 3, 3, 4))
    b.op("RELU", [used], [out])
    b.output(out)
    runner, steps = _steps(b)
    kept, removed = cull_dead(steps, runner.sg)
    assert removed == 1 and [s.op.outputs[0] for s in kept] == [used, out]


def test_fuse_chain_into_conv():
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 4))
    skip = b.input("skip", (1, 3, 3, 4))
    y = _conv(b, x, "conv", rng)
    z, o = b.tensor("z", (1, 3, 3, 4)), b.tensor("o", (1, 3, 3, 4))
    b.op("ADD", [y, skip], [z])
    b.op("HARD_SWISH", [z], [o])
    b.output(o)
    runner, steps = _steps(b)
    fused, n = fuse_elementwise(steps, runner.sg, runner.consts)
    assert n == 2 and len(fused) == 1
    assert [f.op.name for f in fused[0].epilogue] == ["ADD", "HARD_SWISH"] and fused[0].outputs == (o,)
    assert fused[0].epilogue[0].other_tensor == skip
    assert [op.name for op, _ in fused[0].members] == ["CONV_2D", "ADD", "HARD_SWISH"]


def test_no_fusion_when_the_value_has_two_readers_or_is_an_output():
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 4))
    y = _conv(b, x, "conv", rng)
    r1, r2 = b.tensor("r1", (1, 3, 3, 4)), b.tensor("r2", (1, 3, 3, 4))
    b.op("RELU", [y], [r1])
    b.op("LOGISTIC", [y], [r2])
    b.output(r1, r2)
    runner, steps = _steps(b)
    assert fuse_elementwise(steps, runner.sg, runner.consts)[1] == 0
    b2 = ModelBuilder()
    x = b2.input("x", (1, 3, 3, 4))
    y = _conv(b2, x, "conv", rng)
    r = b2.tensor("r", (1, 3, 3, 4))
    b2.op("RELU", [y], [r])
    b2.output(y, r)  # the conv output itself is a graph output
    runner, steps = _steps(b2)
    assert fuse_elementwise(steps, runner.sg, runner.consts)[1] == 0


def test_the_step_making_the_other_operand_later_moves_before_the_producer():
    """ADD(y, later) with ``later`` made after y by a step that could run first: it moves before y's step, which
    takes the ADD; where it reads y itself it cannot, and the ADD joins ``later``'s kernel instead."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 4))
    y = _conv(b, x, "first", rng)
    later = _conv(b, x, "later", rng)  # produced after y, from x alone
    z = b.tensor("z", (1, 3, 3, 4))
    b.op("ADD", [y, later], [z])
    b.output(z)
    runner, steps = _steps(b)
    fused, n = fuse_elementwise(steps, runner.sg, runner.consts)
    assert n == 1 and [s.op.outputs[0] for s in fused] == [later, y] and fused[1].epilogue[0].other_tensor == later
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 4))
    y = _conv(b, x, "first", rng)
    r = b.tensor("r", (1, 3, 3, 4))
    b.op("RELU", [y], [r])
    later = _conv(b, r, "later", rng)  # reads y (through r): cannot run before y's step
    z = b.tensor("z", (1, 3, 3, 4))
    b.op("ADD", [r, later], [z])
    b.output(z)
    runner, steps = _steps(b)
    fused, n = fuse_elementwise(steps, runner.sg, runner.consts)
    assert [s.op.outputs[0] for s in fused] == [y, later] and fused[1].epilogue[0].other_tensor == r


def test_drop_identities_rewires_readers():
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 4))
    same = b.tensor("same", (1, 3, 3, 4))
    b.op("RESHAPE", [x, b.const("shape", np.array([1, 3, 3, 4], np.int32))], [same])
    cat = b.tensor("cat", (1, 3, 3, 4))
    b.op("CONCATENATION", [same], [cat], axis=3)
    y = _conv(b, cat, "conv", rng)
    b.output(y)
    runner, steps = _steps(b)
    out, n = drop_identities(steps, runner.sg, runner.consts)
    assert n == 2 and len(out) == 1 and out[0].op.inputs[0] == x


def test_merge_pad_into_conv_only():
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 5, 5, 4))
    padded = b.tensor("padded", (1, 7, 8, 4))
    b.op("PAD", [x, b.const("p", np.array([[0, 0], [1, 1], [2, 1], [0, 0]], np.int32))], [padded])
    w, bias = b.const("w", rng.standard_normal((4, 3, 3, 4)).astype(np.float32)), b.const("b", np.zeros(4, np.float32))
    y = b.tensor("y", (1, 5, 6, 4))
    b.op("CONV_2D", [padded, w, bias], [y], padding="VALID", stride_w=1, stride_h=1)
    pooled_in = b.tensor("pooled_in", (1, 7, 8, 4))
    b.op("PAD", [y, b.const("p2", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))], [pooled_in])
    z = b.tensor("z", (1, 3, 3, 4))
    b.op("AVERAGE_POOL_2D", [pooled_in], [z], padding="VALID", stride_w=2, stride_h=2, filter_width=3,
         filter_height=3)
    b.output(z)
    runner, steps = _steps(b)
    out, n = merge_pad(steps, runner.sg, runner.consts)
    assert n == 1  # into the conv, not into the average pool
    conv = next(s for s in out if s.op.name == "CONV_2D")
    assert conv.op.options["explicit_padding"] == (1, 1, 2, 1) and conv.op.inputs[0] == x
    assert [op.name for op, _ in conv.members] == ["PAD", "CONV_2D"]


def _pad_after_then_conv(rng, op: str, k: int, pads, batch: int = 2) -> bytes:
    """A zero PAD of only the bottom / right of the image, read by a ``k`` x ``k`` stride-1 conv (SAME for 1x1,
    VALID for 3x3): merged, the conv's leading padding stays 0 while its output is larger than its input."""
    b = ModelBuilder()
    x = b.input("x", (batch, 8, 12, 10))
    h, w = 8 + pads[0], 12 + pads[1]
    padded = b.tensor("padded", (batch, h, w, 10))
    b.op("PAD", [x, b.const("p", np.array([[0, 0], [0, pads[0]], [0, pads[1]], [0, 0]], np.int32))], [padded])
    oc = 4 if op == "CONV_2D" else 10
    wt = b.const("w", rng.uniform(-1, 1, (oc, k, k, 10) if op == "CONV_2D" else (1, k, k, 10)).astype(np.float32))
    y = b.tensor("y", (batch, h - k + 1, w - k + 1, oc))
    extra = {"depth_multiplier": 1} if op == "DEPTHWISE_CONV_2D" else {}
    b.op(op, [padded, wt, b.const("b", rng.uniform(-1, 1, oc).astype(np.float32))], [y],
         padding="SAME" if k == 1 else "VALID", stride_w=1, stride_h=1, **extra)
    b.output(y)
    return b.build()


@pytest.mark.parametrize(("op", "k"), [("CONV_2D", 1), ("CONV_2D", 3), ("DEPTHWISE_CONV_2D", 1)])
@pytest.mark.parametrize("pads", [(1, 0), (0, 2), (1, 1)])
@pytest.mark.parametrize("path", ["cpu", "fp32", "fp16", "gpu target"])
def test_a_pad_after_the_image_merged_into_a_conv_gives_litert_s_output(op, k, pads, path, opencl_device,
                                                                       monkeypatch):
    """A PAD of the bottom or right alone, merged into the 1x1 conv reading it, left its leading padding 0: the
    CPU kernel took the conv for a pixel-for-pixel GEMM and failed to reshape its output ("cannot reshape array of
    size 384 into shape (1,9,12,4)": the valid-model fuzzer, seed 11207065), and the OpenCL kernel, indexing the
    output as the input, wrote rows it did not own and left others unwritten (1e35s and NaNs, silently).
    Each path's output is LiteRT's, with the PAD merged (it is on every path here)."""
    from tflgpu import GpuDelegate, Interpreter

    from .conftest import assert_close, gpu_target, litert, run_model

    rng = np.random.default_rng(7)
    model = _pad_after_then_conv(rng, op, k, pads)
    x = rng.uniform(-1, 1, (2, 8, 12, 10)).astype(np.float32)
    if path == "gpu target":
        gpu_target(monkeypatch)
    kw = {} if path == "cpu" else {"delegate": GpuDelegate(cache=False, precision_loss_allowed=path == "fp16")}
    it = Interpreter(model_content=model, **kw)
    (got,) = run_model(lambda **_: it, model, [x])
    (want,) = run_model(litert(), model, [x])
    assert_close(got, want, rtol_scale=1e-2 if path == "fp16" else 1e-5, what=f"{op} {k}x{k}, PAD {pads}, {path}")
    if path == "cpu":  # (the PAD merged there too)
        assert [o.name for o, _ in ModelRunner(read_model(model)).runner(0).merged().steps] == [op]
    else:
        assert (it.gpu_plan.gpu_op_count, it.gpu_plan.cpu_op_count) == (2, 0)
        assert [[o.name for o, _ in s.members] for s in it.gpu_plan.steps] == [["PAD", op]]


def test_unroll_static_while():
    from tflgpu.graph.unroll import unroll_static_loops

    model, _ = while_model(np.random.default_rng(0))
    runtime = ModelRunner(read_model(model))
    runner = runtime.runner(0)
    sg, n = unroll_static_loops(runner.sg, runtime, runner.consts)
    assert n == 1 and "WHILE" not in [op.name for op in sg.operators]
    names = [op.name for op in sg.operators]
    # one copy of the float ops per iteration (table[i] became constants), then a copy into the output: a RESHAPE
    # to a SHAPE of the state (which a plan folds), not to the declared shape (another batch then failed)
    assert names == ["MUL", "ADD"] * 5 + ["SHAPE", "RESHAPE"]
    n0 = len(runner.sg.tensors)
    assert len(sg.tensors) > n0 and [t.name for t in sg.tensors[:n0]] == [t.name for t in runner.sg.tensors]  # kept
    assert int(sg.tensors[sg.outputs[1]].data) == 5  # the counter's final value is a constant


def test_while_that_cannot_be_counted_stays_a_loop():
    from tflgpu.graph.unroll import unroll_static_loops

    for kw in ({"static_counter": False}, {"float_cond": True}):
        model, _ = while_model(np.random.default_rng(0), **kw)
        runtime = ModelRunner(read_model(model))
        runner = runtime.runner(0)
        sg, n = unroll_static_loops(runner.sg, runtime, runner.consts)
        assert n == 0 and sg is runner.sg


def _reshaped_concat(rng, *, tap: bool = False, other_reader: bool = False, rows: tuple[int, int] = (18, 2)):
    """x -> conv (1, 3, 3, 4) -> RESHAPE (1, *rows); concatenated on axis 1 with y (1, 2, rows[1]) as is -> out;
    ``tap``: the reshape's output a graph output too; ``other_reader``: read by a RELU too. Rows of 2 channels
    change the slice layout's order; rows of 4 keep it (a reshape the plan links: no launch)."""
    n, c = rows
    b = ModelBuilder()
    x, y = b.input("x", (1, 3, 3, 4)), b.input("y", (1, 2, c))
    conv = _conv(b, x, "conv", rng)
    r = b.tensor("rows", (1, n, c))
    b.op("RESHAPE", [conv, b.const("shape", np.int32([1, n, c]))], [r], new_shape=[1, n, c])
    out = b.tensor("out", (1, n + 2, c))
    b.op("CONCATENATION", [r, y], [out], axis=1)
    outs = [out, *([r] if tap else [])]
    if other_reader:
        z = b.tensor("z", (1, n, c))
        b.op("RELU", [r], [z])
        outs.append(z)
    b.output(*outs)
    return b


def test_fold_reshapes_reads_the_reshapes_input_through_its_shape():
    rng = np.random.default_rng(0)
    runner, steps = _steps(_reshaped_concat(rng))
    conv, _, concat = steps
    folded, n = fold_reshapes(steps, runner.sg, runner.consts)
    assert n == 1 and len(folded) == 2
    merged = folded[1]
    assert merged.op.name == CONCAT_VIEWS and merged.op.inputs == (conv.op.outputs[0], concat.op.inputs[1])
    assert merged.op.options["views"] == ((1, 18, 2), None) and merged.op.outputs == concat.op.outputs
    assert [op.name for op, _ in merged.members] == ["RESHAPE", "CONCATENATION"]


def test_fold_reshapes_leaves_a_reshape_read_elsewhere_or_kept_in_place():
    """Not where the reshape's output is read elsewhere, is a graph output, or keeps the slice layout's order (the
    plan links such a reshape, and a channel concatenation of its outputs: no launch at all), or is vetoed."""
    rng = np.random.default_rng(0)
    for kw in ({"tap": True}, {"other_reader": True}, {"rows": (9, 4)}):
        runner, steps = _steps(_reshaped_concat(rng, **kw))
        assert fold_reshapes(steps, runner.sg, runner.consts) == (steps, 0)
    runner, steps = _steps(_reshaped_concat(rng))
    assert fold_reshapes(steps, runner.sg, runner.consts, lambda reshape, concat: False) == (steps, 0)


def test_fuse_elementwise_reads_a_channel_pad_through():
    """ADD(conv, PAD(skip) widening the channels) joins the conv reading the PAD's input, its new channels zero
    (Fused.other_channels), and the PAD's step goes, its op among the conv step's (the CPU's fallback runs it);
    a VALID MAX_POOL making the skip is read through too (Fused.other_pool: its window's maximum of x), whether
    it came before the conv in op order or after it."""
    rng = np.random.default_rng(0)
    for pool, pad_first in ((False, False), (False, True), (True, False), (True, True)):
        b, wide = widened_block(rng, pool=pool, pad_first=pad_first)
        runner, steps = _steps(b)
        x = runner.sg.inputs[0]
        fused, n = fuse_elementwise(steps, runner.sg, runner.consts)
        assert [s.op.name for s in fused] == ["CONV_2D"], (pool, pad_first)
        (conv,) = fused
        add = conv.epilogue[0]
        assert add.op.name == "ADD" and add.other_channels == 5 and add.other_tensor == x != wide
        assert (add.other_pool is not None) == pool
        if pool:
            assert (add.other_pool.filter, add.other_pool.stride, add.other_pool.size, add.other_pool.out) == \
                ((2, 2), (2, 2), (8, 8), (4, 4))
        assert [op.name for op, _ in conv.members] == \
            ["CONV_2D"] + (["MAX_POOL_2D"] if pool else []) + ["PAD", "ADD", "RELU"] and n == 3 + pool


def test_fuse_elementwise_keeps_other_pads():
    """A PAD read by a second op, a batch of 2, a PAD of leading channels: the PAD stays a step."""
    rng = np.random.default_rng(0)
    for kw in ({"pad_readers": 2}, {"batch": 2}, {"pad_rows": [[0, 0], [0, 0], [0, 0], [3, 4]]}):
        b, _ = widened_block(rng, pool=False, **kw)
        runner, steps = _steps(b)
        fused, _ = fuse_elementwise(steps, runner.sg, runner.consts)
        assert any(s.op.name == "PAD" for s in fused), kw
        assert all(f.other_channels is None for s in fused for f in s.epilogue), kw


def _mergeable(rng, n: int = 1) -> bytes:
    """PADs before convs and RELUs after ops of every kind the CPU runner merges and of those it keeps: a VALID
    stride-2 conv and a SAME depthwise conv after uneven zero PADs, a RELU6 after that depthwise conv and a RELU
    after an ADD (merged); a PAD read twice, a PADV2 of ones, a PAD of the channels, a PAD before an AVERAGE_POOL_2D,
    a RELU of a tensor read twice (kept)."""
    b = ModelBuilder()
    x = b.input("x", (n, 9, 8, 4))

    def pad(src, name, pads, shape, value=None):
        out = b.tensor(name, shape)
        ins = [src, b.const(f"{name}_p", np.array(pads, np.int32))]
        if value is not None:
            ins.append(b.const(f"{name}_v", np.array(value, np.float32)))
        b.op("PADV2" if value is not None else "PAD", ins, [out])
        return out

    def conv(src, name, shape, out_shape, depthwise=False, **opts):
        w = b.const(f"{name}_w", rng.standard_normal(shape).astype(np.float32))
        bias = b.const(f"{name}_b", rng.standard_normal(shape[3] if depthwise else shape[0]).astype(np.float32))
        y = b.tensor(name, out_shape)
        b.op("DEPTHWISE_CONV_2D" if depthwise else "CONV_2D", [src, w, bias], [y], stride_w=opts.pop("s", 1),
             stride_h=opts.pop("s2", 1), **opts)
        return y

    p1 = pad(x, "p1", [[0, 0], [2, 1], [0, 1], [0, 0]], (n, 12, 9, 4))
    c1 = conv(p1, "c1", (6, 3, 3, 4), (n, 5, 4, 6), padding="VALID", s=2, s2=2, fused_activation_function="RELU")
    p2 = pad(c1, "p2", [[0, 0], [1, 1], [1, 1], [0, 0]], (n, 7, 6, 6))
    c2 = conv(p2, "c2", (1, 5, 5, 6), (n, 7, 6, 6), depthwise=True, padding="SAME", depth_multiplier=1)
    r1 = b.tensor("r1", (n, 7, 6, 6))
    b.op("RELU6", [c2], [r1])
    p3 = pad(r1, "p3", [[0, 0], [1, 0], [0, 1], [0, 0]], (n, 8, 7, 6))  # read twice: kept
    c3 = conv(p3, "c3", (5, 3, 3, 6), (n, 6, 5, 5), padding="VALID")
    c4 = conv(p3, "c4", (5, 1, 1, 6), (n, 8, 7, 5), padding="VALID")
    p4 = pad(c3, "p4", [[0, 0], [1, 1], [1, 1], [0, 0]], (n, 8, 7, 5), value=1.0)  # not zeros: kept
    c5 = conv(p4, "c5", (3, 3, 3, 5), (n, 6, 5, 3), padding="VALID")
    a1 = b.tensor("a1", (n, 6, 5, 3))
    b.op("ADD", [c5, b.const("a1_c", rng.standard_normal(3).astype(np.float32))], [a1])
    r2 = b.tensor("r2", (n, 6, 5, 3))
    b.op("RELU", [a1], [r2])
    p5 = pad(c4, "p5", [[0, 0], [0, 0], [0, 0], [0, 3]], (n, 8, 7, 8))  # channels: kept
    c6 = conv(p5, "c6", (2, 1, 1, 8), (n, 8, 7, 2), padding="VALID")
    r3 = b.tensor("r3", (n, 8, 7, 2))
    b.op("RELU", [c6], [r3])  # (c6 read twice: kept)
    p6 = pad(c6, "p6", [[0, 0], [1, 1], [1, 1], [0, 0]], (n, 10, 9, 2))
    z = b.tensor("z", (n, 4, 4, 2))
    b.op("AVERAGE_POOL_2D", [p6], [z], padding="VALID", stride_w=2, stride_h=2, filter_width=3, filter_height=3)
    b.output(r2)
    b.output(z)
    b.output(r3)
    return b.build()


def test_the_cpu_runner_merges_zero_pads_and_clamps_into_the_ops_next_to_them(monkeypatch):
    """A CPU invoke runs the model with each zero PAD of the spatial axes that only a float conv reads merged into
    that conv, and each RELU / RELU6 the only reader of an op that clamps nothing yet merged into that op
    (``SubgraphRunner.merged``: ``graph.passes.padded_conv``, ``clamp_merged``): VALID with a stride, SAME,
    depthwise, uneven pads, a conv both padded and clamped, an ADD; a PAD read twice, of another value, of the
    channels or before a pool, and a RELU of a tensor read twice stay. Its outputs are LiteRT's, at batch 1 and 2."""
    from tflgpu import Interpreter
    from tflgpu.cpu.executor import SubgraphRunner

    from .conftest import assert_close, litert, run_model

    ran = []  # the ops of each runner an invoke ran
    run = SubgraphRunner.run
    monkeypatch.setattr(SubgraphRunner, "run", lambda self, xs: ran.append([op.name for op, _ in self.steps]) or
                        run(self, xs))
    rng = np.random.default_rng(3)
    for n in (1, 2):
        model = _mergeable(rng, n)
        runner = ModelRunner(read_model(model)).runner(0)
        merged = runner.merged()
        names = [op.name for op, _ in merged.steps]
        assert names.count("PAD") + names.count("PADV2") == 4 and names.count("RELU") == 1, names
        assert len(names) == len(runner.steps) - 4 and "RELU6" not in names, names
        made = [(op.name, op.options.get("explicit_padding"), op.options.get("fused_activation_function"))
                for op, _ in merged.steps if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D", "ADD")]
        assert made == [("CONV_2D", (2, 1, 0, 1), 1), ("DEPTHWISE_CONV_2D", (1, 1, 1, 1), 3), ("CONV_2D", None, 0),
                        ("CONV_2D", None, 0), ("CONV_2D", None, 0), ("ADD", None, 1), ("CONV_2D", None, 0)], made
        x = rng.uniform(-1, 1, (n, 9, 8, 4)).astype(np.float32)
        ran.clear()
        for got, want in zip(run_model(Interpreter, model, [x]), run_model(litert(), model, [x])):
            assert_close(got, want, what=f"batch {n}")
        assert ran[-1] == names


def test_preserve_all_tensors_runs_every_op_as_the_model_has_it():
    """With experimental_preserve_all_tensors=True the CPU invoke merges nothing, so the PADs and RELUs that
    ``merged`` runs inside their neighbours read back with LiteRT's values; without it, such a tensor raises a
    ValueError naming the option (it read as zeros)."""
    from tflgpu import Interpreter

    from .conftest import assert_close, litert, run_model

    rng = np.random.default_rng(5)
    model = _mergeable(rng, 1)
    x = rng.uniform(-1, 1, (1, 9, 8, 4)).astype(np.float32)
    ref = litert()(model_content=model, experimental_preserve_all_tensors=True)
    ops = ref._get_ops_details()
    written = sorted({int(t) for op in ops for t in op["outputs"]})
    run_model(lambda **kw: ref, model, [x])
    keep = Interpreter(model_content=model, experimental_preserve_all_tensors=True)
    run_model(lambda **kw: keep, model, [x])
    for t in written:
        assert_close(keep.get_tensor(t), ref.get_tensor(t), what=f"tensor {t}")
    plain = Interpreter(model_content=model)
    run_model(lambda **kw: plain, model, [x])
    runner = ModelRunner(read_model(model)).runner(0)
    kept = {t for op, _ in runner.merged().steps for t in op.outputs}
    merged_away = [t for op, _ in runner.steps for t in op.outputs if t not in kept]
    assert len(merged_away) == 4
    for t in merged_away:
        with pytest.raises(ValueError, match="its op ran merged into the op reading it.*preserve_all_tensors"):
            plain.get_tensor(t)
