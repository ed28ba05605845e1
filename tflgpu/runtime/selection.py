"""Which ops of a subgraph run on the OpenCL device, as a list of steps: placement, the graph passes, and the
partition limit. Pure Python over the IR and the generators; nothing is compiled or allocated here.

The graph transforms, in the one order they run:

0. ``inline_composite`` (graph.composite): a STABLEHLO_COMPOSITE's decomposition inlined in place of the call.
0a. ``lstm_loop`` (graph.lstm_loop): a WHILE whose body is one LSTM cell (a Keras 3 LSTM), one
   UNIDIRECTIONAL_SEQUENCE_LSTM.
1. ``unroll_while`` (graph.unroll): other WHILE loops with a constant trip count.
1b. ``stablehlo_builtin`` (graph.stablehlo): a float32 STABLEHLO_ADD / _MULTIPLY / _MAXIMUM / _MINIMUM as the
   TFLite builtin that says the same.
1c. ``split_bidirectional`` (graph.bidirectional): a float BIDIRECTIONAL_SEQUENCE_LSTM as its two unidirectional
   LSTMs and the time reversals (in a graph with state too: the cells keep the op's state variables).
2. ``float_view`` (graph.float_view): a quantized subgraph's float equivalent.
3. ``fold_constants``: every op whose inputs are all constant. It is evaluated by the CPU kernels, so the
   CPU runner of each graph above does it when it is built (the CPU-only path folds the same way).
   A graph whose input values size some tensors (graph.sizes) skips 3b and 3c, which reason from its shapes.
3b. ``conv_arg`` (graph.conv_arg): a CONV_2D and the ARG_MAX / ARG_MIN over its channels, one op; before the
   precision choice, which may keep it FP32 for its index while its sums stay half.
3c. ``sink_elementwise`` (graph.sink): an elementwise op whose one reader is a reshape, and which could not join
   its input's producer, moved after the reshape, whose kernel then takes it.
3d. ``fold_shapes``: once the plan's shapes are propagated for its inputs, each SHAPE is a constant, and what
   then reads only constants folds too (a converted Keras reshape's shape computed at run time).
4. placement: an op goes to the device where a generator makes its kernels, and its tensors' sizes are fixed
   (``DataSizes.host_ops``: a WHERE and what reads its rows run on the CPU).
5. ``cull_dead``, ``drop_identities``, ``merge_pad``, ``fuse_expand_depthwise`` on a GPU (not with
   fuse_expansions), ``fuse_separable``, ``fold_reshapes``, ``fold_tensordot``, ``fuse_elementwise``,
   ``fuse_input_prologue`` on a GPU, ``fuse_regions``, ``fuse_gates``, ``fold_gate_scales``, ``fuse_pooled_dense``
   on a GPU and, where the plan's config asks, ``fuse_expansions``,
   then ``merge_sibling_convs`` on a GPU (graph.passes), in that order.
5b. ``dense_boundary``: the one kernel reading a graph input (writing a graph output) reads (writes) the host's
   dense NHWC buffer itself, where its generator can: no layout-conversion pass at the boundary.
6. ``link_concat`` (``link_concatenations``), after tuning: a channel concatenation's producers write into
   its output's buffer, and it launches nothing; then ``link_split`` (``link_splits``): a channel split's
   readers read its input's buffer, and it launches nothing; then ``link_reshape`` (``link_reshapes``): a
   reshape that keeps the slice layout, or a CAST of integers to float32 in the same storage, is its input's
   buffer.
6b. ``hand_over``, on a CPU device in an FP32 plan: a tensor between steps whose writer and every reader take it
   pixel by pixel is passed as a dense NHWC buffer of whole slices.
7. the partition limit (``max_delegated_partitions``) and, after compilation, ops whose kernels the
   device's compiler refused, back to the CPU.

``transform_graph`` runs 0-3c, ``fold_shapes`` 3d, ``select`` 3-5, ``dense_boundary`` 5b, ``link_concatenations``,
``link_splits`` and ``link_reshapes`` 6, ``hand_over`` 6b and ``limit_partitions`` 7; the plan calls them in that
order, and nothing else transforms the graph.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from ..cpu.executor import SubgraphRunner
from ..graph.bidirectional import split_bidirectional
from ..graph.composite import inline_composites
from ..graph.conv_arg import merge_channel_args
from ..graph.float_view import float_view, needs_float_view
from ..graph.indices import exact_indices
from ..graph.lstm_loop import fuse_lstm_loops
from ..graph.passes import (
    MOVES,
    PassStep,
    cull_dead,
    drop_identities,
    fold_gate_scales,
    fold_moves,
    fold_reshapes,
    fold_tensordot,
    fuse_elementwise,
    fuse_expand_depthwise,
    fuse_expansions,
    fuse_gates,
    fuse_input_prologue,
    fuse_layer_norms,
    fuse_pooled_dense,
    fuse_regions,
    fuse_separable,
    fuse_spectra,
    fuse_swish,
    merge_pad,
    merge_sibling_convs,
    model_ops,
    moves_in_place,
)
from ..graph.precision import STORAGE_CAST, stored_fp16
from ..graph.sink import sink_elementwise
from ..graph.sizes import DataSizes, sized_by_data
from ..graph.stablehlo import as_builtins
from ..graph.unroll import unroll_static_loops
from ..kernels import GenContext, KernelSpec, Target, Unsupported, expand_depthwise, generator_for
from ..kernels.common import dense_tensors, fp32_region
from ..kernels.program import shared_names
from ..kernels.reindex import casts_held_values
from ..model.ir import Operator, Subgraph
from ..ops.layout import bhwc, same_slice_order
from . import ShapeError

log = logging.getLogger("tflgpu")


@dataclass(frozen=True)
class ConcatLink:
    """A CONCATENATION along channels done by its producers (TFLite's GPU delegate calls it linking): each input
    tensor is a region of the output's buffer, so the producers write straight into their slices and the op
    launches nothing."""

    output: int
    offsets: dict[int, int]  # input tensor -> its first element in the output's slice layout
    fp16: bool  # the storage precision of the output and its inputs

    whole = property(lambda self: self.output)  # the tensor whose buffer the regions are in
    reads = property(lambda self: tuple(self.offsets))  # what the step reads, and writes
    writes = property(lambda self: (self.output,))


@dataclass(frozen=True)
class SplitLink:
    """A SPLIT along channels done by its readers: each output tensor is a region of the input's buffer, so the
    op launches nothing and its readers read their slices in place."""

    input: int
    offsets: dict[int, int]  # output tensor -> its first element in the input's slice layout
    fp16: bool  # the storage precision of the input and its outputs

    whole = property(lambda self: self.input)
    reads = property(lambda self: (self.input,))
    writes = property(lambda self: tuple(self.offsets))


@dataclass(frozen=True)
class ReshapeLink:
    """A RESHAPE (SQUEEZE, EXPAND_DIMS) whose output orders its elements as its input does in the slice layout:
    the output is its input's whole buffer under another shape, and the op launches nothing."""

    input: int
    output: int
    fp16: bool

    whole = property(lambda self: self.input)
    offsets = property(lambda self: {self.output: 0})
    reads = property(lambda self: (self.input,))
    writes = property(lambda self: (self.output,))


@dataclass
class Step:
    op: Operator  # the op whose generator made the kernel (a fused group's producer)
    device: str  # "gpu" | "cpu"
    specs: list[KernelSpec] = field(default_factory=list)
    members: list = field(default_factory=list)  # [(op, cpu_fn)]: every op this step computes, in order
    reason: str = ""
    kernels: list = field(default_factory=list)  # bound pyopencl kernels, parallel to specs
    epilogue: list = field(default_factory=list)  # fused elementwise ops the kernels apply
    params: dict = field(default_factory=dict)  # generator knobs (explicit or tuned); {} = heuristics
    # a concatenation its producers do, a split or a reshape its readers (no kernels)
    link: ConcatLink | SplitLink | ReshapeLink | None = None


@dataclass(frozen=True)
class KernelMaker:
    """Generates an op's kernels for one subgraph (with this plan's shapes), precision and constants.
    ``fp32_ops``: in an FP16 plan, the ops that store in FP32 (graph.precision); their kernels' sources switch
    the storage macros to float for themselves."""

    sg: Subgraph
    consts: dict
    fp16: bool
    variables: frozenset
    fp32_ops: frozenset = frozenset()
    target: Target = field(default_factory=Target)
    # graph inputs / outputs their one kernel reads / writes as the dense boundary buffer (``dense_boundary``)
    dense: frozenset = frozenset()
    # tensors between two device steps that the writer writes and every reader reads as a dense NHWC buffer
    # (``hand_over``); not part of a kernel's identity (``heuristic``)
    handover: frozenset = frozenset()
    # what a composite op's unfused form generates each part with, ``part_params(make, op, epilogue)``
    # (GenContext.part_params; runtime.tuning.PartRecords: the part's own record); None: the parts' heuristics
    part_params: Callable[[KernelMaker, Operator, list], dict] | None = None

    def op_fp16(self, op: Operator) -> bool:
        return self.fp16 and op.index not in self.fp32_ops

    @cached_property
    def stored_fp16(self) -> dict[int, bool]:
        """In an FP16 plan, whether each tensor is stored as half (graph.precision.stored_fp16); an FP32 plan stores
        every tensor as float32."""
        return stored_fp16(self.sg, self.fp32_ops)

    @cached_property
    def _exact_ints(self) -> frozenset[int]:
        return exact_indices(self.sg)

    def half_outputs(self, op: Operator) -> frozenset[int]:
        """The outputs an FP32 op of an FP16 plan stores as half (graph.precision: one that casts its own)."""
        if not self.fp16 or op.index not in self.fp32_ops:
            return frozenset()
        return frozenset(t for t in op.outputs if t >= 0 and self.stored_fp16[t])

    def __call__(self, op: Operator, epilogue: list, params: dict) -> list[KernelSpec]:
        """The kernels of ``op`` (with its fused ops) for these generator parameters, named by their code
        (``kernels.program.shared_names``: identical layers share one function); raises Unsupported."""
        own = self.part_params
        return self._make(op, epilogue, params, (lambda o, e: own(self, o, e)) if own is not None else None)

    def heuristic(self, op: Operator, epilogue: list) -> list[KernelSpec]:
        """The kernels of ``op`` at its generator's defaults, a composite op's parts' too: what names the kernel
        (its tuning key), whatever records its parts have, and whatever the plan hands over densely."""
        return self._make(op, epilogue, {}, None, keyed=True)

    def _make(self, op: Operator, epilogue: list, params: dict, part_params, keyed: bool = False) -> list[KernelSpec]:
        half, half_outputs = self.op_fp16(op), self.half_outputs(op)
        ctx = GenContext(op, self.sg, self.consts, half, params, epilogue, self.variables, half_outputs, self.target,
                         dense=self.dense if keyed else self.dense | self.handover, exact_ints=self._exact_ints,
                         part_params=part_params)
        specs = generator_for(op.name)(ctx)
        if half != self.fp16:  # (an FP32 op of an FP16 plan)
            specs = [replace(s, source=fp32_region(s.source)) for s in specs]
        # (a kernel naming no work-group: a CPU device's one per compute unit, Target.work_group)
        specs = [replace(s, fp16=half, half_outputs=half_outputs,
                         local_size=s.local_size if s.local_size is not None
                         else self.target.work_group(tuple(s.global_size))) for s in specs]
        return shared_names(specs, ctx.name)


@dataclass
class TransformedGraph:
    """The graph a device plan is built from (steps 1-3 above), with its CPU runner."""

    runner: SubgraphRunner
    quant_io: dict | None  # a float view's quantized inputs/outputs (None: the model is float)
    counts: dict[str, int]  # ops each transform changed


def transform_graph(runner: SubgraphRunner, quantized_models_allowed: bool) -> TransformedGraph:
    """Inline composites, fuse LSTM time loops, unroll other counted WHILE loops, rename StableHLO's elementwise
    ops, then (if allowed) take a quantized subgraph's float view; each new graph's runner folds its constants as it
    is built."""
    unrolled = lstm_loops = composites = 0
    if not any(t.is_variable for t in runner.sg.tensors):  # (a separate runner must not own state)
        sg, composites = inline_composites(runner.sg, runner.runtime.model)
        sg, lstm_loops = fuse_lstm_loops(sg, runner.runtime, runner.consts)
        sg, unrolled = unroll_static_loops(sg, runner.runtime, runner.consts)
        if unrolled or lstm_loops or composites:
            runner = SubgraphRunner(runner.runtime, sg)
            runner.build()
    sg, renamed = as_builtins(runner.sg)
    if renamed:
        runner = _rewired(runner, sg)
    sg, axes, bidirectional = split_bidirectional(runner.sg)
    if bidirectional:  # (new ops and tensors, the state variables the runner's own: _extended)
        runner = _extended(runner, sg, axes)
    quant_io = None
    if quantized_models_allowed:
        runner, quant_io = _float_view(runner)
    merged = sunk = 0
    if not sized_by_data(runner.sg):  # (both reason from the tensors' shapes: a WHERE's rows have none fixed)
        sg, merged = merge_channel_args(runner.sg, runner.consts)
        if merged:
            runner = _rewired(runner, sg)
        sg, sunk = sink_elementwise(runner.sg, runner.consts, [op for op, _ in runner.steps])
        if sunk:
            runner = _rewired(runner, sg)
    return TransformedGraph(runner, quant_io, {"inline_composite": composites, "lstm_loop": lstm_loops,
                                               "unroll_while": unrolled, "stablehlo_builtin": renamed,
                                               "split_bidirectional": bidirectional, "conv_arg": merged,
                                               "sink_elementwise": sunk})


def _extended(runner: SubgraphRunner, sg: Subgraph, consts: dict) -> SubgraphRunner:
    """A runner over ``sg``, ``runner``'s graph with ops replaced by new ones numbered after its own (and new
    ``consts``): the ops it kept keep their CPU kernels (a folded one stays folded), the new ones get theirs, and the
    variables (their state) stay ``runner``'s."""
    kept = {op.index: fn for op, fn in runner.steps}
    known = {op.index for op in runner.sg.operators}
    new = runner.derived(sg, [])
    new.consts = {**runner.consts, **consts}
    new.steps = [(op, kept[op.index] if op.index in known else new.kernel(op))
                 for op in sg.operators if op.index in kept or op.index not in known]
    return new


def _rewired(runner: SubgraphRunner, sg: Subgraph) -> SubgraphRunner:
    """A runner over ``sg``, a rewrite of ``runner``'s graph that keeps each op index: the steps it runs (an op the
    rewrite removed runs no more) keep their CPU kernels, and an op the rewrite replaced (a CONV_ARG, a swapped
    reshape) gets a new one."""
    kept = {op.index: (op, fn) for op, fn in runner.steps}
    new = runner.derived(sg, [])
    new.steps = [(op, kept[op.index][1] if kept[op.index][0] is op else new.kernel(op))
                 for op in sg.operators if op.index in kept]
    return new


def _float_view(runner: SubgraphRunner) -> tuple[SubgraphRunner, dict | None]:
    """(a runner over the float view, the view's quantized I/O) of a quantized subgraph; (``runner``, None) for
    a float one, or (one warning) when the view cannot be built: its quantized ops then keep their integer
    kernels."""
    if not needs_float_view(runner.sg):
        return runner, None
    try:
        view = float_view(runner.sg)
        view_runner = SubgraphRunner(runner.runtime, view.sg)
        view_runner.build()
    except ValueError as e:  # a quantized model whose float view has no kernel somewhere
        log.warning("GpuDelegate: no float view of this quantized model (%s); its quantized ops run "
                    "on the CPU integer kernels", e)
        return runner, None
    log.info("float view of a quantized model: %d quantization simulators%s", view.simulators,
             f"; on integer kernels: {', '.join(view.kept_integer)}" if view.kept_integer else "")
    return view_runner, view.io


def propagate_shapes(runner: SubgraphRunner, input_shapes: list[tuple[int, ...]]) -> Subgraph:
    """The subgraph with every tensor's actual shape for these input shapes (a CPU run on zeros, skipping the
    kernels whose output shapes follow from their inputs': ``SubgraphRunner.shapes``; else the whole run).

    Kernels are specialized for exact shapes, and a model's declared shapes may be stale
    (LiteRT recomputes them too); variables are reset afterwards.
    """
    sg = runner.sg
    zeros = [np.zeros(shape, sg.tensors[i].dtype) for i, shape in zip(sg.inputs, input_shapes)]
    try:
        shapes = runner.propagated_shapes(zeros)
    except RuntimeError as e:  # a kernel's refusal ("Node number N (OP) failed to invoke: ...")
        raise ShapeError(str(e)) from e
    tensors = [replace(t, shape=tuple(s)) if s is not None else t for t, s in zip(sg.tensors, shapes)]
    return replace(sg, tensors=tensors)


def fold_shapes(runner: SubgraphRunner, shaped: Subgraph, sizes: DataSizes) -> SubgraphRunner:
    """``runner`` with each SHAPE of a tensor whose shape the plan knows (``shaped``: every tensor's shape for
    the plan's inputs) made a constant, and every op then reading only constants folded as the CPU runner folds
    (``SubgraphRunner.folded``): a converted Keras graph computes its reshapes' shapes at run time (SHAPE ->
    STRIDED_SLICE -> PACK -> RESHAPE; BirdNET 2.4 has 16 such SHAPEs), which a plan specialized for one input shape
    knows already, so the reshapes get a constant shape and run on the device. Not the SHAPE of a tensor the input
    values size (``sizes``), whose shape the plan does not know."""
    shapes = [(op.inputs[0], op.outputs[0]) for op, _ in runner.steps
              if op.name == "SHAPE" and op.inputs and op.inputs[0] >= 0 and op.outputs[0] >= 0
              and op.inputs[0] not in sizes.sized]
    return runner.folded({y: np.array(shaped.tensors[x].shape, shaped.tensors[y].dtype) for x, y in shapes})


def select(runner: SubgraphRunner, make: KernelMaker, params: dict, regions: bool = True,
           expansions: bool | None = False, sizes: DataSizes | None = None) -> tuple[list[Step], dict[str, int]]:
    """Place each op, run the graph passes (``regions``: fuse_regions too; ``expansions``: fuse_expansions, its
    blocks starting fused; None: on a GPU, its blocks starting unfused for the tuner to fuse), then generate the
    kernels of every device step. ``sizes``: what of the graph the input values size (its ops stay on the CPU).
    Returns the steps and how many ops each pass changed."""
    sg, consts = make.sg, runner.consts
    sizes = sizes if sizes is not None else DataSizes.of(runner.sg)
    reasons: dict[int, str] = {}
    generated: dict[int, tuple] = {}  # op index -> (op, specs) from the support check
    base = []
    for op, fn in runner.steps:
        why = sizes.host_ops.get(op.index)
        if why is None and generator_for(op.name) is None:
            why = "no OpenCL kernel"
        elif why is None:
            try:  # (whether a generator takes the op; an op's parameters are applied when its step is made, since
                # a pass may merge it into another op of its index: fuse_separable)
                generated[op.index] = (op, make(op, [], {}))
            except Unsupported as e:
                why = str(e)
        if why is not None:
            reasons[op.index] = why
        base.append(PassStep(op, [(op, fn)], [], op.index in generated))
    counts = {"fold_constants": len(runner.sg.operators) - len(runner.steps)}
    steps, counts["cull_dead"] = cull_dead(base, sg)
    steps, counts["drop_identities"] = drop_identities(steps, sg, consts, frozenset(sizes.sized))
    steps, counts["merge_pad"] = merge_pad(steps, sg, consts)
    # (two convs of one storage precision; neither one that casts its own output)
    same_storage = lambda dw, pw: (make.op_fp16(dw) == make.op_fp16(pw)
                                   and not make.half_outputs(dw) and not make.half_outputs(pw))
    # (on a GPU, where a block would take three launches: kernels.expand_depthwise; not where the config asks for
    # separable blocks fused with the next expansion, which this pass would take their depthwise convs from)
    if make.target.gpu and expansions is not True:
        blocks = lambda ex, dw: same_storage(ex, dw) and expand_depthwise.wanted(
            make.target, sg.tensors[dw.outputs[0]].shape[3], sg.tensors[ex.inputs[0]].shape[3])
        steps, counts["fuse_expand_depthwise"] = fuse_expand_depthwise(steps, sg, consts, blocks)
    steps, counts["fuse_separable"] = fuse_separable(steps, sg, consts, same_storage)
    steps, counts["fold_reshapes"] = fold_reshapes(steps, sg, consts, same_storage)
    steps, counts["fold_tensordot"] = fold_tensordot(steps, sg, consts)
    one_storage = lambda ops: all(same_storage(ops[0], op) for op in ops[1:])  # (a chain's ops, in order)
    steps, counts["fold_moves"] = fold_moves(steps, sg, consts, one_storage)
    steps, counts["fuse_layer_norms"] = fuse_layer_norms(steps, sg, consts, one_storage)
    steps, counts["fuse_spectra"] = fuse_spectra(steps, sg, consts)
    steps, counts["fuse_swish"] = fuse_swish(steps, sg, consts)
    steps, counts["fuse_elementwise"] = fuse_elementwise(steps, sg, consts)
    if make.target.gpu:  # (a launch saved; on the Intel CPU runtime the stem conv reading the dense input with the
        # prologue made the int8 MobileNet v2 7% slower than the simulator's own kernel: bench/pass_ab.py)
        steps, counts["fuse_input_prologue"] = fuse_input_prologue(steps, sg, consts, same_storage)
    counts["fuse_regions"] = 0
    if regions:
        steps, counts["fuse_regions"] = fuse_regions(steps, sg, consts, same_storage)
    steps, counts["fuse_gates"] = fuse_gates(steps, sg, consts, same_storage)
    steps, counts["fold_gate_scales"] = fold_gate_scales(steps, sg, consts, same_storage)
    if make.target.gpu:  # (a CPU device runs the two ops' own kernels: kernels.pooled_dense)
        steps, counts["fuse_pooled_dense"] = fuse_pooled_dense(steps, sg, consts, same_storage)
    if expansions or (expansions is None and make.target.gpu):
        steps, counts["fuse_expansions"] = fuse_expansions(steps, sg, consts, same_storage, expansions is True)
    if make.target.gpu:  # (a CPU device keeps the convs' own kernels: kernels.siblings)
        steps, counts["merge_sibling_convs"] = merge_sibling_convs(steps, sg, consts, same_storage)
    out = []
    for ps in steps:
        if not ps.gpu:
            out.append(Step(ps.op, "cpu", members=ps.members, reason=reasons.get(ps.op.index, "")))
            continue
        first, own = generated.get(ps.op.index), params.get(ps.op.index, {})
        if first is not None and first[0] is ps.op and not ps.epilogue and not own:
            specs = first[1]  # no pass changed this op: the check's kernels are the kernels
        else:
            try:
                specs = make(ps.op, ps.epilogue, own)
            except Unsupported as e:  # (parameters this op does not take)
                out.append(Step(ps.op, "cpu", members=ps.members, reason=str(e)))
                continue
        out.append(Step(ps.op, "gpu", specs, members=ps.members, epilogue=ps.epilogue, params=own))
    return out, counts


def _linked_tensors(steps: list[Step]) -> set[int]:
    """The tensors already part of a link: each link's whole and its regions (a region is not nested)."""
    return {t for s in steps if s.link is not None for t in (s.link.whole, *s.link.offsets)}


def _channel_regions(sg, parts: list[int], whole, fp16: bool, align_bytes: int, excluded: set) -> dict | None:
    """Each of ``parts`` (concatenated along channels in order, of one image) as a region of a tensor of layout
    ``whole``: its first element in that slice layout; None unless each is a distinct tensor not in ``excluded``
    with the whole's pixels, every one but the last whole 4-channel slices, and each start on ``align_bytes``."""
    offsets, start = {}, 0
    for k, t in enumerate(parts):
        lay = bhwc(sg.tensors[t].shape) if t >= 0 else None
        if lay is None or t in excluded or t in offsets or lay.dims[:3] != whole.dims[:3] or \
                (k < len(parts) - 1 and lay.c % 4) or (start * (2 if fp16 else 4)) % align_bytes:
            return None
        offsets[t] = start
        start += lay.s * whole.h * whole.w * 4
    return offsets


def link_concatenations(steps: list[Step], make: KernelMaker, align_bytes: int) -> int:
    """Link every device CONCATENATION that can be (``ConcatLink``): along channels of one image, each input a
    distinct tensor made by the plan (not a graph input, a constant or state; not already a region of another
    concatenation, nor itself linked), every input but the last a whole number of 4-channel slices, and each
    region's start on the device's sub-buffer alignment (``align_bytes``). Returns how many were linked."""
    sg = make.sg
    taken = _linked_tensors(steps)
    fixed = set(sg.inputs) | set(make.consts) | set(make.variables)
    linked = 0
    for s in steps:
        op = s.op
        if s.device != "gpu" or op.name != "CONCATENATION" or s.epilogue or len(s.members) != 1:
            continue
        (out,) = op.outputs
        shape = sg.tensors[out].shape
        lay = bhwc(shape)
        if out in taken or lay is None or lay.b != 1 or \
                op.options.get("axis", 0) % max(len(shape), 1) != len(shape) - 1:
            continue
        fp16 = make.op_fp16(op)
        offsets = _channel_regions(sg, list(op.inputs), lay, fp16, align_bytes, fixed | taken)
        if offsets is not None:
            s.link, s.specs = ConcatLink(out, offsets, fp16), []
            taken.update(offsets, [out])
            linked += 1
    return linked


# graph output dtypes a dense boundary buffer holds (as floats; an integer or bool output converted after the read)
DENSE_OUTPUT_DTYPES = (np.float32, np.int32, np.int64, np.bool_)


def dense_boundary(steps: list[Step], make: KernelMaker) -> tuple[KernelMaker, int]:
    """Merge the boundary layout conversion into the first and last kernels: a float graph input that one device
    kernel reads, as one argument (nothing else reads it, nor a fused op's operand, which reads the slice layout),
    and a graph output that one device step writes and nothing on the device or the CPU reads, is read / written
    by that step's kernel as the dense NHWC float32 buffer the host copies (``KernelSpec.dense``), where its
    generator has that form (the direct conv, the direct transposed convs, RESIZE_BILINEAR): no conversion pass
    and no slice-layout copy of the tensor. Regenerates those steps; returns the maker to generate with from
    now on (its ``dense`` set: tuning's candidates keep the form) and how many tensors are read or written
    densely."""
    sg = make.sg
    readers: dict[int, set[int]] = {}  # tensor -> device steps reading it
    reads: dict[int, int] = {}  # tensor -> kernel arguments reading it (a conv reading x and adding x after: 2)
    writers: dict[int, int] = {}
    host_reads: set[int] = set()
    for i, s in enumerate(steps):
        if s.device == "gpu":
            for spec in s.specs:
                for t in spec.inputs:
                    readers.setdefault(t, set()).add(i)
                    reads[t] = reads.get(t, 0) + 1
                for t in spec.outputs:
                    writers[t] = i
        else:
            host_reads.update(t for op, _ in s.members for t in op.inputs)
    fixed = set(make.consts) | set(make.variables)
    def dense(t, dtypes=(np.float32,)):
        return t not in fixed and sg.tensors[t].dtype in dtypes and bhwc(sg.tensors[t].shape) is not None

    wanted: dict[int, int] = {}  # tensor -> the step whose kernel would read / write it densely
    for t in sg.inputs:  # (read once: a fused op's operand reads the slice layout)
        if dense(t) and reads.get(t) == 1:
            wanted[t] = next(iter(readers[t]))
    for t in sg.outputs:
        i = writers.get(t)
        if i is not None and dense(t, DENSE_OUTPUT_DTYPES) and t not in sg.inputs and t not in readers \
                and t not in host_reads and t not in wanted and len(steps[i].specs) == 1:
            wanted[t] = i
    if not wanted:
        return make, 0
    make = replace(make, dense=frozenset(wanted))
    for i in sorted(set(wanted.values())):
        s = steps[i]
        try:
            specs = make(s.op, s.epilogue, s.params)
        except Unsupported:  # (its explicit parameters name a form without a dense read / write: a group tile)
            continue
        honoured = dense_tensors(specs)
        if any(t in honoured for t, at in wanted.items() if at == i):
            s.specs = specs
    # (the boundary's: a tensor a composite's unfused form passes between its kernels densely, as on a CPU device
    # kernels.separable does, is its own, and each part keeps the identity it has as a step alone)
    boundary = set(sg.inputs) | set(sg.outputs)
    honoured = frozenset(t for s in steps if s.device == "gpu" for t in dense_tensors(s.specs) if t in boundary)
    return replace(make, dense=honoured), len(honoured)


# the image size (pixels) from which ``hand_over`` leaves a tensor in the slice layout: there the writer's dense
# stores cost more than its readers save. MobileNet v2's 112 x 112 expansion to 96 channels (three slice groups a
# pixel, each work-item's pixels 384 bytes apart) took 292 us against 229 writing slices, the separable block reading
# it 273 against 295; with that tensor left out the plan ran 1.025x faster than without the pass, SSD 1.031x,
# DeepLab 1.013x (with it 1.013x, 0.998x, 0.997x; one process, 8 shuffled rounds, 2 Xeon cores)
HAND_OVER_PIXELS = 8192


def hand_over(steps: list[Step], make: KernelMaker) -> tuple[KernelMaker, int]:
    """On a CPU device, in an FP32 plan: each float32 tensor between device steps that its one writer can write and
    each of its readers can read as a dense NHWC buffer of whole slices (pixel by pixel) is handed over so: where
    a step reads the slice layout, each work-item gathers a short piece of every slice plane it needs (a float16 of
    four slices: four loads and three shuffles), where it reads pixels, one load. The candidates: written by one
    kernel, read by kernels only, each reading it once (not as a fused op's operand, which reads the slice layout),
    not a graph input or output, not a variable, an image of fewer than ``HAND_OVER_PIXELS``. Each candidate is
    tried alone: the writer and readers are regenerated (with their parameters) and the tensor taken where every
    one of them honours it (``KernelSpec.dense``: a direct conv writing or reading it, a depthwise conv writing or
    reading it, a separable block's direct kernel or its unfused form's depthwise conv reading it). Runs after the
    links (a linked tensor is a region of another's slices: none is taken). Returns the maker to generate with from
    now on (its ``handover`` set: a regenerated step keeps the form; a background swap to a point its generator
    refuses there, or to a form not honouring it, is not installed, runtime.upgrades; a kernel's identity, its
    tuning key, does not change) and how many tensors are handed over. Whole plans against
    the plan without the pass (tuning none, shipped records, one process, 8 shuffled rounds, 2 Xeon cores):
    MobileNet v2 1.024x (15 tensors), SSD 1.013x (16), DeepLab 1.00x (16), PoseNet 1.01x (8), MobileNet v1 1.00x
    (7), MediaPipe's pose detection 1.025x (19), hand landmark 1.028x (14); two runs of one plan differ by up to
    2.5% here."""
    sg = make.sg
    if make.target.gpu or make.fp16:
        return make, 0
    writers: dict[int, list[int]] = {}
    readers: dict[int, list[int]] = {}
    reads: dict[int, int] = {}
    host: set[int] = set()
    for i, s in enumerate(steps):
        if s.device != "gpu":
            host.update(t for op, _ in s.members for t in op.inputs + op.outputs)
            continue
        if s.link is not None:
            host.update(s.op.inputs + s.op.outputs)  # (a link's tensors are regions of another's buffer)
            continue
        for spec in s.specs:
            for t in spec.outputs:
                writers.setdefault(t, []).append(i)
            for t in spec.inputs:
                readers.setdefault(t, []).append(i)
                reads[t] = reads.get(t, 0) + 1
    boundary = set(sg.inputs) | set(sg.outputs) | set(make.dense) | set(make.variables) | set(make.consts)
    taken: set[int] = set()
    for t in sorted(writers):
        lay = bhwc(sg.tensors[t].shape)
        users = sorted(set(readers.get(t, [])))
        if t in boundary or t in host or len(writers[t]) != 1 or not users or reads[t] != len(users) \
                or sg.tensors[t].dtype != np.float32 or lay is None or lay.c % 4 or lay.h * lay.w >= HAND_OVER_PIXELS:
            continue
        at = [writers[t][0], *users]
        if len(set(at)) != len(at):
            continue
        trial = replace(make, handover=make.handover | {t})
        made = {}
        for i in at:
            s = steps[i]
            try:
                made[i] = trial(s.op, s.epilogue, s.params)
            except Unsupported:
                break
        # (every step keeps its form: a tuned decision is not undone for the hand-over, a block left unfused stays so)
        if len(made) != len(at) or not all(t in dense_tensors(made[i]) for i in at) \
                or any([sp.params for sp in made[i]] != [sp.params for sp in steps[i].specs] for i in at):
            continue
        for i, specs in made.items():
            steps[i].specs = specs
        make = trial
        taken.add(t)
    return make, len(taken)


def link_splits(steps: list[Step], make: KernelMaker, align_bytes: int) -> int:
    """Link every device SPLIT / SPLIT_V that can be (``SplitLink``): along channels of one image, its input a
    tensor made or uploaded by the plan (not a region of another link, nor a dense boundary buffer), every output
    but the last a whole number of 4-channel slices, and each region's start on the device's sub-buffer alignment
    (``align_bytes``). Returns how many were linked."""
    sg = make.sg
    taken = _linked_tensors(steps)
    fixed = set(make.consts) | set(make.variables) | set(make.dense)
    linked = 0
    for s in steps:
        op = s.op
        if s.device != "gpu" or op.name not in ("SPLIT", "SPLIT_V") or s.epilogue or len(s.members) != 1 \
                or s.link is not None:
            continue
        x_idx, axis_idx = (1, 0) if op.name == "SPLIT" else (0, 2)
        x, axis = op.inputs[x_idx], make.consts.get(op.inputs[axis_idx])
        shape = sg.tensors[x].shape
        lay = bhwc(shape)
        if axis is None or lay is None or lay.b != 1 or x in fixed or x in taken or \
                int(np.asarray(axis).reshape(-1)[0]) % max(len(shape), 1) != len(shape) - 1:
            continue
        fp16 = make.op_fp16(op)
        offsets = _channel_regions(sg, list(op.outputs), lay, fp16, align_bytes, fixed | taken)
        if offsets is not None:
            s.link, s.specs = SplitLink(x, offsets, fp16), []
            taken.update(offsets, [x])
            linked += 1
    return linked


def link_reshapes(steps: list[Step], make: KernelMaker) -> int:
    """Link every device RESHAPE / SQUEEZE / EXPAND_DIMS (or SLICE / STRIDED_SLICE taking every element, or a chain
    of moves leaving every value in its place: graph.passes.moves_in_place) whose
    input and output order their elements alike in the slice layout (``ReshapeLink``: the same images, channels and
    pixels per image: (1, 256) -> (256,), (1, 4, 8, C) -> (1, 32, C), ...), its input a tensor made or uploaded by
    the plan that is not a region of another link (but a linked reshape's output: then a region of the same whole;
    a linked concatenation's output or split's input is a whole, so the reshape's output is all of it) nor a dense
    boundary buffer. Returns how many were linked."""
    sg = make.sg
    taken = _linked_tensors(steps)
    wholes = {s.link.whole for s in steps if s.link is not None}
    fixed = set(make.consts) | set(make.variables) | set(make.dense)
    roots: dict[int, int] = {}  # a linked reshape's output -> its whole: a reshape of it is a region of that too
    linked = 0
    for s in steps:
        op = s.op
        if s.device != "gpu" or not (moves_in_place(op, sg, make.consts) or _copying_cast(op, make)) \
                or s.epilogue or (len(s.members) != 1 and op.name != MOVES) or s.link is not None or not op.inputs \
                or len(op.outputs) != 1:
            continue
        x, y = op.inputs[0], op.outputs[0]
        # (the slice layout orders a batch's pixels row-major: images of one pixel count share it)
        if not same_slice_order(sg.tensors[x].shape, sg.tensors[y].shape) or y in fixed | taken \
                or (x not in roots and x in fixed | (taken - wholes)) or x == y:
            continue
        whole = roots.get(x, x)
        s.link, s.specs = ReshapeLink(whole, y, make.op_fp16(op)), []
        taken.update((x, y))
        roots[y] = whole
        linked += 1
    return linked


def _copying_cast(op, make: KernelMaker) -> bool:
    """A CAST of integers or bools to float32 whose output is stored as its input is (kernels.reindex.cast: the
    device holds them as float values already, so the cast's kernel only copies); not one that stores its copy in
    half (an FP32 index read by FP16 ops)."""
    if op.name != "CAST" or len(op.outputs) != 1 or op.outputs[0] < 0 or not op.inputs:
        return False
    x, y = make.sg.tensors[op.inputs[0]], make.sg.tensors[op.outputs[0]]
    return casts_held_values(x, y) and (not make.fp16 or make.stored_fp16[x.index] == make.stored_fp16[y.index])


def restore(steps: list[Step], record) -> bool:
    """Apply a stored plan's placement (a cache.plans.PlanRecord) to freshly selected steps; False if they
    differ."""
    if [s.op.index for s in steps] != [r.op_index for r in record.steps]:
        return False
    for s, r in zip(steps, record.steps):
        if s.device == "gpu" and not r.on_device:
            s.device, s.reason = "cpu", r.reason  # e.g. its kernel failed to build, or a partition limit
        elif s.device == "cpu" and r.on_device:
            return False
    return True


def limit_partitions(steps: list[Step], max_partitions: int) -> int:
    """Keep the ``max_partitions`` largest runs of device steps on the device; returns the partition count."""
    runs, cur = [], []
    for i, s in enumerate(steps):
        if s.device == "gpu":
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    if len(runs) <= max_partitions:
        return len(runs)
    keep = set()
    for run in sorted(runs, key=len, reverse=True)[:max_partitions]:
        keep.update(run)
    for i, s in enumerate(steps):
        if s.device == "gpu" and i not in keep:
            s.device, s.reason = "cpu", "outside the max_delegated_partitions largest partitions"
    return max_partitions


def report_placement(steps: list[Step], partitions: int) -> tuple[int, int]:
    """(ops on the device, ops on the CPU), the model's ops (graph.passes.model_ops); one warning listing why each
    CPU op is there, as TFLite does."""
    cpu = [s for s in steps if s.device == "cpu"]
    ops = lambda among: [m for s in among for op, _ in s.members for m in model_ops(op)
                         if m.name != STORAGE_CAST]  # (a plan's casts are not the model's)
    cpu_ops = len(ops(cpu))
    gpu_ops = len(ops(steps)) - cpu_ops
    if cpu:
        lines = [f"op code #{op.builtin_code} ({op.name}) cannot be handled by this delegate: {s.reason}"
                 for s in cpu for member, _ in s.members for op in model_ops(member)]
        log.warning("%s\n%d ops run on the OpenCL device (%d partitions), %d on the CPU",
                    "\n".join(dict.fromkeys(lines)), gpu_ops, partitions, cpu_ops)
    return gpu_ops, cpu_ops
