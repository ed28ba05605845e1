"""Moves in a row as one kernel (graph.passes.fold_moves, kernels.reindex.moves): each output value read through the
moves' index maps, against LiteRT, FP32 and FP16."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.graph.passes import MOVES
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, litert, run_model

I32 = np.int32


@pytest.fixture(params=[False, True], ids=["fp32", "fp16"])
def precision(request, opencl_device):
    if request.param and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    return request.param


def _scaled(b: ModelBuilder, x, shape, k: float, name: str):
    """x times k: a device op before or after the moves (so the moves' input is no graph input)."""
    y = b.tensor(name, shape)
    b.op("MUL", [x, b.const(f"{name}_k", np.array(k, np.float32))], [y], fused_activation_function="NONE")
    return y


def _softmax(b: ModelBuilder, x, shape, name: str):
    """A SOFTMAX of x: a device op before the moves that graph.sink does not move past them (an elementwise one
    it would, and the moves would read the graph input)."""
    y = b.tensor(name, shape)
    b.op("SOFTMAX", [x], [y], beta=1.0)
    return y


def _framing(samples: int, hop: int, frame: int, start: int = 0) -> tuple[bytes, tuple]:
    """tf.signal.frame as TensorFlow converts it (BirdNET 2.4's STFT): a STRIDED_SLICE of the signal (full, linked in
    place; from ``start``, a kernel of its own), a RESHAPE to sample pairs, a GATHER of each frame's pairs (hop *
    frame + pair, an affine index table) and a RESHAPE of the frames back to samples; then the window's MUL."""
    b = ModelBuilder()
    x = b.input("x", (1, samples + start))
    s = _scaled(b, x, (1, samples + start), 2.0, "scaled")
    sl = b.tensor("sliced", (1, samples))
    b.op("STRIDED_SLICE", [s, b.const("begin", np.array([0, start], I32)),
                           b.const("end", np.array([1, samples + start], I32)),
                           b.const("strides", np.array([1, 1], I32))], [sl])
    pairs = b.tensor("pairs", (1, samples // 2, 2))
    b.op("RESHAPE", [sl, b.const("to_pairs", np.array([1, samples // 2, 2], I32))], [pairs])
    frames = (samples - frame) // hop + 1
    idx = (np.arange(frames)[:, None] * (hop // 2) + np.arange(frame // 2)[None, :]).astype(I32)
    g = b.tensor("gathered", (1, frames, frame // 2, 2))
    b.op("GATHER", [pairs, b.const("idx", idx)], [g], axis=1, batch_dims=0)
    flat = b.tensor("frames", (1, frames, frame))
    b.op("RESHAPE", [g, b.const("to_frames", np.array([1, frames, frame], I32))], [flat])
    window = np.hanning(frame).astype(np.float32)
    out = b.tensor("windowed", (1, frames, frame))
    b.op("MUL", [flat, b.const("window", window)], [out], fused_activation_function="NONE")
    b.output(out)
    return b.build(), (1, samples + start)


def _shuffle(h: int, w: int, groups: int, per: int) -> tuple[bytes, tuple]:
    """A channel shuffle (ShuffleNet): RESHAPE to [1, pixels, groups, per], TRANSPOSE the last two, RESHAPE back."""
    c = groups * per
    b = ModelBuilder()
    x = b.input("x", (1, h, w, c))
    s = _softmax(b, x, (1, h, w, c), "normalized")
    g = b.tensor("grouped", (1, h * w, groups, per))
    b.op("RESHAPE", [s, b.const("to_groups", np.array([1, h * w, groups, per], I32))], [g])
    t = b.tensor("swapped", (1, h * w, per, groups))
    b.op("TRANSPOSE", [g, b.const("perm", np.array([0, 1, 3, 2], I32))], [t])
    y = b.tensor("shuffled", (1, h, w, c))
    b.op("RESHAPE", [t, b.const("back", np.array([1, h, w, c], I32))], [y])
    b.output(y)
    return b.build(), (1, h, w, c)


def _picked(rows: int, cols: int) -> tuple[bytes, tuple]:
    """A GATHER by a constant table that is no affine function (a permutation of rows), a SLICE of its columns and a
    TRANSPOSE."""
    b = ModelBuilder()
    x = b.input("x", (rows, cols))
    s = _softmax(b, x, (rows, cols), "normalized")
    order = np.random.default_rng(5).permutation(rows).astype(I32)
    g = b.tensor("picked", (rows, cols))
    b.op("GATHER", [s, b.const("order", order)], [g], axis=0, batch_dims=0)
    sl = b.tensor("columns", (rows, cols - 3))
    b.op("SLICE", [g, b.const("begin", np.array([0, 1], I32)), b.const("size", np.array([rows, cols - 3], I32))], [sl])
    t = b.tensor("transposed", (cols - 3, rows))
    b.op("TRANSPOSE", [sl, b.const("perm", np.array([1, 0], I32))], [t])
    b.output(t)
    return b.build(), (rows, cols)


@pytest.mark.parametrize(("model", "merged", "slices"), [
    (lambda: _framing(1200, 160, 256), 3, True),  # three moves (the full slice stays linked); the window's MUL after
    (lambda: _framing(614, 6, 8), 3, True),  # a hop of 6: frames start off the input's slices
    (lambda: _framing(600, 10, 12, start=5), 4, True),  # the slice too, from sample 5
    (lambda: _framing(610, 6, 10), 3, False),  # frames of 10 samples: part-filled slices
    (lambda: _shuffle(5, 3, 3, 4), 3, False),
    (lambda: _shuffle(2, 7, 2, 5), 3, False),
    (lambda: _picked(9, 11), 3, False),  # a table of indices in the kernel's source
], ids=["stft-framing", "odd-hop", "sliced-framing", "short-frames", "shuffle", "shuffle-ragged", "permuted-rows"])
def test_moves_in_a_row_are_one_kernel(opencl_device, precision, model, merged, slices):
    """Each chain of moves is one step of one kernel (the ops before and after it keep theirs), and the plan computes
    LiteRT's values exactly as far as storage allows (a move only copies). Where each output slice is four
    consecutive input values (``reindex.contiguous_slices``: a framing of whole slices, at any hop and start), one
    float4 load at an offset affine in the output's coordinates; otherwise a load a lane."""
    data, shape = model()
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    it = Interpreter(model_content=data, delegate=GpuDelegate(precision_loss_allowed=precision))
    got = run_model(lambda **kw: it, data, [x])
    plan = it.gpu_plan
    assert plan.cpu_op_count == 0 and plan.pass_counts["fold_moves"] == merged
    (step,) = [s for s in plan.steps if s.op.name == MOVES]
    assert len(step.specs) == 1 and len(step.op.options["chain"]) == merged
    assert ("LD4(in0 + " in step.specs[0].source) == slices
    assert plan.launch_count() == 2  # (the op before; the moves, with the window's MUL fused after them)
    assert_close(got[0], run_model(litert(), data, [x])[0], 1e-3 if precision else 1e-6)


def _transposed_back(perm_after: tuple[int, ...], axis: int) -> tuple[bytes, tuple]:
    """As ONNX converters write a layout change: a TRANSPOSE of the last two axes, an EXPAND_DIMS (``axis``) and a
    TRANSPOSE (``perm_after``), then a MUL; the SOFTMAX before them keeps the graph input away from the moves."""
    b = ModelBuilder()
    x = b.input("x", (1, 5, 12))
    s = _softmax(b, x, (1, 5, 12), "normalized")
    t = b.tensor("swapped", (1, 12, 5))
    b.op("TRANSPOSE", [s, b.const("perm", np.array([0, 2, 1], I32))], [t])
    e_shape = (1, 12, 5)[:axis] + (1,) + (1, 12, 5)[axis:]
    e = b.tensor("expanded", e_shape)
    b.op("EXPAND_DIMS", [t, b.const("axis", np.array(axis, I32))], [e])
    out_shape = tuple(e_shape[p] for p in perm_after)
    back = b.tensor("back", out_shape)
    b.op("TRANSPOSE", [e, b.const("perm_after", np.array(perm_after, I32))], [back])
    y = _scaled(b, back, out_shape, 2.0, "y")
    b.output(y)
    return b.build(), (1, 5, 12)


@pytest.mark.parametrize(("perm_after", "axis", "kept"), [((0, 1, 3, 2), 1, True), ((0, 2, 1, 3), 1, False)],
                         ids=["undone", "moved"])
def test_moves_around_an_in_place_move_are_one_step(opencl_device, precision, perm_after, axis, kept):
    """Two transposes around an EXPAND_DIMS (which alone the plan links in place) are one step: where together they
    leave every value in its place ("undone": (1, 5, 12) -> (1, 1, 5, 12)), the plan links that step too and it
    launches nothing; otherwise one kernel reads through all three. melspectrogram of openWakeWord has two such
    chains: its 15 launches became 11 (0.21 -> 0.14 ms a 1,280-sample frame, Intel's CPU runtime)."""
    data, shape = _transposed_back(perm_after, axis)
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float32)
    it = Interpreter(model_content=data, delegate=GpuDelegate(precision_loss_allowed=precision))
    got = run_model(lambda **kw: it, data, [x])
    plan = it.gpu_plan
    assert plan.cpu_op_count == 0 and plan.pass_counts["fold_moves"] == 3
    (step,) = [s for s in plan.steps if s.op.name == MOVES]
    assert [op.name for op in step.op.options["chain"]] == ["TRANSPOSE", "EXPAND_DIMS", "TRANSPOSE"]
    assert (step.link is not None, len(step.specs)) == ((True, 0) if kept else (False, 1))
    # (the SOFTMAX, and the MUL: its own kernel after the linked step, else fused after the moves in theirs)
    assert plan.launch_count() == 2 and bool(step.epilogue) is not kept
    assert_close(got[0], run_model(litert(), data, [x])[0], 1e-3 if precision else 1e-6)


def test_a_move_read_twice_or_linked_keeps_its_own_step(opencl_device):
    """A move whose output another op reads too stays a step of its own, and moves the plan links in place (a
    reshape between shapes the slice layout orders alike) are not made a kernel: no launch is added."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 6, 8))
    s = _scaled(b, x, (1, 4, 6, 8), 2.0, "scaled")
    t = b.tensor("transposed", (1, 6, 4, 8))
    b.op("TRANSPOSE", [s, b.const("perm", np.array([0, 2, 1, 3], I32))], [t])
    r = b.tensor("rows", (1, 6, 32))  # (read by the RESHAPE below and by the graph's output MUL)
    b.op("RESHAPE", [t, b.const("to_rows", np.array([1, 6, 32], I32))], [r])
    image = b.tensor("image", (1, 6, 1, 32))  # (in place: the same slices in the same order)
    b.op("RESHAPE", [r, b.const("to_image", np.array([1, 6, 1, 32], I32))], [image])
    back = b.tensor("back", (1, 6, 32))
    b.op("RESHAPE", [image, b.const("to_back", np.array([1, 6, 32], I32))], [back])
    y = _scaled(b, r, (1, 6, 32), 3.0, "y")
    z = _scaled(b, back, (1, 6, 32), 5.0, "z")
    b.output(y, z)
    data = b.build()
    xv = np.random.default_rng(7).standard_normal((1, 4, 6, 8)).astype(np.float32)
    it = Interpreter(model_content=data, delegate=GpuDelegate())
    got = run_model(lambda **kw: it, data, [xv])
    plan = it.gpu_plan
    # the TRANSPOSE and the first RESHAPE join; the two in-place reshapes after it stay linked (no launch)
    assert plan.pass_counts["fold_moves"] == 2 and plan.pass_counts["link_reshape"] == 2
    assert [s.op.name for s in plan.steps if s.op.name == MOVES or s.op.name == "RESHAPE"] == \
        [MOVES, "RESHAPE", "RESHAPE"]
    for g, w in zip(got, run_model(litert(), data, [xv])):
        assert_close(g, w, 1e-6)


def test_the_index_maps_are_the_ops_traits_name():
    """The moves the pass merges (ops.traits' maps_indices) are the moves kernels.reindex has an index map of, so a
    merged step never names an op its kernel cannot read through (which would send its moves to the CPU)."""
    from tflgpu.kernels.reindex import INDEX_MAPS
    from tflgpu.ops.traits import ops_with

    assert set(INDEX_MAPS) == ops_with(maps_indices=True)


def test_the_composed_map_is_evaluated_as_the_kernel_computes_it():
    """``reindex._int_value`` computes the index expressions as C does or refuses: a table's lookup, and a division
    or remainder of a negative value (C truncates toward zero where Python floors), leave the lane-by-lane form."""
    from tflgpu.kernels.reindex import _int_value, _NotAffine

    o = np.arange(40, dtype=np.int32)
    assert np.array_equal(_int_value("(((o0 * 7 + 3) / 2) % 5) * -1 + 4", {"o0": o}), (((o * 7 + 3) // 2) % 5) * -1 + 4)
    for bad in ("gidx_k[o0]", "(o0 - 5) / 2", "(o0 - 5) % 3", "o0 / 0", "min(o0, 3)", "o0 ? 1 : 2", "o1 + 1"):
        with pytest.raises(_NotAffine):
            _int_value(bad, {"o0": o})
