"""Graph passes over the delegated step list, run in this fixed order (counts: ``tflgpu inspect --passes``):

1. ``fold_constants`` — done when the CPU runner is built: every op whose inputs are all constant
   (float16 DEQUANTIZE, DENSIFY, shape arithmetic) becomes a constant; counted here.
2. ``cull_dead`` — ops none of whose outputs is read by a later op or is a graph output.
3. ``drop_identities`` — RESHAPE to the same shape, single-input CONCATENATION, all-zero PAD: their
   readers read the input instead (kept when the output is a graph output).
4. ``merge_pad`` — a zero PAD (spatial only) read only by a CONV_2D / DEPTHWISE_CONV_2D becomes that
   conv's explicit padding (not pooling: AVERAGE_POOL_2D must count explicit zeros, not skip them).
5. ``fuse_expand_depthwise`` (on a GPU, where the block's depthwise conv and projection would take two kernels:
   kernels.expand_depthwise.wanted) — a pointwise CONV_2D whose only reader is a DEPTHWISE_CONV_2D (channel
   multiplier 1) becomes one ``EXPAND_DEPTHWISE`` op at the depthwise conv's place: one kernel expands the rows its
   windows read into local memory and takes the depthwise conv there. Its generator's ``fused`` knob falls back
   to the two ops' own kernels (a GPU plan's start; its tuner fuses a block where that measures faster).
   This pass, ``fuse_separable`` and ``fuse_pooled_dense`` also take a pair whose first op's output reaches the
   second through unary elementwise ops of their own (a quantized model's float view puts a QUANT_SIM there):
   they join the merged op (``BETWEEN``), applied to the first op's values where its kernel has them.
6. ``fuse_separable`` — a DEPTHWISE_CONV_2D (channel multiplier 1) read only by a pointwise CONV_2D (1x1, stride
   1) becomes one ``SEPARABLE_CONV`` op: one kernel computes the depthwise values of its pixels where the
   pointwise conv reads them, so the intermediate tensor is never stored and one launch goes (MobileNet blocks).
   Whether the kernel fuses or launches the two convs as before is its generator's knob, which the tuner
   turns off per layer where it measures slower.
6b. ``fold_reshapes`` — a CONCATENATION of tensors some of which device reshapes made (read by nothing else)
   becomes one ``CONCAT_VIEWS`` op reading the reshapes' inputs through their shapes (an SSD head's box and class
   rows: its reshapes' launches go, and its LOGISTIC joins it in the next pass).
6c. ``fold_tensordot`` — RESHAPE to rows -> FULLY_CONNECTED -> RESHAPE back (TensorFlow's Tensordot) becomes one
   FULLY_CONNECTED keeping its input's dims: its two layout-changing reshapes go (BirdNET's spectrogram rows).
6c'. ``fold_moves`` — a move whose every output value is one input value (a reshape, transpose, slice, gather by
   constant indices: ops.traits' maps_indices) read only by another one joins it: one ``MOVES`` step at the
   reader's place, one kernel reading each value through their index maps (an STFT's framing: a slice, a reshape
   to sample pairs, the frames' GATHER and a reshape back are one kernel, the 8 MB between them never stored).
   Only moves that launch a kernel each (not one the plan links in place), at most ``MAX_MOVES``.
6d. ``fuse_layer_norms`` — a layer normalization as converters from ONNX write it (MEAN over the last axis, SUB,
   MUL of the difference by itself, MEAN, ADD of a constant epsilon, RSQRT, MUL), each tensor between its ops read
   by them alone, becomes one ``LAYER_NORM`` step at the last MUL's place: one kernel (kernels.pool's row form)
   instead of seven; its scale and shift join it in the next pass.
6e. ``fuse_spectra`` — an RFFT2D of one row a frame (``fft_length`` [1, N]: an STFT), the shape-only ops after it
   and the op taking a float part of its complex values (REAL, IMAG, COMPLEX_ABS, or CAST to float32, which keeps
   the real part), each complex tensor between them read by them alone, become one ``RFFT_PART`` step at the last
   one's place: a device kernel transforms each frame (kernels.spectral), where the CPU kernels had, the frames
   copied to the host and the spectrum back (BirdNET 2.4's two mel spectrograms).
6f. ``fuse_swish`` — a swish as converters write it, ``MUL(x, LOGISTIC(x))`` (EfficientNet's activation; the
   LOGISTIC read by the MUL alone), becomes one unary ``SWISH`` step reading x once, so the next pass fuses it
   into x's producer like any activation (BirdNET 2.4's 45: one launch and a tensor's store and reads each).
7. ``fuse_elementwise`` — a single-consumer elementwise op (RELU*, LOGISTIC, TANH, HARD_SWISH, ...,
   or ADD/SUB/MUL/MAXIMUM/MINIMUM/PRELU with a same-layout tensor or a constant: PRELU's alpha per channel)
   joins its producer (a CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED, a SOFTMAX, an elementwise op: those
   ops.traits says take an epilogue) as a snippet applied before the store. Where the other operand is a PAD
   adding zero channels after the last (a residual block widening its skip branch) read by nothing else, the
   fused op reads the PAD's input instead, its missing slices as zeros, and the PAD's launch goes; a VALID
   MAX_POOL_2D read so (under such a PAD or not) is read as its window's maximum of its input. Where the
   operand (or that PAD's input) is made after the producer by a step that could run before it (a BlazeBlock's
   MAX_POOL of its skip branch, read by nothing else), that step moves before the producer.

7b. ``fuse_input_prologue`` (on a GPU) — unary elementwise steps reading a float graph input (a quantized
   model's QUANTIZE of its float input, as the float view's simulator), read only by a device CONV_2D, join it:
   the conv reads the graph input and applies them to each value it loads (its ``PROLOGUE``; kernels.conv's
   direct kernel), so they take no launch of their own and store nothing.

8. ``fuse_regions`` — elementwise steps (each op with its fused chain) over one layout that read each other's
   outputs or the same inputs, where every input they read exists at the first one's place, become one
   ``ELEMENTWISE_REGION`` step: one kernel loads the region's inputs once, computes each step's value in
   registers (rounded as its storage would round it, so values match the unfused steps'), and stores only what
   a step outside the region or the caller reads (a branchy activation block: one launch instead of one each).

8b. ``fuse_gates`` — a squeeze-and-excitation gate: a spatial mean (a MEAN, or an AVERAGE_POOL_2D whose window is
   the whole image) read only by a FULLY_CONNECTED or pointwise CONV_2D with unary fused ops (its RELU), read only
   by a second one (its sigmoid fused) becomes one ``GATE`` step at the second's place (kernels.pooled_dense.gate):
   two launches of the three go. Its generator's ``fused`` knob falls back to the three ops' own kernels.
8c. ``fold_gate_scales`` — the MUL applying such a gate (x times a [batch, 1, 1, channels] tensor), read only by a
   CONV_2D (a block's projection), joins the conv's step: the conv multiplies each input slice it loads by the
   gate's (``INPUT_SCALE``; kernels.conv's direct kernel and group tile), so the gated tensor is never stored.
9. ``fuse_pooled_dense`` (on a GPU) — a spatial mean (as ``fuse_gates``') read only by a FULLY_CONNECTED or
   pointwise CONV_2D (a classifier's head) becomes one ``POOLED_DENSE`` step at the dense op's place
   (kernels.pooled_dense); its generator's ``fused`` knob falls back to the two ops' own kernels.
10. ``fuse_expansions`` (where the plan's config asks: ``GpuDelegate(fuse_expansions=True)``) — a
   ``SEPARABLE_CONV`` step and a pointwise CONV_2D expanding its output (the next MobileNet v2 block's first conv)
   become one ``SEPARABLE_EXPAND`` step at the separable conv's place: one kernel, its output stored only where
   another op reads it (kernels.separable_expand). Its generator's ``fused`` knob falls back to the two ops' own
   kernels.
11. ``merge_sibling_convs`` (on a GPU) — device pointwise CONV_2Ds of one input, each with no fused ops after it
   and all with one activation (a model's heads: PoseNet's four, an SSD feature map's box and class convs), become
   one ``SIBLING_CONVS`` step at the first one's place: one GEMM over their weights side by side, each output's
   slices stored into that output (kernels.siblings). Its generator's ``fused`` knob falls back to the convs' own
   kernels.

Each pass is a pure function of (steps, subgraph) returning new steps and how many ops it changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..ops.attributes import ACTIVATION_CODES
from ..ops.layout import bhwc, same_slice_order
from ..ops.traits import traits

# graph.passes.fuse_separable's op: inputs (x, depthwise filter, depthwise bias, pointwise filter, pointwise
# bias), the pointwise conv's outputs, index and options, and the two original ops under "depthwise" and
# "pointwise" (what its generator falls back to, and what the CPU runs)
SEPARABLE_CONV = "TFLGPU_SEPARABLE_CONV"
# graph.passes.fuse_expand_depthwise's op: inputs (x, expansion filter, expansion bias, depthwise filter, depthwise
# bias), the depthwise conv's outputs, index and options, and the two original ops under "expand" and "depthwise"
EXPAND_DEPTHWISE = "TFLGPU_EXPAND_DEPTHWISE"
# graph.passes.fuse_regions' op: inputs (the tensors its steps read from outside it), outputs (what is read after
# it), the first step's index, and under "steps" each merged step's (op, fused chain) in order
ELEMENTWISE_REGION = "TFLGPU_ELEMENTWISE_REGION"
# graph.passes.fuse_expansions' op: inputs (the separable conv's five, the expanding conv's filter and bias), the
# expanding conv's outputs, the separable op's index, and under "separable" and "expand" the two merged ops and
# under "keep" whether the separable conv's output (after its epilogue) is read by another op too
SEPARABLE_EXPAND = "TFLGPU_SEPARABLE_EXPAND"
# graph.passes.fuse_pooled_dense's op: inputs (the mean's input, the dense op's weights and bias), the dense op's
# outputs, index and options, and under "mean" and "dense" the two merged ops
POOLED_DENSE = "TFLGPU_POOLED_DENSE"
# graph.passes.fuse_layer_norms' op: input x, the last op's output, index and options {"epsilon": ...}
LAYER_NORM = "TFLGPU_LAYER_NORM"
# graph.passes.fold_moves' op: input x (the first move's), the last move's outputs and index, and options
# {"chain": the moves (ops.traits' maps_indices) in order}
MOVES = "TFLGPU_MOVES"
MAX_MOVES = 4  # (moves one kernel reads through)
# graph.passes.fuse_swish's op: a unary elementwise op x * sigmoid(x) (kernels.expressions), input x, the MUL's
# outputs and index, and under MERGED the LOGISTIC and the MUL
SWISH = "TFLGPU_SWISH"
# the option of an op that is one member of its step (one CPU function) but stands for several of the model's ops:
# those ops, which the placement report counts and names (``model_ops``)
MERGED = "merged"
# graph.passes.fuse_spectra's op: input x (the RFFT2D's frames), the part op's outputs and index, and options
# {"length": N, "part": one of SPECTRUM_PARTS' values}
RFFT_PART = "TFLGPU_RFFT_PART"
# the float value each op reading a complex tensor takes of it (TFLite's CAST from complex keeps the real part)
SPECTRUM_PARTS = {"REAL": "real", "CAST": "real", "IMAG": "imag", "COMPLEX_ABS": "abs"}
# graph.passes.fuse_gates' op: inputs (the pool's input, the hidden dense op's weights and bias, the gate's weights
# and bias), the gate's outputs, index and options, and under "mean", "hidden" and "dense" the three merged ops,
# under HIDDEN_FUSED the unary ops fused after the hidden one (as Fused)
GATE = "TFLGPU_GATE"
HIDDEN_FUSED = "hidden_fused"
# graph.passes.fold_reshapes' op: a CONCATENATION reading the inputs of the reshapes whose outputs it concatenated
# (their shapes under "views", one per input: the reshape's output shape, or None where the input is read as is); the
# concatenation's outputs, index and other options
CONCAT_VIEWS = "TFLGPU_CONCAT_VIEWS"
# graph.passes.merge_sibling_convs' op: inputs (the shared input, then each conv's filter and bias), the convs'
# outputs in order, the first conv's index, and under "convs" the merged CONV_2D ops, under
# "fused_activation_function" their activation
SIBLING_CONVS = "TFLGPU_SIBLING_CONVS"
# the option of a merged op (SEPARABLE_CONV, EXPAND_DEPTHWISE, POOLED_DENSE) holding the unary elementwise ops
# between its two ops, as Fused (a quantized model's QUANT_SIM): applied to the first op's values
BETWEEN = "between"
# the option of a CONV_2D holding the unary elementwise ops it applies to the graph input it reads, as Fused
# (graph.passes.fuse_input_prologue): the values of the tensor its op reads are theirs
PROLOGUE = "prologue"
# the option of a CONV_2D holding the tensor of a per-image, per-channel gate ([batch, 1, 1, channels]) it multiplies
# each input value by as it loads it (graph.passes.fold_gate_scales: the MUL applying a squeeze-and-excitation gate)
INPUT_SCALE = "input_scale"
MAX_REGION_STEPS = 16  # (a kernel's code and registers stay small)


@dataclass
class Fused:
    """One elementwise op appended to a producer: its op, and the other operand (tensor index or constant)."""

    op: object
    other_tensor: int | None = None
    other_const: np.ndarray | None = None
    producer_is_lhs: bool = True
    # the channels of ``other_tensor`` where the op reads it zero-extended to its own channels: the input of a
    # channel PAD folded into the read (``fuse_elementwise``; a batch-1 tensor, its slices read where they exist)
    other_channels: int | None = None
    # where the op reads the maximum of a window of ``other_tensor`` (a MAX_POOL folded into the read)
    other_pool: PoolRead | None = None


@dataclass(frozen=True)
class PoolRead:
    """A VALID MAX_POOL_2D of a batch-1 tensor (``size`` its height and width) read where its output would be
    (``out``: that output's height and width): each value the maximum of its window."""

    filter: tuple[int, int]
    stride: tuple[int, int]
    size: tuple[int, int]
    out: tuple[int, int]


@dataclass
class PassStep:
    op: object  # the producing op (its generator runs)
    members: list = field(default_factory=list)  # [(op, cpu_fn)] in order: the CPU fallback runs these
    epilogue: list[Fused] = field(default_factory=list)
    gpu: bool = True

    @property
    def outputs(self) -> tuple[int, ...]:
        return self.epilogue[-1].op.outputs if self.epilogue else self.op.outputs


def _readers(steps: list[PassStep]) -> dict[int, list[int]]:
    """Each tensor's reading steps, in order, each step once however many of its ops read the tensor (a layer norm's
    MEAN and SUB both read x: one reader)."""
    readers: dict[int, list[int]] = {}
    for i, s in enumerate(steps):
        for op, _ in s.members:
            for t in op.inputs:
                if t >= 0 and readers.setdefault(t, [])[-1:] != [i]:
                    readers[t].append(i)
    return readers


def cull_dead(steps: list[PassStep], sg) -> tuple[list[PassStep], int]:
    live = set(sg.outputs)
    kept: list[PassStep] = []
    removed = 0
    for s in reversed(steps):
        outs = [t for op, _ in s.members for t in op.outputs]
        if any(t in live for t in outs) or any(traits(op.name).side_effects for op, _ in s.members):
            kept.append(s)
            for op, _ in s.members:
                live.update(t for t in op.inputs if t >= 0)
        else:
            removed += len(s.members)
    return list(reversed(kept)), removed


def _remap(steps: list[PassStep], old: int, new: int) -> list[PassStep]:
    """Every reader of tensor ``old`` reads ``new`` instead (ops are replaced, never mutated)."""
    out = []
    for s in steps:
        def fix(op):
            return replace(op, inputs=tuple(new if t == old else t for t in op.inputs)) if old in op.inputs else op

        members = [(fix(op), fn) for op, fn in s.members]
        out.append(PassStep(fix(s.op), members, list(s.epilogue), s.gpu))
    return out


def _paddings(op, consts) -> np.ndarray | None:
    p = consts.get(op.inputs[1]) if len(op.inputs) > 1 else None
    if p is None:
        return None
    if op.name == "PADV2" and len(op.inputs) > 2:
        v = consts.get(op.inputs[2])
        if v is None or float(np.asarray(v).reshape(-1)[0]) != 0.0:
            return None
    return np.asarray(p).reshape(-1, 2).astype(int)


def drop_identities(steps: list[PassStep], sg, consts: dict, unfixed: frozenset[int] = frozenset()
                    ) -> tuple[list[PassStep], int]:
    """Remove reshapes to the same shape, one-input concatenations and PADs of zeros. ``unfixed``: tensors whose
    shapes the graph does not fix (graph.sizes): a reshape of one may change its shape in another invoke."""
    graph_out = set(sg.outputs)
    dropped = 0
    i = 0
    steps = list(steps)
    while i < len(steps):
        s = steps[i]
        op = s.op
        identity = False
        if len(s.members) == 1 and op.outputs and op.outputs[0] not in graph_out and op.inputs:
            src, dst = op.inputs[0], op.outputs[0]
            if op.name == "RESHAPE" or op.name in ("SQUEEZE", "EXPAND_DIMS"):
                identity = sg.tensors[src].shape == sg.tensors[dst].shape and dst not in unfixed
            elif op.name == "CONCATENATION":
                identity = len(op.inputs) == 1
            elif op.name in ("PAD", "PADV2"):
                p = _paddings(op, consts)
                identity = p is not None and not p.any()
        if identity:
            steps = _remap(steps[:i] + steps[i + 1:], op.outputs[0], op.inputs[0])
            dropped += 1
            continue
        i += 1
    return steps, dropped


def padded_conv(pad, conv, consts: dict):
    """``conv`` reading ``pad``'s input with the PAD's zeros as its explicit padding (``ops.attributes
    .explicit_padding``), where ``pad`` is a PAD / PADV2 of zeros of the spatial axes alone (constant paddings, none
    negative) and ``conv`` a CONV_2D / DEPTHWISE_CONV_2D reading its output as its input only; else None. (Not
    pooling: AVERAGE_POOL_2D must count explicit zeros, not skip them.)"""
    if pad.name not in ("PAD", "PADV2") or conv.name not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return None
    p = _paddings(pad, consts)
    if p is None or len(p) != 4 or p[0].any() or p[3].any() or (p < 0).any():
        return None
    if conv.inputs[0] != pad.outputs[0] or pad.outputs[0] in conv.inputs[1:]:
        return None
    explicit = (int(p[1][0]), int(p[1][1]), int(p[2][0]), int(p[2][1]))
    return replace(conv, inputs=(pad.inputs[0],) + conv.inputs[1:],
                   options={**conv.options, "explicit_padding": explicit})


def clamp_merged(producer, act):
    """``producer`` writing ``act``'s output with ``act``'s clamp as its fused activation, where ``act`` is a RELU /
    RELU_N1_TO_1 / RELU6 reading ``producer``'s only output and ``producer`` an op whose fused activation clamps its
    output (``ops.traits``' clamps_output) and clamps nothing yet; else None. (TFLite's converter fuses these
    itself; MediaPipe's models keep a RELU after each residual ADD.)"""
    code = ACTIVATION_CODES.get(act.name)
    if (code is None or not traits(producer.name).clamps_output or len(producer.outputs) != 1
            or producer.options.get("fused_activation_function", 0) or act.inputs[:1] != producer.outputs):
        return None
    return replace(producer, outputs=act.outputs, options={**producer.options, "fused_activation_function": code})


def merge_pad(steps: list[PassStep], sg, consts: dict) -> tuple[list[PassStep], int]:
    def pair(i: int, s: PassStep, view: _Pairing):
        op = s.op
        if not (s.gpu and len(s.members) == 1 and op.name in ("PAD", "PADV2") and op.outputs[0] not in view.graph_out):
            return None
        rs = view.readers.get(op.outputs[0], [])
        if len(rs) != 1:
            return None
        j = rs[0]
        conv = view.steps[j]
        new_op = padded_conv(op, conv.op, consts) if conv.gpu and len(conv.members) == 1 else None
        if new_op is None:
            return None
        return j, [i], PassStep(new_op, s.members + conv.members, [], True)  # runs at j: PAD's input exists by then

    return _merge_pairs(steps, sg, pair)


@dataclass
class _Pairing:
    """What a pass merging a step with a step reading its output sees as it goes (``_merge_pairs``): the steps (merged
    ones in place), each tensor's reading steps, the graph's outputs, and the steps merged away so far."""

    steps: list[PassStep]
    readers: dict[int, list[int]]
    graph_out: set[int]
    drop: set[int]


def _merge_pairs(steps: list[PassStep], sg, pair) -> tuple[list[PassStep], int]:
    """The frame of the passes that merge steps: ``pair(i, step, view)`` returns None, or (where the merged step goes,
    the steps that go away, the merged step); returns the steps and how many went away."""
    view = _Pairing(list(steps), _readers(steps), set(sg.outputs), set())
    for i, s in enumerate(view.steps):
        found = None if i in view.drop else pair(i, s, view)
        if found is not None:
            at, gone, merged = found
            view.steps[at] = merged
            view.drop.update(gone)
    return [s for k, s in enumerate(view.steps) if k not in view.drop], len(view.drop)


def _only_reader(view: _Pairing, t: int) -> tuple[int, PassStep] | None:
    """The step reading tensor ``t`` where it is the only one (and not merged away), and ``t`` is no graph output:
    its index and itself; else None."""
    rs = view.readers.get(t, [])
    if t in view.graph_out or len(rs) != 1 or rs[0] in view.drop:
        return None
    return rs[0], view.steps[rs[0]]


def _one_conv(s: PassStep) -> bool:
    """The step is one op, or one conv with the PAD before it merged in as its explicit padding (``merge_pad``: an
    exported model's PAD -> VALID conv, which reads its input through the padding in one kernel all the same)."""
    return len(s.members) == 1 or (len(s.members) == 2 and s.members[0][0].name in ("PAD", "PADV2")
                                   and "explicit_padding" in s.op.options)


def _lone_reader(view: _Pairing, t: int) -> tuple[int, PassStep] | None:
    """The step reading tensor ``t`` where it is the only one (and not merged away): its index and itself, where it
    is one device op with no fused ops after it; else None."""
    rs = view.readers.get(t, [])
    if len(rs) != 1 or rs[0] in view.drop:
        return None
    nxt = view.steps[rs[0]]
    return (rs[0], nxt) if nxt.gpu and len(nxt.members) == 1 and not nxt.epilogue else None


def _no_activation(op) -> bool:
    """``op`` clamps nothing after it (no fused activation function)."""
    return op.options.get("fused_activation_function", 0) == 0


def _input_only(s: PassStep, t: int) -> bool:
    """Step ``s`` reads tensor ``t`` as its op's first input and nowhere else: not as another input, nor in an op
    fused after it (a residual ADD of the conv's own input): a pass that folds t's producer into s, so that t is
    never stored, leaves nothing reading it."""
    return (s.op.inputs[:1] == (t,) and t not in s.op.inputs[1:]
            and not any(t in f.op.inputs or f.other_tensor == t for f in s.epilogue))


@dataclass(frozen=True)
class _Between:
    """The device steps of unary elementwise ops (a quantized model's QUANT_SIM, a RELU left as an op of its own; with
    the unary ops fused after them) between a merged pair's two ops (``_unary_chain``), as (index, step), and the
    tensor the last one writes (the first op's output where there is none)."""

    steps: tuple[tuple[int, PassStep], ...]
    out: int

    @property
    def fused(self) -> tuple[Fused, ...]:
        """Their ops, in order, as Fused: the merged op's ``BETWEEN``."""
        return tuple(f for _, c in self.steps for f in (Fused(c.op), *c.epilogue))

    @property
    def members(self) -> list:
        return [m for _, c in self.steps for m in c.members]

    @property
    def gone(self) -> list[int]:
        return [k for k, _ in self.steps]


def _unary_chain(view: _Pairing, t: int, sg, consts: dict) -> _Between:
    """The unary steps from tensor ``t`` on, each the lone reader of the one before, none a graph output, all float."""
    chain = []
    while True:
        rs = view.readers.get(t, [])
        if len(rs) != 1 or rs[0] in view.drop:
            break
        j, s = rs[0], view.steps[rs[0]]
        f = _fusable(s.op, t, sg, consts)
        if not (s.gpu and f is not None and _unary(f) and len(s.op.inputs) == 1 and len(s.op.outputs) == 1
                and len(s.members) == 1 + len(s.epilogue) and all(_unary(e) for e in s.epilogue)
                and s.outputs[0] not in view.graph_out and sg.tensors[s.outputs[0]].dtype == np.float32):
            break
        chain.append((j, s))
        t = s.outputs[0]
    return _Between(tuple(chain), t)


def _bias(op) -> int:
    """A conv's bias input (-1: none)."""
    return op.inputs[2] if len(op.inputs) > 2 else -1


def fuse_separable(steps: list[PassStep], sg, consts: dict, allowed=lambda dw, pw: True) -> tuple[list[PassStep], int]:
    """Merge each device DEPTHWISE_CONV_2D whose only reader is a device pointwise CONV_2D into one
    ``SEPARABLE_CONV`` step at the pointwise conv's place (``allowed(dw_op, pw_op)``: the caller's veto, e.g.
    two ops of different storage precision)."""
    return _merge_conv_pairs(steps, sg, consts, SEPARABLE_CONV, ("depthwise", "pointwise"),
                             lambda dw: dw.name == "DEPTHWISE_CONV_2D" and _separable_depthwise(dw, sg, consts),
                             lambda dw, pw: pw.name == "CONV_2D" and _pointwise(pw, sg, consts) and allowed(dw, pw))


def fuse_expand_depthwise(steps: list[PassStep], sg, consts: dict, allowed=lambda ex, dw: True,
                          ) -> tuple[list[PassStep], int]:
    """Merge each device pointwise CONV_2D whose only reader is a device DEPTHWISE_CONV_2D (channel multiplier 1)
    into one ``EXPAND_DEPTHWISE`` step at the depthwise conv's place (``allowed(conv_op, dw_op)``: the caller's
    veto)."""
    return _merge_conv_pairs(steps, sg, consts, EXPAND_DEPTHWISE, ("expand", "depthwise"),
                             lambda ex: ex.name == "CONV_2D" and _pointwise(ex, sg, consts),
                             lambda ex, dw: (dw.name == "DEPTHWISE_CONV_2D" and len(dw.outputs) == 1
                                             and _separable_depthwise(dw, sg, consts) and allowed(ex, dw)))


def _merge_conv_pairs(steps: list[PassStep], sg, consts: dict, name: str, keys: tuple[str, str], first, second,
                      ) -> tuple[list[PassStep], int]:
    """The frame of fuse_separable and fuse_expand_depthwise: each device conv step (one op, or one conv with its
    merged PAD: ``_one_conv``; ``first(op)``, no fused ops after it, its one output no graph output) whose output
    is read only by a device conv step (one op, ``second(first_op, op)``, reading it as its input alone, no fused
    ops after it), directly or through unary elementwise steps (``_unary_chain``: a quantized model's QUANT_SIM
    between them), becomes one op ``name`` at the second's place: inputs (the first's input, filter and bias, the
    second's filter and bias), the second's outputs, index and options, the two ops under ``keys`` and the unary ops
    between them under ``BETWEEN`` (as Fused: the first conv's epilogue in its unfused form, applied to its values in
    the fused kernel)."""

    def pair(i: int, s: PassStep, view: _Pairing):
        a = s.op
        if not (s.gpu and _one_conv(s) and not s.epilogue and len(a.outputs) == 1
                and a.outputs[0] not in view.graph_out and first(a)):
            return None
        between = _unary_chain(view, a.outputs[0], sg, consts)
        t = between.out
        found = _lone_reader(view, t)
        if found is None:
            return None
        j, nxt = found
        b = nxt.op
        if not (_input_only(nxt, t) and second(a, b)):
            return None
        op = replace(b, name=name, builtin_code=-1, inputs=(a.inputs[0], a.inputs[1], _bias(a), b.inputs[1], _bias(b)),
                     options={**b.options, keys[0]: a, keys[1]: b, BETWEEN: between.fused})
        return j, [i, *between.gone], PassStep(op, s.members + between.members + nxt.members, [], True)

    return _merge_pairs(steps, sg, pair)


def fuse_expansions(steps: list[PassStep], sg, consts: dict, allowed=lambda sep, ex: True,
                    fused_start: bool = True) -> tuple[list[PassStep], int]:
    """Merge each device ``SEPARABLE_CONV`` step with a device pointwise CONV_2D (no epilogue) reading its output
    into one ``SEPARABLE_EXPAND`` step at the separable conv's place (the expansion reads nothing else);
    ``allowed(sep_op, conv_op)``: the caller's veto; ``fused_start``: whether its kernel starts fused (an option
    of the merged op, kernels.separable_expand), else as the two ops' own kernels."""

    def pair(i: int, s: PassStep, view: _Pairing):
        if not (s.gpu and s.op.name == SEPARABLE_CONV and len(s.outputs) == 1):
            return None
        (t,) = s.outputs
        rs = list(dict.fromkeys(view.readers.get(t, [])))
        j = next((j for j in rs if j > i and j not in view.drop and _expands(view.steps[j], t, sg, consts)
                  and allowed(s.op, view.steps[j].op)), None)
        if j is None:
            return None
        ex = view.steps[j].op
        bias = _bias(ex)
        keep = t in view.graph_out or any(k != j for k in rs)
        op = replace(s.op, name=SEPARABLE_EXPAND, builtin_code=-1, inputs=s.op.inputs + (ex.inputs[1], bias),
                     outputs=ex.outputs, options={"separable": s.op, "expand": ex, "keep": keep,
                                                     "fused_start": fused_start})
        return i, [j], PassStep(op, s.members + view.steps[j].members, s.epilogue, True)

    return _merge_pairs(steps, sg, pair)


def fuse_pooled_dense(steps: list[PassStep], sg, consts: dict, allowed=lambda mean, dense: True,
                      ) -> tuple[list[PassStep], int]:
    """Merge each device spatial mean of a 4-D float tensor (``_global_mean``; no fused ops after it) whose only reader
    is a device FULLY_CONNECTED or pointwise CONV_2D of it, directly or through unary elementwise steps
    (``_unary_chain``: a quantized model's QUANT_SIM, kept under ``BETWEEN``), into one ``POOLED_DENSE`` step at the
    dense op's place (it keeps the dense op's fused ops); ``allowed(mean_op, dense_op)``: the caller's veto."""

    def pair(i: int, s: PassStep, view: _Pairing):
        op = s.op
        if not (s.gpu and len(s.members) == 1 and not s.epilogue and len(op.outputs) == 1
                and op.outputs[0] not in view.graph_out and _global_mean(op, sg, consts)):
            return None
        between = _unary_chain(view, op.outputs[0], sg, consts)
        t = between.out
        rs = list(dict.fromkeys(view.readers.get(t, [])))
        if len(rs) != 1 or rs[0] in view.drop:
            return None
        j = rs[0]
        nxt = view.steps[j]
        dense = nxt.op
        if not (nxt.gpu and len(nxt.members) == 1 + len(nxt.epilogue) and _input_only(nxt, t)
                and len(dense.outputs) == 1 and sg.tensors[t].dtype == np.float32
                and allowed(op, dense) and _dense_of(dense, sg, consts)):
            return None
        bias = _bias(dense)
        merged = replace(dense, name=POOLED_DENSE, builtin_code=-1, inputs=(op.inputs[0], dense.inputs[1], bias),
                         options={**dense.options, "mean": op, "dense": dense, BETWEEN: between.fused})
        return j, [i, *between.gone], PassStep(merged, s.members + between.members + nxt.members, nxt.epilogue, True)

    return _merge_pairs(steps, sg, pair)


def fuse_gates(steps: list[PassStep], sg, consts: dict, allowed=lambda first, second: True,
               ) -> tuple[list[PassStep], int]:
    """Merge each squeeze-and-excitation gate into one ``GATE`` step at its last op's place: a device spatial mean
    (``_global_mean``: a MEAN, or an AVERAGE_POOL_2D whose window is the whole image; no fused ops after it) read
    only by a device dense op (``_dense_of``) whose fused ops are unary (its activation, a RELU), whose output is
    read only by a second device dense op (any fused ops: a LOGISTIC, a hard sigmoid's chain). The MUL applying the
    gate stays its own step. ``allowed(first_op, second_op)``: the caller's veto, asked of each pair in turn."""

    def lone(t: int, view: _Pairing) -> tuple[int, PassStep] | None:
        rs = list(dict.fromkeys(view.readers.get(t, [])))
        if len(rs) != 1 or rs[0] in view.drop or t in view.graph_out or sg.tensors[t].dtype != np.float32:
            return None
        s = view.steps[rs[0]]
        ok = (s.gpu and len(s.members) == 1 + len(s.epilogue) and _input_only(s, t)
              and len(s.op.outputs) == 1 and _dense_of(s.op, sg, consts))
        return (rs[0], s) if ok else None

    def pair(i: int, s: PassStep, view: _Pairing):
        op = s.op
        if not (s.gpu and len(s.members) == 1 and not s.epilogue and len(op.outputs) == 1
                and _global_mean(op, sg, consts)):
            return None
        first = lone(op.outputs[0], view)
        if first is None or not all(_unary(f) for f in first[1].epilogue) or not allowed(op, first[1].op):
            return None
        second = lone(first[1].outputs[0], view)
        if second is None or not allowed(first[1].op, second[1].op):
            return None
        (k, hidden), (j, gate) = first, second
        merged = replace(gate.op, name=GATE, builtin_code=-1,
                         inputs=(op.inputs[0], hidden.op.inputs[1], _bias(hidden.op), gate.op.inputs[1],
                                 _bias(gate.op)),
                         options={**gate.op.options, "mean": op, "hidden": hidden.op, "dense": gate.op,
                                  HIDDEN_FUSED: tuple(hidden.epilogue)})
        return j, [i, k], PassStep(merged, s.members + hidden.members + gate.members, gate.epilogue, True)

    return _merge_pairs(steps, sg, pair)


def fold_gate_scales(steps: list[PassStep], sg, consts: dict, allowed=lambda mul, conv: True,
                     ) -> tuple[list[PassStep], int]:
    """Merge each device MUL of a 4-D float tensor x by a per-image, per-channel gate g ([batch, 1, 1, channels]:
    a squeeze-and-excitation gate's; no fused activation, no fused ops after it), whose output only a device
    CONV_2D reads (as its input alone), into that conv's step: the conv reads x and multiplies each input slice it
    loads by g's (its ``INPUT_SCALE``; kernels.conv's direct kernel and group tile). Zero padding commutes with the
    scale, so any window does. ``allowed(mul_op, conv_op)``: the caller's veto."""

    def pair(i: int, s: PassStep, view: _Pairing):
        op = s.op
        if not (s.gpu and len(s.members) == 1 and not s.epilogue and op.name == "MUL" and len(op.inputs) == 2
                and len(op.outputs) == 1 and _no_activation(op)
                and all(t >= 0 and t not in consts for t in op.inputs) and _float4d(sg, *op.inputs, op.outputs[0])):
            return None
        shapes = [sg.tensors[t].shape for t in op.inputs]
        out = sg.tensors[op.outputs[0]].shape
        x, g = op.inputs if shapes[0] == out else op.inputs[::-1]
        if sg.tensors[x].shape != out or sg.tensors[g].shape != (out[0], 1, 1, out[3]) or x == g:
            return None
        t = op.outputs[0]
        rs = list(dict.fromkeys(view.readers.get(t, [])))
        if len(rs) != 1 or rs[0] in view.drop or t in view.graph_out:
            return None
        j, nxt = rs[0], view.steps[rs[0]]
        conv = nxt.op
        if not (nxt.gpu and conv.name == "CONV_2D" and len(nxt.members) == 1 + len(nxt.epilogue)
                and _input_only(nxt, t) and PROLOGUE not in conv.options
                and INPUT_SCALE not in conv.options and allowed(op, conv)):
            return None
        merged = replace(conv, inputs=(x,) + conv.inputs[1:], options={**conv.options, INPUT_SCALE: g})
        return j, [i], PassStep(merged, s.members + nxt.members, nxt.epilogue, True)

    return _merge_pairs(steps, sg, pair)


def _global_mean(op, sg, consts: dict) -> bool:
    """A mean of each channel over a 4-D float tensor's whole image: a MEAN over the spatial axes, or an
    AVERAGE_POOL_2D with no fused activation whose window is the image (one output pixel: no padding counts)."""
    if op.name == "MEAN":
        return len(op.inputs) == 2 and _float4d(sg, op.inputs[0]) and _spatial_axes(consts.get(op.inputs[1]))
    if op.name != "AVERAGE_POOL_2D" or not _float4d(sg, op.inputs[0], op.outputs[0]):
        return False
    _, h, w, _ = sg.tensors[op.inputs[0]].shape
    o = op.options
    return (sg.tensors[op.outputs[0]].shape[1:3] == (1, 1) and (o.get("filter_height"), o.get("filter_width")) == (h, w)
            and _no_activation(op))


def fuse_input_prologue(steps: list[PassStep], sg, consts: dict, allowed=lambda first, conv: True,
                        ) -> tuple[list[PassStep], int]:
    """Merge the unary elementwise steps (``_unary_chain``) from a 4-D float32 graph input whose last one is read
    only by a device CONV_2D (as its input alone) into that conv's step: the conv op reads the graph input, and
    its option ``PROLOGUE`` holds the steps' ops as Fused, in order (the CPU runs the members as before);
    ``allowed(first_unary_op, conv_op)``: the caller's veto."""

    def pair(i: int, s: PassStep, view: _Pairing):
        x = s.op.inputs[0] if s.op.inputs else -1
        if x not in sg.inputs or view.readers.get(x) != [i] or not _float4d(sg, x):
            return None
        between = _unary_chain(view, x, sg, consts)  # (x's one reader is step i: the chain starts there, or is empty)
        if not between.steps:
            return None
        t = between.out
        rs = view.readers.get(t, [])
        if len(rs) != 1 or rs[0] in view.drop:
            return None
        j, nxt = rs[0], view.steps[rs[0]]
        conv = nxt.op
        if not (nxt.gpu and conv.name == "CONV_2D" and len(nxt.members) == 1 + len(nxt.epilogue)
                and _input_only(nxt, t) and PROLOGUE not in conv.options and allowed(s.op, conv)):
            return None
        op = replace(conv, inputs=(x,) + conv.inputs[1:], options={**conv.options, PROLOGUE: between.fused})
        return j, between.gone, PassStep(op, between.members + nxt.members, nxt.epilogue, True)

    return _merge_pairs(steps, sg, pair)


def merge_sibling_convs(steps: list[PassStep], sg, consts: dict, allowed=lambda first, other: True,
                        ) -> tuple[list[PassStep], int]:
    """Merge the device pointwise CONV_2D steps (one op, no fused ops after it) that read one tensor with one fused
    activation into one ``SIBLING_CONVS`` step at the first one's place (where that tensor exists and before any
    reader of their outputs); ``allowed(first_conv, other_conv)``: the caller's veto. Returns the steps and how many
    went into another."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(steps):
        op = s.op
        if s.gpu and len(s.members) == 1 and not s.epilogue and op.name == "CONV_2D" and _pointwise(op, sg, consts):
            groups.setdefault((op.inputs[0], op.options.get("fused_activation_function", 0)), []).append(i)
    out, gone = list(steps), set()
    for (x, act), found in groups.items():
        at = found[0]
        group = [at] + [i for i in found[1:] if allowed(steps[at].op, steps[i].op)]
        if len(group) < 2:
            continue
        convs = tuple(steps[i].op for i in group)
        op = replace(convs[0], name=SIBLING_CONVS, builtin_code=-1,
                     inputs=(x,) + tuple(t for c in convs for t in (c.inputs[1], _bias(c))),
                     outputs=tuple(c.outputs[0] for c in convs),
                     options={"convs": convs, "fused_activation_function": act})
        out[at] = PassStep(op, [m for i in group for m in steps[i].members], [], True)
        gone.update(group[1:])
    return [s for k, s in enumerate(out) if k not in gone], len(gone)


def _unary(f: Fused) -> bool:
    """A fused op with no operand of its own."""
    return f.other_tensor is None and f.other_const is None


def _dense_of(op, sg, consts: dict) -> bool:
    """A pointwise CONV_2D, or a FULLY_CONNECTED with constant weights and bias."""
    if op.name == "CONV_2D":
        return _pointwise(op, sg, consts)
    return (op.name == "FULLY_CONNECTED" and len(op.inputs) > 1 and op.inputs[1] in consts
            and (len(op.inputs) < 3 or op.inputs[2] < 0 or op.inputs[2] in consts))


def _spatial_axes(axes) -> bool:
    return axes is not None and sorted({int(a) % 4 for a in np.asarray(axes).reshape(-1)}) == [1, 2]


def _expands(step: PassStep, t: int, sg, consts: dict) -> bool:
    """Whether ``step`` is one device pointwise CONV_2D of tensor ``t`` with no fused ops after it."""
    op = step.op
    return (step.gpu and len(step.members) == 1 and not step.epilogue and op.name == "CONV_2D"
            and op.inputs[:1] == (t,) and t not in op.inputs[1:] and _pointwise(op, sg, consts))


def _float4d(sg, *tensors: int) -> bool:
    return all(t >= 0 and sg.tensors[t].dtype == np.float32 and len(sg.tensors[t].shape) == 4 for t in tensors)


def _separable_depthwise(op, sg, consts: dict) -> bool:
    """A float depthwise conv of channel multiplier 1 with constant filter and bias."""
    if len(op.inputs) < 2 or not _float4d(sg, op.inputs[0], op.inputs[1], op.outputs[0]):
        return False
    w = sg.tensors[op.inputs[1]].shape
    bias_ok = len(op.inputs) < 3 or op.inputs[2] < 0 or op.inputs[2] in consts
    return op.inputs[1] in consts and bias_ok and w[0] == 1 and w[3] == sg.tensors[op.inputs[0]].shape[3]


def _pointwise(op, sg, consts: dict) -> bool:
    """A float 1x1, stride-1, unpadded CONV_2D with constant filter and bias."""
    if len(op.inputs) < 2 or not _float4d(sg, op.inputs[0], op.inputs[1], op.outputs[0]) or len(op.outputs) != 1:
        return False
    o = op.options
    bias_ok = len(op.inputs) < 3 or op.inputs[2] < 0 or op.inputs[2] in consts
    return (op.inputs[1] in consts and bias_ok and sg.tensors[op.inputs[1]].shape[1:3] == (1, 1)
            and o.get("stride_h", 1) == o.get("stride_w", 1) == 1 and not any(o.get("explicit_padding", ()))
            and sg.tensors[op.inputs[1]].shape[3] == sg.tensors[op.inputs[0]].shape[3])


def fold_reshapes(steps: list[PassStep], sg, consts: dict, allowed=lambda reshape, concat: True,
                  ) -> tuple[list[PassStep], int]:
    """Each device CONCATENATION (no fused ops after it) some of whose inputs are made by device reshapes
    (RESHAPE / SQUEEZE / EXPAND_DIMS, one op, no fused ops, their output read by nothing else and no graph output,
    their input a float tensor the plan makes; not one keeping the slice layout's order, which the plan links:
    no launch, as its concatenation's where that is linked too) becomes one ``CONCAT_VIEWS`` op reading those reshapes' inputs
    through their shapes (an SSD head's box and class convs, reshaped to rows and concatenated: their launches go);
    the reshapes run before it on the CPU path; ``allowed(reshape_op, concat_op)``: the caller's veto. Returns the
    steps and how many reshapes went."""
    producer = {t: i for i, s in enumerate(steps) for op, _ in s.members for t in op.outputs if t >= 0}

    def folds(t: int, i: int, concat, view: _Pairing) -> int | None:
        """The index of the reshape step whose output ``t`` concatenation step ``i`` folds, else None."""
        j = producer.get(t)
        r = view.steps[j] if j is not None and j not in view.drop else None
        if r is None or not (r.gpu and traits(r.op.name).reshapes and len(r.members) == 1 and not r.epilogue
                             and r.op.outputs == (t,) and view.readers.get(t) == [i] and t not in view.graph_out):
            return None
        x = r.op.inputs[0]
        ok = (x >= 0 and x not in consts and sg.tensors[x].dtype == np.float32 and sg.tensors[t].dtype == np.float32
              and len(sg.tensors[x].shape) <= 4 and not moves_in_place(r.op, sg, consts) and allowed(r.op, concat))
        return j if ok else None

    def pair(i: int, s: PassStep, view: _Pairing):
        op = s.op
        if not (s.gpu and op.name == "CONCATENATION" and len(s.members) == 1 and not s.epilogue
                and len(op.outputs) == 1 and len(set(op.inputs)) == len(op.inputs)):
            return None
        made = [folds(t, i, op, view) for t in op.inputs]
        folded = sorted(j for j in made if j is not None)
        if not folded:
            return None
        inputs = tuple(t if j is None else view.steps[j].op.inputs[0] for t, j in zip(op.inputs, made))
        views = tuple(None if j is None else tuple(sg.tensors[t].shape) for t, j in zip(op.inputs, made))
        merged = replace(op, name=CONCAT_VIEWS, builtin_code=-1, inputs=inputs, options={**op.options, "views": views})
        return i, folded, PassStep(merged, [m for j in folded for m in view.steps[j].members] + s.members, [], True)

    return _merge_pairs(steps, sg, pair)


def fold_tensordot(steps: list[PassStep], sg, consts: dict) -> tuple[list[PassStep], int]:
    """A FULLY_CONNECTED between two reshapes that only flatten its input's leading dims to rows and restore them
    (TensorFlow's Tensordot, a Keras Dense over a rank-3 / 4 input as older converters write it: [..., C] -> [N, C]
    -> FC -> [N, K] -> [..., K]) becomes the FULLY_CONNECTED with keep_num_dims on the unreshaped input: one op
    where there were three, and no layout-changing copies (BirdNET 2.4's spectrogram rows, 1.0-1.3 ms each on the
    Intel CPU device). All three on the device, each read only by the next, no fused ops; the CPU path runs the
    three. Returns the steps and how many went."""
    def pair(i: int, s: PassStep, view: _Pairing):
        if not (s.gpu and traits(s.op.name).reshapes and len(s.members) == 1 and not s.epilogue
                and len(s.op.outputs) == 1 and s.op.inputs and s.op.inputs[0] >= 0):
            return None
        x, rows = s.op.inputs[0], s.op.outputs[0]
        fc = _lone_reader(view, rows) if rows not in view.graph_out else None
        if fc is None or fc[1].op.name != "FULLY_CONNECTED" or fc[1].op.options.get("keep_num_dims") \
                or fc[1].op.inputs[0] != rows or len(fc[1].op.outputs) != 1:
            return None
        j, f = fc
        out = f.op.outputs[0]
        back = _lone_reader(view, out) if out not in view.graph_out else None
        if back is None or not traits(back[1].op.name).reshapes or back[1].op.inputs[0] != out:
            return None
        k, r = back
        xs, ys = tuple(sg.tensors[x].shape), tuple(sg.tensors[r.op.outputs[0]].shape)
        n = sg.tensors[out].shape
        if not (2 <= len(xs) <= 4 and sg.tensors[x].dtype == np.float32 and x not in consts
                and tuple(sg.tensors[rows].shape) == (int(np.prod(xs[:-1])), xs[-1])
                and len(n) == 2 and ys == xs[:-1] + (n[1],)):
            return None
        merged = replace(f.op, inputs=(x, *f.op.inputs[1:]), outputs=r.op.outputs,
                         options={**f.op.options, "keep_num_dims": True})
        return k, [i, j], PassStep(merged, s.members + f.members + r.members, [], True)

    return _merge_pairs(steps, sg, pair)


def _last_axis_mean(op, sg, consts: dict) -> bool:
    """A MEAN of a float tensor over its last axis alone, the axis kept (a layer norm's)."""
    if op.name != "MEAN" or len(op.inputs) != 2 or not op.options.get("keep_dims", False):
        return False
    x, axes = sg.tensors[op.inputs[0]], consts.get(op.inputs[1])
    rank = len(x.shape)
    return (x.dtype == np.float32 and rank >= 2 and axes is not None and axes.size == 1
            and int(axes.reshape(-1)[0]) % rank == rank - 1)


def fuse_layer_norms(steps: list[PassStep], sg, consts: dict, allowed=lambda ops: True,
                     ) -> tuple[list[PassStep], int]:
    """Merge each layer normalization as converters from ONNX write it, ``m = MEAN(x)``, ``d = SUB(x, m)``,
    ``MEAN(MUL(d, d))``, ``ADD`` of a constant epsilon, ``RSQRT``, ``MUL(d, that)`` (means over the last axis,
    kept; no fused activations), into one ``LAYER_NORM`` step at the last MUL's place: one kernel takes each row's
    mean, then its variance, then writes the normalized row (kernels.pool's row form), where the ops took seven
    launches. Every tensor between them is read by the chain alone and is no graph output; the scale and shift
    after it join it in ``fuse_elementwise``. ``allowed(ops)``: the caller's veto (their storage precisions)."""

    def only(view: _Pairing, t: int, name: str) -> tuple[int, PassStep] | None:
        """The lone reader of ``t`` (no graph output; ``_lone_reader``), where it is a ``name`` op with no fused
        activation."""
        found = _lone_reader(view, t) if t not in view.graph_out else None
        return found if found is not None and found[1].op.name == name and _no_activation(found[1].op) else None

    def pair(i: int, s: PassStep, view: _Pairing):
        if not (s.gpu and len(s.members) == 1 and not s.epilogue and _last_axis_mean(s.op, sg, consts)):
            return None
        x, m = s.op.inputs[0], s.op.outputs[0]
        sub = only(view, m, "SUB")
        if sub is None or sub[1].op.inputs != (x, m):
            return None
        d = sub[1].op.outputs[0]
        rs = set(view.readers.get(d, []))  # (the square reads d twice, the normalizing MUL once)
        square = next((j for j in rs if j not in view.drop and view.steps[j].op.name == "MUL"
                       and view.steps[j].op.inputs == (d, d)), None)
        if d in view.graph_out or len(rs) != 2 or square is None:
            return None
        sq = view.steps[square]
        if not (sq.gpu and len(sq.members) == 1 and not sq.epilogue and _no_activation(sq.op)):
            return None
        mean2 = only(view, sq.op.outputs[0], "MEAN")
        if mean2 is None or not _last_axis_mean(mean2[1].op, sg, consts):
            return None
        v = mean2[1].op.outputs[0]
        add = only(view, v, "ADD")
        others = [t for t in add[1].op.inputs if t != v] if add is not None else []
        eps = consts.get(others[0]) if len(others) == 1 else None
        if eps is None or eps.size != 1 or eps.dtype != np.float32:
            return None
        rsqrt = only(view, add[1].op.outputs[0], "RSQRT")
        r = rsqrt[1].op.outputs[0] if rsqrt is not None else None
        norm = only(view, r, "MUL") if r is not None else None
        if norm is None or set(norm[1].op.inputs) != {d, r} or norm[0] not in rs \
                or sg.tensors[norm[1].op.outputs[0]].shape != sg.tensors[x].shape:
            return None
        found = [i, sub[0], square, mean2[0], add[0], rsqrt[0], norm[0]]
        if not allowed([view.steps[k].op for k in found]):
            return None
        last = norm[1].op
        op = replace(last, name=LAYER_NORM, builtin_code=-1, inputs=(x,), outputs=last.outputs,
                     options={"epsilon": float(eps.reshape(-1)[0])})
        return norm[0], found[:-1], PassStep(op, [mb for k in sorted(found) for mb in view.steps[k].members], [], True)

    out, gone = _merge_pairs(steps, sg, pair)
    return out, gone // 6 * 7  # (each layer norm's seven ops: six merged away into the last one's step)


def fold_moves(steps: list[PassStep], sg, consts: dict, allowed=lambda ops: True) -> tuple[list[PassStep], int]:
    """Merge each device move with no fused ops whose output only another such move reads (and is no graph output)
    into one ``MOVES`` step at the reader's place, as long as its chain has at most ``MAX_MOVES`` ops, each of which
    launches a kernel of its own: not one that ``moves_in_place``, which the plan links (launching nothing; read
    through, it would only add index arithmetic to the kernel after it), except between two that launch (a
    TRANSPOSE, an EXPAND_DIMS and a TRANSPOSE, as ONNX converters write them: one launch saved, and none at all
    where the chain keeps every value in its place, which the plan then links too: ``moves_in_place``). Its first
    op reads no graph input (a reshape of one reads its dense buffer: kernels.reindex.reshape). ``allowed(ops)``:
    the caller's veto (their storage precisions)."""

    def chain(step: PassStep) -> tuple:
        return step.op.options["chain"] if step.op.name == MOVES else (step.op,)

    def linked(step: PassStep, t: int) -> bool:  # (an in-place move reading t, which the plan would link)
        op = step.op
        return (step.gpu and not step.epilogue and len(step.members) == 1 and len(op.outputs) == 1
                and op.inputs[:1] == (t,) and traits(op.name).maps_indices and moves_in_place(op, sg, consts))

    def movable(step: PassStep) -> bool:
        op = step.op
        if not step.gpu or step.epilogue or len(op.outputs) != 1:
            return False
        if op.name == MOVES:
            return True
        return (traits(op.name).maps_indices and len(step.members) == 1 and not moves_in_place(op, sg, consts)
                and (op.name != "GATHER" or consts.get(op.inputs[1]) is not None))

    def pair(i: int, s: PassStep, view: _Pairing):
        if not movable(s):
            return None
        t = s.op.outputs[0]
        found, between = _only_reader(view, t), []
        while found is not None and linked(found[1], t) and len(between) < MAX_MOVES:
            between.append(found)
            t = found[1].op.outputs[0]
            found = _only_reader(view, t)
        if found is None:
            return None
        j, c = found
        if not movable(c) or c.op.inputs[0] != t or t in c.op.inputs[1:]:
            return None
        ops = (*chain(s), *(b.op for _, b in between), *chain(c))
        if len(ops) > MAX_MOVES or ops[0].inputs[0] in sg.inputs or not allowed(list(ops)):
            return None
        merged = replace(c.op, name=MOVES, builtin_code=-1, inputs=(ops[0].inputs[0],), options={"chain": ops})
        members = s.members + [m for _, b in between for m in b.members] + c.members
        return j, [i, *(k for k, _ in between)], PassStep(merged, members, [], True)

    out, gone = _merge_pairs(steps, sg, pair)
    return out, gone + sum(s.op.name == MOVES for s in out)  # (every op of each chain)


def fuse_spectra(steps: list[PassStep], sg, consts: dict) -> tuple[list[PassStep], int]:
    """Merge each RFFT2D of one row a frame (a constant ``fft_length`` [1, N], N a power of two from 4: an STFT's
    frames, each its own 1-D transform) of a float32 input, the shape-only ops after it (SQUEEZE, RESHAPE,
    EXPAND_DIMS) and the op taking a float32 part of its complex values (``SPECTRUM_PARTS``) into one ``RFFT_PART``
    step at that op's place. Every complex tensor between them is read by the chain alone and is no graph output.
    The members are the chain's ops, so a device that cannot take the step runs them as before."""

    def pair(i: int, s: PassStep, view: _Pairing):
        op = s.op
        if op.name != "RFFT2D" or len(s.members) != 1 or s.epilogue or len(op.inputs) != 2:
            return None
        fft = consts.get(op.inputs[1])
        x = sg.tensors[op.inputs[0]]
        if fft is None or fft.size != 2 or x.dtype != np.float32 or len(x.shape) < 2:
            return None
        rows, n = (int(v) for v in fft.reshape(-1))
        if rows != 1 or n < 4 or n & (n - 1):
            return None
        chain, t = [i], op.outputs[0]
        while True:
            found = _only_reader(view, t)
            if found is None:
                return None
            j, nxt = found
            if len(nxt.members) != 1 or nxt.epilogue or not nxt.op.inputs or nxt.op.inputs[0] != t:
                return None
            chain.append(j)
            if traits(nxt.op.name).reshapes:
                t = nxt.op.outputs[0]
                continue
            part = SPECTRUM_PARTS.get(nxt.op.name)
            if part is None or len(nxt.op.outputs) != 1 or sg.tensors[nxt.op.outputs[0]].dtype != np.float32:
                return None
            break
        last = nxt.op
        merged = replace(last, name=RFFT_PART, builtin_code=-1, inputs=(op.inputs[0],),
                         options={"length": n, "part": part})
        return chain[-1], chain[:-1], PassStep(merged, [mb for k in chain for mb in view.steps[k].members], [], True)

    out, gone = _merge_pairs(steps, sg, pair)
    return out, gone + sum(s.op.name == RFFT_PART for s in out)  # (every op of each chain)


def model_ops(op) -> tuple:
    """The model's ops a step member stands for: itself, or those it merged (``MERGED``: a swish's two)."""
    return tuple(op.options.get(MERGED, ())) or (op,)


def _swish_fn(logistic, mul, x_first: bool):
    """A swish's CPU kernel (a member's function: input values -> output values): the LOGISTIC's, then the MUL's of
    x and that, in the model's operand order, so the CPU fallback computes what the two ops did."""

    def run(xs):
        (s,) = logistic([xs[0]])
        return mul([xs[0], s] if x_first else [s, xs[0]])

    return run


def fuse_swish(steps: list[PassStep], sg, consts: dict) -> tuple[list[PassStep], int]:
    """Merge each device LOGISTIC (no fused ops) of a float tensor x whose only reader is a device MUL of x and it
    (either order, no fused activation or ops) into one ``SWISH`` step at the MUL's place: the unary op
    x * sigmoid(x), computed as the two ops compute it (kernels.expressions), reading x once. x may have other
    readers. Its one member runs the two ops' CPU kernels in turn (``_swish_fn``), so the step is one op as every
    pass sees it. Returns the steps and how many ops merged (two a swish)."""

    def pair(i: int, s: PassStep, view: _Pairing):
        op = s.op
        if op.name != "LOGISTIC" or not s.gpu or len(s.members) != 1 or s.epilogue or len(op.inputs) != 1:
            return None
        x, y = op.inputs[0], op.outputs[0]
        found = _lone_reader(view, y) if y not in view.graph_out else None
        if found is None or sg.tensors[x].dtype != np.float32:
            return None
        j, mul = found
        if mul.op.name != "MUL" or set(mul.op.inputs) != {x, y} or len(mul.op.inputs) != 2 or not _no_activation(mul.op) \
                or tuple(sg.tensors[mul.op.outputs[0]].shape) != tuple(sg.tensors[x].shape):
            return None
        merged = replace(mul.op, name=SWISH, builtin_code=-1, inputs=(x,), options={MERGED: (op, mul.op)})
        return j, [i], PassStep(merged, [(merged, _swish_fn(s.members[0][1], mul.members[0][1],
                                                            mul.op.inputs[0] == x))], [], True)

    out, gone = _merge_pairs(steps, sg, pair)
    return out, 2 * gone


def fuse_elementwise(steps: list[PassStep], sg, consts: dict) -> tuple[list[PassStep], int]:
    graph_out = set(sg.outputs)
    fused = 0
    out: list[PassStep] = []
    absorbed: set[int] = set()
    readers = _readers(steps)
    producer = {t: i for i, s in enumerate(steps) for op, _ in s.members for t in op.outputs if t >= 0}

    def hoistable(m: int, t: int, reader: int, i: int) -> bool:
        """Step ``m`` (making ``t``, which step ``reader`` alone reads) can run before step ``i`` instead."""
        return m not in absorbed and readers.get(t) == [reader] and \
            _runs_earlier(steps[m], sg, lambda u: producer.get(u, -1) < i)

    def operand(f: Fused, i: int, j: int) -> tuple[Fused, list[int], int | None]:
        """``f`` (of step ``j``, joining step ``i``) as it reads its operand there, the steps it reads through
        (their launches go: a channel PAD, ``_channel_pad_input``, then a MAX_POOL under it, ``_pool_read``), and
        the step that moves before step ``i`` to make the operand in time (a BlazeBlock's MAX_POOL of its skip
        branch, after the conv in op order, where it is not read through), or None."""
        t, through = f.other_tensor, []
        k = producer.get(t) if t is not None else None
        for peel in ("pad", "pool"):
            if k is None or k == i or k in absorbed or readers.get(t) != [j] or (
                    k < i and not any(o is steps[k] for o in out)):
                break  # (the producer's own, or an earlier step that took fused ops of its own: not read through)
            if peel == "pad" and (x := _channel_pad_input(steps[k], sg, consts)) is not None:
                f = replace(f, other_tensor=x, other_channels=sg.tensors[x].shape[-1])
            elif peel == "pool" and (read := _pool_read(steps[k], sg)) is not None:
                x = steps[k].op.inputs[0]
                f = replace(f, other_tensor=x, other_pool=read)
            else:
                continue
            through.append(k)
            t, j, k = x, k, producer.get(x)
        if k is None or k < i or _channel_pad_input(steps[i], sg, consts) is not None:
            return f, through, None  # (a channel PAD's reader had better read through it than it take the op)
        return f, through, (k if k != i and hoistable(k, t, j, i) else None)

    for i, s in enumerate(steps):
        if i in absorbed:
            continue
        if s.gpu and traits(s.op.name).takes_epilogue and not moves_in_place(s.op, sg, consts):
            while True:
                (t,) = s.outputs[:1] or (None,)
                rs = readers.get(t, [])
                if t is None or t in graph_out or len(rs) != 1:
                    break
                j = rs[0]
                nxt = steps[j]
                if j in absorbed or not nxt.gpu or len(nxt.members) != 1 or nxt.epilogue:
                    break
                f = _fusable(nxt.op, t, sg, consts)
                f, through, hoisted = operand(f, i, j) if f is not None else (f, [], None)
                # the fused op runs at the producer's position: its other operand must exist by then
                if f is None or (f.other_tensor is not None and producer.get(f.other_tensor, -1) >= i
                                 and hoisted is None):
                    break
                members = s.members
                for k in reversed(through):  # (their ops join the step: the CPU runs them before the fused op)
                    out[:] = [o for o in out if o is not steps[k]]
                    members = members + steps[k].members
                    absorbed.add(k)
                    fused += 1
                if hoisted is not None:
                    out.append(steps[hoisted])
                    absorbed.add(hoisted)
                s = PassStep(s.op, members + nxt.members, s.epilogue + [f], True)
                absorbed.add(j)
                fused += 1
        out.append(s)
    return out, fused


def _runs_earlier(step: PassStep, sg, made: Callable[[int], bool]) -> bool:
    """``step`` may move before where it is, to a place where ``made(t)`` says which tensors exist: a device step
    of its own, nothing fused after it, no side effects, every tensor it reads made there (and none a variable,
    which a step between may assign)."""
    reads = [u for op, _ in step.members for u in op.inputs if u >= 0]
    return (step.gpu and not step.epilogue and not any(traits(op.name).side_effects for op, _ in step.members)
            and all(made(u) and not sg.tensors[u].is_variable for u in reads))


def _channel_pad_input(step: PassStep, sg, consts: dict) -> int | None:
    """The input of a device PAD / PADV2 step adding only zero channels after the last, of a batch-1 float tensor
    (nothing fused after it), or None: a fused op may read that input where it reads the PAD's output, the new
    channels as zeros (``Fused.other_channels``), and the PAD's launch goes (BlazeFace's residual blocks widen their
    skip branch so: face_detection_short_range has 11)."""
    op = step.op
    if not (step.gpu and op.name in ("PAD", "PADV2") and len(step.members) == 1 and not step.epilogue):
        return None
    p = _paddings(op, consts)
    x, y = sg.tensors[op.inputs[0]], sg.tensors[op.outputs[0]]
    if p is None or len(p) != len(x.shape) or p[:-1].any() or p[-1][0] or x.dtype != np.float32:
        return None
    xl, yl = bhwc(x.shape), bhwc(y.shape)
    if xl is None or yl is None or xl.dims[:3] != yl.dims[:3] or xl.dims[0] != 1:
        return None
    return op.inputs[0]


def _pool_read(step: PassStep, sg) -> PoolRead | None:
    """A device MAX_POOL_2D step of a batch-1 float tensor, VALID (padding 1), with no activation and nothing fused after it, as
    a fused op may read it (``Fused.other_pool``), or None."""
    op = step.op
    if not (step.gpu and op.name == "MAX_POOL_2D" and len(step.members) == 1 and not step.epilogue):
        return None
    o = op.options
    x, y = sg.tensors[op.inputs[0]], sg.tensors[op.outputs[0]]
    if o.get("padding", 0) != 1 or o.get("fused_activation_function", 0) or x.dtype != np.float32 \
            or len(x.shape) != 4 or x.shape[0] != 1 or len(y.shape) != 4 or y.shape[3] != x.shape[3]:
        return None
    return PoolRead((o["filter_height"], o["filter_width"]), (o["stride_h"], o["stride_w"]), tuple(x.shape[1:3]),
                    tuple(y.shape[1:3]))


def moves_in_place(op, sg, consts: dict) -> bool:
    """A move that changes only its tensor's shape, every value staying in its slice-layout place: a RESHAPE /
    SQUEEZE / EXPAND_DIMS, or a SLICE / STRIDED_SLICE taking every element in order (unit strides, as many
    elements out as in: (1, 1, 64) -> (1, 64)), between shapes the slice layout orders alike
    (``ops.layout.same_slice_order``). The plan links such a move (its output its input's buffer, no launch:
    runtime.selection.link_reshapes), so the elementwise ops after it keep their own kernel rather than make it
    one, and graph.sink does not swap one."""
    if len(op.outputs) != 1 or op.outputs[0] < 0 or not op.inputs:
        return False
    x, y = sg.tensors[op.inputs[0]], sg.tensors[op.outputs[0]]
    if op.name == MOVES:  # (fold_moves' chain, where its moves leave every value in its place: transposes undone)
        if not _keeps_order(op.options["chain"], sg, consts):
            return False
    elif op.name in ("SLICE", "STRIDED_SLICE"):
        if op.name == "STRIDED_SLICE":
            strides = consts.get(op.inputs[3]) if len(op.inputs) > 3 else None
            if strides is None or np.any(np.asarray(strides) != 1) or op.options.get("offset", False):
                return False
        if x.dtype != y.dtype or int(np.prod(x.shape)) != int(np.prod(y.shape)):
            return False
    elif not traits(op.name).reshapes:
        return False
    return same_slice_order(x.shape, y.shape)


ORDER_CHECKED = 1 << 20  # the values of a chain of moves _keeps_order follows at most (one int32 each)


def _keeps_order(chain, sg, consts: dict) -> bool:
    """Whether a chain of TRANSPOSEs and reshapes (RESHAPE, SQUEEZE, EXPAND_DIMS) leaves its input's values in their
    order (a row-major reshape of it), followed value by value: at most ``ORDER_CHECKED`` values."""
    def perm(op):  # (a TRANSPOSE's constant permutation, else None)
        if op.name == "TRANSPOSE" and len(op.inputs) > 1 and consts.get(op.inputs[1]) is not None:
            return np.asarray(consts[op.inputs[1]], np.int64).reshape(-1)
        return None

    shape = sg.tensors[chain[0].inputs[0]].shape
    n = int(np.prod(shape))
    if n > ORDER_CHECKED or not all(perm(op) is not None or traits(op.name).reshapes for op in chain):
        return False  # (no values followed where a move of the chain is no transpose or reshape: a framing's GATHER)
    at = np.arange(n, dtype=np.int32).reshape(shape)
    for op in chain:
        p = perm(op)
        at = at.transpose(p) if p is not None else at.reshape(sg.tensors[op.outputs[0]].shape)
    return bool(np.array_equal(at.reshape(-1), np.arange(n, dtype=np.int32)))


def register_tensors(sg, consts: dict, ops) -> frozenset[int]:
    """The tensors ``fuse_elementwise`` keeps in a kernel's registers (never stored) were every op of ``ops``
    on the device: a fused chain's intermediate values."""
    steps, _ = fuse_elementwise([PassStep(op, [(op, None)]) for op in ops], sg, consts)
    return frozenset(t for s in steps if s.epilogue for op, _ in s.members[:-1] for t in op.outputs if t >= 0)


def _fusable(op, t: int, sg, consts: dict) -> Fused | None:
    kind = traits(op.name).fusable
    if kind == "unary" and op.inputs[:1] == (t,):
        return Fused(op)
    if kind != "binary" or len(op.inputs) != 2 or t not in op.inputs or op.inputs[0] == op.inputs[1]:
        return None
    lhs = op.inputs[0] == t
    other = op.inputs[1] if lhs else op.inputs[0]
    out_lay = bhwc(sg.tensors[t].shape)
    o_shape = sg.tensors[other].shape
    o_lay = bhwc(o_shape)
    if out_lay is None or o_lay is None or sg.tensors[other].dtype != np.float32:
        return None
    if bhwc(sg.tensors[op.outputs[0]].shape) != out_lay:
        return None
    if other in consts:
        c = np.asarray(consts[other], np.float32)
        if c.size == 1 or (o_lay.dims[:3] == (1, 1, 1) and o_lay.c == out_lay.c):
            return Fused(op, other_const=c, producer_is_lhs=lhs)
        return None
    if o_lay != out_lay:
        return None
    return Fused(op, other_tensor=other, producer_is_lhs=lhs)


def _region_operands(s: PassStep, sg, consts: dict, lay) -> list[int] | None:
    """The tensors an elementwise step (op and fused chain) reads from outside itself, or None where it cannot
    join a region: not a unary / binary float op of layout ``lay`` reading same-layout tensors, scalars or
    per-channel constants."""
    if not s.gpu or traits(s.op.name).fusable not in ("unary", "binary") or len(s.op.outputs) != 1:
        return None
    made, reads = set(), []
    for op, _ in s.members:
        if any(t < 0 or sg.tensors[t].dtype != np.float32 for t in (*op.inputs, *op.outputs)) \
                or bhwc(sg.tensors[op.outputs[0]].shape) != lay:
            return None
        if len(op.inputs) != (1 if traits(op.name).fusable == "unary" else 2):
            return None
        for t in op.inputs:
            if t in consts:
                c = np.asarray(consts[t])
                if c.size != 1 and (c.size != lay.c or sg.tensors[t].shape[-1:] != (lay.c,)):
                    return None
            elif t not in made:
                if bhwc(sg.tensors[t].shape) != lay:
                    return None
                reads.append(t)
        made.update(op.outputs)
    return reads


def fuse_regions(steps: list[PassStep], sg, consts: dict, allowed=lambda a, b: True) -> tuple[list[PassStep], int]:
    """Merge elementwise steps into ``ELEMENTWISE_REGION`` steps (7. above) at the first member's place;
    ``allowed(op_a, op_b)``: the caller's veto on two steps sharing a kernel (e.g. two storage precisions).
    Returns the steps and how many steps joined another."""
    graph_out = set(sg.outputs)
    produced_at = {t: i for i, s in enumerate(steps) for op, _ in s.members for t in op.outputs if t >= 0}
    # each step that could join a region: its layout and the tensors it reads from outside itself
    joinable: dict[int, tuple] = {}
    for i, s in enumerate(steps):
        lay = bhwc(sg.tensors[s.outputs[0]].shape) if s.outputs and s.outputs[0] >= 0 else None
        reads = _region_operands(s, sg, consts, lay) if lay is not None else None
        if reads is not None:
            joinable[i] = (lay, reads)
    taken: set[int] = set()
    regions: dict[int, list[int]] = {}  # first step -> its members
    for i, (lay, first) in joinable.items():
        if i in taken:
            continue
        s = steps[i]
        members, made = [i], {t for op, _ in s.members for t in op.outputs}
        outside = set(first)  # tensors the region reads from outside it
        for j in (j for j in joinable if j > i):
            if len(members) == MAX_REGION_STEPS:
                break
            other, reads = joinable[j]
            if j in taken or other != lay or not allowed(s.op, steps[j].op):
                continue
            if not any(t in made or t in outside for t in reads):  # (not connected: its own kernel)
                continue
            if all(t in made or produced_at.get(t, -1) < i for t in reads):  # (each exists at the first's place)
                members.append(j)
                made.update(t for op, _ in steps[j].members for t in op.outputs)
                outside.update(t for t in reads if t not in made)
        if len(members) > 1:
            regions[i] = members
            taken.update(members)
    if not regions:
        return steps, 0
    read_by: dict[int, set[int]] = {}
    for k, s in enumerate(steps):
        for op, _ in s.members:
            for t in op.inputs:
                read_by.setdefault(t, set()).add(k)
    out = []
    for i, s in enumerate(steps):
        if i in taken and i not in regions:
            continue
        if i not in regions:
            out.append(s)
            continue
        members = regions[i]
        ops = [op for j in members for op, _ in steps[j].members]
        made = {t for op in ops for t in op.outputs}
        inputs = list(dict.fromkeys(t for op in ops for t in op.inputs if t not in made and t not in consts))
        stored = [t for t in dict.fromkeys(t for op in ops for t in op.outputs)
                  if t in graph_out or read_by.get(t, set()) - set(members)]
        region = replace(s.op, name=ELEMENTWISE_REGION, builtin_code=-1, inputs=tuple(inputs), outputs=tuple(stored),
                         options={"steps": [(steps[j].op, steps[j].epilogue) for j in members]})
        out.append(PassStep(region, [m for j in members for m in steps[j].members], [], True))
    return out, sum(len(m) - 1 for m in regions.values())
