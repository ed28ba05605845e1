"""Which ops of an FP16 plan keep FP32 storage (graph.precision), decided on calibration inputs.

FP16 storage rounds every stored value to 11 significant bits. Most graphs lose ~1e-3 of their outputs' range
that way; some lose everything: a value past FP16's range (65,504) becomes inf, and an op that subtracts
near-equal values, or exponentiates large ones, turns the rounding of its inputs into an error as large as its
output. The choice is made on the CPU kernels, which simulate the FP16 plan exactly where it matters: each op
the plan stores in half gets its inputs and its outputs rounded to half, its math in float32, as the device
kernels do, and runs as a kernel made from the constants rounded to half (a kernel keeps the weights it reads:
rounding what it is passed would leave them exact).

1. By range: an op whose output holds a value past ``RANGE_LIMIT`` on the calibration inputs stores in FP32, and
   so do the ops that read it.
2. By error: while some graph output's error (max |FP16 - FP32| over max |FP32|, on every calibration input)
   exceeds the budget, the ops that amplify rounding most (their output's relative error over their inputs')
   store in FP32, with the producers of their inputs (what they amplify is those inputs' rounding); at most
   ``MAX_ROUNDS`` rounds.
3. While over the budget, an op whose answer is decided by comparing values (``ops.traits``'s ``ranks``:
   ARG_MAX, TOPK_V2, ...) and changed under the rounding (a near-tie swapped) reads exact values: it and
   everything its inputs are computed from store in FP32. So does an ARG_MAX / ARG_MIN whatever the budget
   where the rounding could swap its answer on the device though the simulation did not (``_near_tie``: its
   best and runner-up within twice the rounding the simulation put on its input).
4. Where no op stands out and the outputs are still over the budget (a deep graph that passes on the rounding
   of any early layer), whole parts of the graph: see ``_by_parts``. Where not even one part fits, every op
   stores in FP32.

A fused chain (an elementwise op in a conv's epilogue, graph.passes) keeps its intermediate values in float
registers; the simulation does the same, so that a quantization simulator rounds what the device rounds. A merged
op (a separable block, a classifier's head: graph.passes) rounds its first op's values as the unfused pair stores
them (kernels.epilogue.first_values), so the simulation of the pair holds for whichever form the tuner picks.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xxhash

from ..cpu.executor import SubgraphRunner
from ..graph.float_view import SIM
from ..graph.passes import register_tensors
from ..graph.precision import STORAGE_CAST, PrecisionChoice, insert_casts, stored_fp16
from ..model.ir import Subgraph
from ..ops.quantization import QParams, dequantize_values
from ..ops.traits import traits

log = logging.getLogger("tflgpu")

RANGE_LIMIT = 16384.0  # a quarter of FP16's largest (65,504): other inputs may well reach four times as far
MAX_ROUNDS = 8
PARTS = 8
AMPLIFIES = 16  # an op whose output's relative error is this many times its inputs' (a cancellation, an EXP)
HALF_STEP = 2.0**-11  # FP16's relative rounding error
# The device rounds to half what it computed in float32 in its own order (its sums' order, its FMAs, a quick
# build's code against an optimized one's), so some of its roundings fall the other way from the CPU's. Most
# outputs do not care; an ill-conditioned one does (MediaPipe's selfie segmentation on a random image: its mask,
# a LOGISTIC of logits near -3, after activations up to 30, came out 2.4e-3 from FP32 in the simulation and
# 1.0e-3 / 1.4e-2 on the Intel CPU device's quick / optimized builds of the same plan). So each choice is also
# simulated on the first sample with every FP16 op's float results moved by JITTER, up or down at random, before
# they are rounded: about 128 float32 roundings, which sends ~3% of the half roundings the other way. Its error
# counts as a sample's. The corpus's and MediaPipe's other models kept the choices they had (at 2**-14 too); the
# selfie segmentation kept 17 of 51 FP16 ops (its device error 1.2e-3), none at 2**-12. (Since then its mask, a
# probability, is judged against 1, ``output_scales``, and the whole model stores in half.) The precision phase of
# a first FP16 start takes twice as long (MobileNet v2 0.12 -> 0.21 s, the selfie segmentation 0.28 -> 0.56 s).
JITTER = 2.0**-16
JITTER_SEED = 7


@functools.cache
def policy() -> str:
    """A fingerprint of how choices are made (this module's source and graph.precision's): part of a stored FP16
    plan's key, so a plan chosen by older rules is chosen again (read once, when the first FP16 plan asks)."""
    from ..graph import precision as declared

    h = xxhash.xxh64()
    for path in (Path(__file__), Path(declared.__file__)):
        h.update(path.read_bytes())
    return h.hexdigest()


def _half(x):
    if isinstance(x, np.ndarray) and x.dtype == np.float32:
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    return x


def _run(runner: SubgraphRunner, inputs: Sequence[np.ndarray], half_ops: frozenset[int] = frozenset(),
         half_tensors: frozenset[int] = frozenset(), half: SubgraphRunner | None = None,
         registers: frozenset[int] = frozenset(), jitter: int | None = None) -> list:
    """Every tensor's value. ``half_ops``: ops simulated with FP16 storage (none: an FP32 run): each runs as
    ``half``'s kernel (made from the constants rounded to half, as the device uploads them) and reads its inputs
    rounded to half, except ``registers`` (a fused chain's intermediate value, which the kernel keeps in float);
    ``half_tensors``: tensors stored as half, rounded when made (an FP32 op reading one reads the rounded value,
    as through its storage cast). ``jitter``: a seed; each FP16 op's float results are moved by a float32
    rounding or two (``JITTER``, either way at random) before they are rounded to half."""
    sg = runner.sg
    rng = np.random.default_rng(jitter) if jitter is not None else None
    values: list = [None] * len(sg.tensors)
    for i, v in runner.consts.items():
        values[i] = v
    for i, v in runner.variables.items():
        values[i] = np.array(v, copy=True)  # (a stateful op must not move the caller's state)
    for i, v in zip(sg.inputs, inputs):
        values[i] = v
    for i in half_tensors & {*runner.variables, *sg.inputs}:
        values[i] = _half(values[i])
    half_kernels = {op.index: fn for op, fn in half.steps} if half is not None else {}
    with np.errstate(all="ignore"):
        for op, fn in runner.steps:
            view = values
            if op.index in half_ops:  # (its own copy of the inputs, rounded; its outputs come back below)
                fn = half_kernels[op.index]
                view = {i: half.consts[i] if i in half.consts else values[i] if i in registers else _half(values[i])
                        for i in op.inputs if i >= 0}
            runner.run_op(op, fn, view)
            if rng is not None and op.index in half_ops:
                for t in op.outputs:
                    v = view[t] if t >= 0 else None
                    if isinstance(v, np.ndarray) and v.dtype == np.float32:
                        view[t] = v * (1 + JITTER * rng.choice(np.array([-1, 1], np.float32), v.shape))
            for t in op.outputs:
                if t >= 0:
                    values[t] = _half(view[t]) if t in half_tensors else view[t]
    return values


def _rel_error(got, want, floor: float = 0.0, least_scale: float = 0.0) -> float:
    """max |got - want| over max |want| (a number or a bool tensor's too: an index that moved counts), or over
    ``least_scale`` where that is larger (an output bounded by 1: ``output_scales``); an error of ``floor`` or
    less counts as none (a quantized output's step)."""
    if not (isinstance(want, np.ndarray) and want.size and want.dtype.kind in "fiub"):
        return 0.0
    if want.dtype != np.float32:
        want, got = want.astype(np.float64), np.asarray(got, np.float64)
    got = np.asarray(got)
    if got.shape != want.shape:
        return math.inf
    with np.errstate(invalid="ignore", over="ignore"):
        scale, err = float(np.abs(want).max()), float(np.abs(got - want).max())
    if not math.isfinite(scale):
        return 0.0  # (the FP32 run itself is not finite: nothing to compare with)
    if not math.isfinite(err):
        return math.inf
    err = max(err - floor, 0.0)
    scale = max(scale, least_scale)
    return err / scale if scale > 0 else err


def default_calibration(sg: Subgraph, shapes: Sequence[tuple], quant_in: dict[int, QParams],
                        samples: int = 1) -> list[list[np.ndarray]]:
    """Random inputs in each input's range: a quantized input's whole integer range, a float one's [-1, 1],
    an integer one zeros (an index or a count: any other value may be out of the model's range)."""
    rng = np.random.default_rng(1234)
    out = []
    for _ in range(samples):
        sample = []
        for t, shape in zip(sg.inputs, shapes):
            p, dtype = quant_in.get(t), sg.tensors[t].dtype
            if p is not None:
                sample.append(dequantize_values(rng.integers(p.qmin, p.qmax + 1, shape), p))
            elif dtype == np.float32:
                sample.append(rng.uniform(-1, 1, shape).astype(np.float32))
            else:
                sample.append(np.zeros(shape, dtype))
        out.append(sample)
    return out


def check_calibration(samples, sg: Subgraph, shapes: Sequence[tuple], quant_in: dict[int, QParams]
                      ) -> list[list[np.ndarray]]:
    """The caller's ``GpuDelegate(calibration_inputs=...)`` as samples of this plan's inputs: a list of samples,
    each a list of arrays in input order (a single array where the model has one input); a quantized input's
    arrays are the model's integers. A ValueError names what does not fit."""
    if isinstance(samples, np.ndarray):  # (one sample of a one-input model)
        samples = [samples]
    out = []
    for k, sample in enumerate(samples):
        sample = [sample] if isinstance(sample, np.ndarray) else list(sample)
        if len(sample) != len(sg.inputs):
            raise ValueError(f"GpuDelegate(calibration_inputs=...): sample {k} has {len(sample)} arrays; the model "
                             f"has {len(sg.inputs)} inputs")
        fixed = []
        for x, t, shape in zip(sample, sg.inputs, shapes):
            x = np.asarray(x)
            if tuple(x.shape) != tuple(shape):
                raise ValueError(f"GpuDelegate(calibration_inputs=...): sample {k}, input "
                                 f"'{sg.tensors[t].name}' has shape {list(x.shape)}; the model takes {list(shape)}")
            p = quant_in.get(t)
            fixed.append(dequantize_values(x, p) if p is not None else x.astype(sg.tensors[t].dtype))
        out.append(fixed)
    if not out:
        raise ValueError("GpuDelegate(calibration_inputs=...) holds no sample")
    return out


def output_steps(sg: Subgraph, quant_out: dict[int, QParams]) -> dict[int, float]:
    """The step of each graph output that lies on a quantization grid: one quantized on the way out (a
    quantized model's integer output), or one a float view's quantization simulator makes."""
    steps = {t: float(np.max(p.scale)) for t, p in quant_out.items() if t in sg.outputs}
    for op in sg.operators:
        if op.name == SIM and "scale" in op.options:  # (one with no parameters is an exact copy)
            steps.update({t: float(op.options["scale"]) for t in op.outputs if t in sg.outputs})
    return steps


def output_scales(sg: Subgraph) -> dict[int, float]:
    """1.0 for each graph output made by an op whose values lie within [-1, 1] (``ops.traits``'
    ``unit_bounded``: a LOGISTIC's probability, a SOFTMAX's), through reshapes, storage casts and a float
    view's quantization simulators: its error is judged against that bound, not against its own largest value
    (MediaPipe's pose-landmark flag, a LOGISTIC near 3e-9 on a random image, which FP16 storage rounds to 0,
    had kept every op of the model in FP32)."""
    producer = {t: op for op in sg.operators for t in op.outputs if t >= 0}
    scales = {}
    for t in sg.outputs:
        op = producer.get(t)
        while op is not None and (traits(op.name).reshapes or op.name in (SIM, STORAGE_CAST)) and op.inputs:
            op = producer.get(op.inputs[0])
        if op is not None and traits(op.name).unit_bounded:
            scales[t] = 1.0
    return scales


def _stateful(runner: SubgraphRunner, op) -> bool:
    """A kernel updating a variable in place stores it in the plan's precision."""
    return bool(set(runner.variables) & {t for t in op.inputs + op.outputs if t >= 0})


def _candidates(runner: SubgraphRunner) -> list:
    """Ops whose storage the choice weighs: those with float outputs and no state, reading a float tensor (or
    only constants). The others (an index, a mask, a CAST of one to float) follow what they read: FP32 where any
    of their inputs is (``_Calibration.follow``)."""
    sg = runner.sg

    def reads_float(op) -> bool:
        ins = [t for t in op.inputs if t >= 0 and t not in runner.consts]
        return not ins or any(sg.tensors[t].dtype == np.float32 for t in ins)

    return [op for op, _ in runner.steps
            if any(t >= 0 and sg.tensors[t].dtype == np.float32 for t in op.outputs) and not _stateful(runner, op)
            and reads_float(op)]


def _answer(sg: Subgraph, op) -> list[int]:
    """A ranking op's answer: its index outputs (TOPK_V2's indices, not its values, which rounding always
    moves a little); all of its outputs where none is an index."""
    outs = [t for t in op.outputs if t >= 0]
    index = [t for t in outs if sg.tensors[t].dtype.kind != "f"]
    return index or outs


class _Calibration:
    """The FP32 run of the calibration samples, and FP16 simulations of choices against it."""

    def __init__(self, runner: SubgraphRunner, samples: list[list[np.ndarray]], floors: dict[int, float],
                 shaped: Subgraph | None = None):
        self.runner, self.samples, self.sg, self.floors = runner, samples, runner.sg, floors
        self.scales = output_scales(runner.sg)
        # a fused chain keeps its intermediate values in float registers: a quantization simulator fused into a
        # conv rounds the conv's float32 sum, not its half (one more rounding moves other values across a
        # step's edge than the device does)
        self.registers = register_tensors(shaped or runner.sg, runner.consts, [op for op, _ in runner.steps])
        try:
            self.refs = [_run(runner, x) for x in samples]
            self.refs.append(self.refs[0])  # (the reference of simulate's last run: the first sample, jittered)
        finally:
            runner.reset_variables()
        self.half = runner.with_constants({i: _half(v) for i, v in runner.consts.items()})
        self.candidates = _candidates(runner)
        self.movable = {op.index for op in self.candidates}
        self.producer = {t: op for op, _ in runner.steps for t in op.outputs if t >= 0}
        self.readers: dict[int, list] = {}
        for op, _ in runner.steps:
            for t in op.inputs:
                if t >= 0:
                    self.readers.setdefault(t, []).append(op)

    def follow(self, fp32: dict[int, str]) -> dict[int, str]:
        """``fp32`` with the ops that make no float value (an index, a mask) stored in FP32 where they read FP32."""
        fp32 = dict(fp32)
        for op, _ in self.runner.steps:
            if op.index in fp32 or op.index in self.movable or _stateful(self.runner, op):
                continue
            if any(t in self.producer and self.producer[t].index in fp32
                   for t in op.inputs if t >= 0 and t not in self.runner.consts):
                fp32[op.index] = "reads FP32 storage (it makes no float value of its own, or only from integers)"
        return fp32

    def simulate(self, fp32: dict[int, str]) -> list[list]:
        """Every tensor's value on each sample under this choice (``follow``ed)."""
        half_ops = frozenset(op.index for op, _ in self.runner.steps if op.index not in fp32)
        # (a chain fuses where its ops share a precision: a storage cast between them is stored)
        registers = frozenset(t for t in self.registers if self.producer[t].index in half_ops
                              and all(r.index in half_ops for r in self.readers.get(t, ())))
        half_tensors = frozenset(t for t, h in stored_fp16(self.sg, fp32).items()
                                 if h and t not in self.runner.consts and t not in registers)
        try:
            runs = [(x, None) for x in self.samples] + [(self.samples[0], JITTER_SEED)]
            return [_run(self.runner, x, half_ops, half_tensors, self.half, registers, j) for x, j in runs]
        finally:
            self.runner.reset_variables()

    def error(self, sims: list[list], tensors=None) -> float:
        """The largest relative error of ``tensors`` (default: the graph's outputs) over the samples."""
        tensors = self.sg.outputs if tensors is None else tensors
        return max((_rel_error(s[t], r[t], self.floors.get(t, 0.0), self.scales.get(t, 0.0))
                    for t in tensors for s, r in zip(sims, self.refs)),
                   default=0.0)

    def peak(self, t: int) -> float:
        return max((float(np.abs(r[t]).max(initial=0.0)) for r in self.refs
                    if isinstance(r[t], np.ndarray) and r[t].dtype == np.float32 and np.isfinite(r[t]).all()),
                   default=0.0)


def _answer_moved(cal: _Calibration, sims: list[list], op, errors: dict[int, float]) -> bool:
    """Whether a ranking op's answer changed under the simulated rounding: an index output that differs, or
    for a quantization simulator a value that moved to another grid point (its stored half differs from the
    grid point by far less than half a step)."""
    if op.name == SIM:
        if "scale" not in op.options:
            return False
        half_step = 0.5 * float(op.options["scale"])
        return any(float(np.abs(np.asarray(s[t], np.float64) - r[t]).max(initial=0.0)) > half_step
                   for t in op.outputs if t >= 0 for s, r in zip(sims, cal.refs))
    return any(errors[t] > 0 for t in _answer(cal.sg, op))


def _near_tie(cal: _Calibration, sims: list[list], op) -> bool:
    """Whether an ARG_MAX / ARG_MIN compares values the device's rounding could swap though the simulation kept
    its answer: on some sample, the reference's best and runner-up along its axis lie within twice the largest
    rounding the simulation put on its input (the device rounds as much, in another order: its sums' order, its
    fused chains). An exact tie counts: which one wins is then the rounding's."""
    if op.name not in ("ARG_MAX", "ARG_MIN") or len(op.inputs) < 2:
        return False
    x, axis = op.inputs[0], cal.runner.consts.get(op.inputs[1])
    if x < 0 or axis is None or cal.sg.tensors[x].dtype != np.float32:
        return False
    for s, r in zip(sims, cal.refs):
        ref, sim = r[x], s[x]
        if not (isinstance(ref, np.ndarray) and isinstance(sim, np.ndarray) and ref.ndim and ref.size
                and np.isfinite(ref).all() and np.isfinite(sim).all()):
            continue
        noise = float(np.abs(sim.astype(np.float64) - ref).max())
        values = np.sort(np.moveaxis(ref.astype(np.float64), int(np.asarray(axis).reshape(-1)[0]) % ref.ndim, -1))
        if noise == 0.0 or values.shape[-1] < 2:
            continue
        gap = values[..., -1] - values[..., -2] if op.name == "ARG_MAX" else values[..., 1] - values[..., 0]
        if bool((gap < 2.0 * noise).any()):
            return True
    return False


def choose_precision(runner: SubgraphRunner, samples: list[list[np.ndarray]], budget: float,
                     floors: dict[int, float] | None = None, shaped: Subgraph | None = None) -> PrecisionChoice:
    """The ops to keep in FP32 so that every output stays within ``budget`` (see the module's docstring).
    ``floors``: an output error that counts as none, by tensor (a quantized model's output step: its float
    view's simulators move an output by one step wherever a value lies on a rounding edge, at FP32 too).
    ``shaped``: ``runner.sg`` with every tensor's shape for these inputs (which elementwise ops fuse)."""
    cal = _Calibration(runner, samples, floors or {}, shaped)
    sg, movable, producer = cal.sg, cal.movable, cal.producer
    fp32: dict[int, str] = {}
    for op in cal.candidates:  # 1. by range: it, and what reads it (through a cast to half: inf), in FP32
        for t in op.outputs:
            peak = cal.peak(t) if t >= 0 else 0.0
            if peak > RANGE_LIMIT:
                fp32.setdefault(op.index, f"holds values up to {peak:.3g} (FP16's largest is 65,504)")
                for r in cal.readers.get(t, ()):
                    if r.index in movable:
                        fp32.setdefault(r.index, f"reads values up to {peak:.3g} (FP16's largest is 65,504)")

    def keep_exact(t: int, why: str) -> None:
        """The ops that make ``t`` (and what they read, up to the constants and graph inputs) store in FP32."""
        todo = [t]
        while todo:
            p = producer.get(todo.pop())
            if p is not None and p.index in movable and p.index not in fp32:
                fp32[p.index] = why
                todo.extend(i for i in p.inputs if i >= 0 and i not in runner.consts)

    error = math.inf
    for _ in range(MAX_ROUNDS + 1):
        fp32 = cal.follow(fp32)
        sims = cal.simulate(fp32)
        error = cal.error(sims)
        near = [op for op, _ in runner.steps if op.index not in fp32 and _near_tie(cal, sims, op)]
        if error <= budget and not near:
            return PrecisionChoice(fp32, error)
        errors = {t: cal.error(sims, [t]) for t in range(len(sg.tensors)) if t not in runner.consts}
        ranked = near or [op for op, _ in runner.steps if traits(op.name).ranks and op.index not in fp32
                          and _answer_moved(cal, sims, op, errors)]
        for op in ranked:  # 3. a near-tie the rounding swapped (or could: ``near``): what it compares is exact
            change = "could change" if near else "changes"
            why = f"read by {op.name} (node {op.index}), whose answer FP16 rounding of near-equal values {change}"
            fp32[op.index] = f"its answer FP16 rounding of near-equal values {change}"
            for t in op.inputs:
                if t >= 0 and t not in runner.consts:
                    keep_exact(t, why)
        if ranked:
            continue
        scores = []  # 2. the ops that amplify their inputs' rounding most, with those inputs' producers
        for op in cal.candidates:
            if op.index in fp32:
                continue
            out = max((errors[t] for t in op.outputs if t >= 0), default=0.0)
            inp = max((errors[t] for t in op.inputs if t >= 0 and t not in runner.consts), default=0.0)
            scores.append((out / max(inp, HALF_STEP), op))
        scores = [s for s in scores if s[0] > AMPLIFIES]
        if not scores:
            break
        scores.sort(key=lambda s: -s[0])
        for score, op in scores[:max(1, len(cal.candidates) // 20)]:
            why = f"{op.name} (node {op.index}) amplifies FP16 rounding x{score:.0f}"
            fp32.setdefault(op.index, why)
            for t in op.inputs:
                p = producer.get(t)
                if p is not None and t not in runner.consts and p.index not in fp32 and p.index in movable:
                    fp32[p.index] = f"feeds {why}"
    found = _by_parts(cal, fp32, budget)  # 4. no op stands out: whole parts of the graph
    if found is not None:
        return found
    why = f"FP16 storage anywhere keeps an output error over the budget of {budget:.2g} ({error:.2g} with the ops above)"
    log.info("GpuDelegate: %s; the plan stores every tensor in FP32", why)
    return PrecisionChoice({op.index: why for op, _ in runner.steps if not _stateful(runner, op)}, error)


def _by_parts(cal: _Calibration, fp32: dict[int, str], budget: float) -> PrecisionChoice | None:
    """Where no op stands out (a deep graph whose outputs move with the rounding of any early layer), the ops
    still in FP16, in graph order, are cut into ``PARTS`` parts; each part's error alone (FP16 there, FP32
    elsewhere) is measured, and the parts adding least are kept FP16 while their errors sum to the budget, then
    checked together (dropping the last one kept while over). None: not even one part fits."""
    free = [op for op in cal.candidates if op.index not in fp32]
    parts = [p for p in (free[k * len(free) // PARTS:(k + 1) * len(free) // PARTS] for k in range(PARTS)) if p]
    every = {**fp32, **{op.index: "" for op in free}}
    alone = [cal.error(cal.simulate(cal.follow({i: w for i, w in every.items() if i not in {op.index for op in part}})))
             for part in parts]
    kept, total = [], 0.0
    for k in sorted(range(len(parts)), key=alone.__getitem__):
        if total + alone[k] > budget:
            break
        kept.append(k)
        total += alone[k]
    while kept:
        half = {op.index for k in kept for op in parts[k]}
        choice = dict(fp32)
        for k, part in enumerate(parts):
            if k not in kept:
                for op in part:
                    choice[op.index] = (f"in a part of the graph (nodes {part[0].index}-{part[-1].index}) whose FP16 "
                                        f"rounding alone moves the outputs by {alone[k]:.2g}")
        choice = cal.follow(choice)
        error = cal.error(cal.simulate(choice))
        if error <= budget and half:
            return PrecisionChoice(choice, error)
        kept.pop()
    return None


def _copy(inputs: list) -> list:
    return [inputs[0]]


def with_casts(runner: SubgraphRunner, shaped: Subgraph, choice: PrecisionChoice
               ) -> tuple[SubgraphRunner, Subgraph, frozenset[int]]:
    """(a runner over the graph with storage casts, the propagated-shape graph with the same casts, every op
    stored in FP32 including casts) for ``choice``; the runner shares ``runner``'s kernels, constants and state."""
    constants = set(runner.consts) | set(runner.sparse_consts)
    declared = insert_casts(runner.sg, choice.fp32_ops, constants)
    if not declared.casts:
        return runner, shaped, declared.fp32_ops
    cast = insert_casts(shaped, choice.fp32_ops, constants)
    kernels = {op.index: fn for op, fn in runner.steps}
    steps = [(op, kernels[op.index] if op.name != STORAGE_CAST else _copy)
             for op in declared.sg.operators if op.index in kernels or op.name == STORAGE_CAST]
    return runner.derived(declared.sg, steps), cast.sg, declared.fp32_ops


__all__ = ["PrecisionChoice", "check_calibration", "choose_precision", "default_calibration", "output_steps",
           "with_casts"]
