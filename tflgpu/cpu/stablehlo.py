"""The StableHLO ops LiteRT runs as builtins (a JAX or PyTorch model converted through StableHLO keeps them where no
TFLite op says the same): STABLEHLO_ADD, _MULTIPLY, _MAXIMUM, _MINIMUM, _AND, _SHIFT_LEFT (elementwise, operands of
one shape: StableHLO broadcasts nothing implicitly), STABLEHLO_PAD (edge padding, negative to crop, and interior
padding), STABLEHLO_REDUCE_WINDOW (padded and dilated windows folded by the body's op), STABLEHLO_GATHER and
STABLEHLO_SCATTER (XLA's general gather and scatter by dimension numbers; a gather's start indices clamped so that
each slice lies inside the operand, as StableHLO defines). A scatter's update computation and a reduce_window's body
are one of LiteRT's: replace (scatter only), add, multiply, maximum, minimum. STABLEHLO_COMPOSITE is in
``control``. STABLEHLO_RNG_BIT_GENERATOR draws LiteRT's Philox or Threefry bits; LiteRT runs no other StableHLO op
as a builtin but STABLEHLO_CASE."""

from __future__ import annotations

import numpy as np

from .control import subgraph_option
from .random_ops import philox4x32
from .reduce import fold_windows
from .registry import KernelError, OpContext, register


def _shift_left(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """lhs << rhs; a shift by the width or more (or a negative one) gives 0, as StableHLO defines."""
    inside = (b >= 0) & (b < a.dtype.itemsize * 8)
    return np.where(inside, np.left_shift(a, np.where(inside, b, 0).astype(a.dtype)), 0).astype(a.dtype)


# op -> (what it computes of two operands of one shape, the dtype kinds it takes); integers wrap, as LiteRT's. Its
# MAXIMUM is std::max(a, b): a unless a < b (a NaN first stays, a NaN second does not; of two zeros the first), and
# MINIMUM std::min(a, b): a unless b < a
_ELEMENTWISE = {
    "STABLEHLO_ADD": (np.add, "fiu"), "STABLEHLO_MULTIPLY": (np.multiply, "fiu"),
    "STABLEHLO_MAXIMUM": (lambda a, b: np.where(a < b, b, a), "fiu"),
    "STABLEHLO_MINIMUM": (lambda a, b: np.where(b < a, b, a), "fiu"),
    "STABLEHLO_AND": (np.bitwise_and, "biu"), "STABLEHLO_SHIFT_LEFT": (_shift_left, "iu"),
}


def _elementwise(ctx: OpContext):
    name = ctx.op.name
    fn, kinds = _ELEMENTWISE[name]

    def run(xs):
        a, b = np.asarray(xs[0]), np.asarray(xs[1])
        if a.shape != b.shape:
            raise KernelError(f"{name}: operands of shapes {list(a.shape)} and {list(b.shape)}; StableHLO's "
                              "elementwise ops take one shape (no implicit broadcast)")
        if a.dtype.kind not in kinds:
            raise KernelError(f"{name} does not take {a.dtype} values")
        with np.errstate(over="ignore"):
            return [fn(a, b)]

    return run


for _name in _ELEMENTWISE:
    register(_name)(_elementwise)


def _dims(ctx: OpContext, key: str) -> list[int]:
    value = ctx.opt(key)
    return [] if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


@register("STABLEHLO_PAD")
def stablehlo_pad(ctx: OpContext):
    """Each dimension: ``interior`` padding values between neighbours, then ``low`` before and ``high`` after (a
    negative one removes that many from the edge). An output of no elements has size 0 along every axis, as
    LiteRT's."""
    low, high, interior = (_dims(ctx, k) for k in ("edge_padding_low", "edge_padding_high", "interior_padding"))
    if any(i < 0 for i in interior):
        raise ctx.fail(f"interior padding {interior} must be >= 0")

    def run(xs):
        value = np.asarray(xs[1])
        if value.size != 1:
            raise KernelError(f"STABLEHLO_PAD: the padding value must be a scalar, got {list(value.shape)}")
        out = padded(np.asarray(xs[0]), value.reshape(()), low, high, interior, "STABLEHLO_PAD")
        # (an output of no elements: LiteRT's is of size 0 along every axis, [0, 6, 7] reported as [0, 0, 0])
        return [out if out.size else np.zeros((0,) * out.ndim, out.dtype)]

    return run


def padded(x: np.ndarray, value, low: list[int], high: list[int], interior: list[int], what: str) -> np.ndarray:
    """``x`` with ``interior`` values between neighbours along each axis, then ``low`` before and ``high`` after
    (negative: that many removed from the edge), the new places ``value``."""
    if not len(low) == len(high) == len(interior) == x.ndim:
        raise KernelError(f"{what}: paddings {low} / {high} / {interior} for an operand of rank {x.ndim}")
    sizes = [lo + hi + d + max(d - 1, 0) * i for d, lo, hi, i in zip(x.shape, low, high, interior)]
    if any(s < 0 for s in sizes):
        raise KernelError(f"{what}: paddings {low} / {high} leave a negative size {sizes}")
    spread = [d + max(d - 1, 0) * i for d, i in zip(x.shape, interior)]
    grown = [max(lo, 0) + s + max(hi, 0) for s, lo, hi in zip(spread, low, high)]
    out = np.full(grown, value, x.dtype)
    out[tuple(slice(max(lo, 0), max(lo, 0) + s, i + 1) for s, lo, i in zip(spread, low, interior))] = x
    crop = tuple(slice(-min(lo, 0), g + min(hi, 0)) for g, lo, hi in zip(grown, low, high))
    return np.ascontiguousarray(out[crop])


def _index_vectors(indices: np.ndarray, index_vector_dim: int) -> np.ndarray:
    """The start indices with their index vectors along the last axis (a trailing one of 1 where
    ``index_vector_dim`` is the rank: each index a scalar)."""
    indices = np.asarray(indices, np.int64)
    if index_vector_dim == indices.ndim:
        return indices[..., None]
    return np.moveaxis(indices, index_vector_dim, -1)


@register("STABLEHLO_GATHER")
def stablehlo_gather(ctx: OpContext):
    offset_dims, collapsed, start_map, slice_sizes = (
        _dims(ctx, k) for k in ("offset_dims", "collapsed_slice_dims", "start_index_map", "slice_sizes"))
    index_vector_dim = int(ctx.opt("index_vector_dim", 0))

    def run(xs):
        x = np.asarray(xs[0])
        if len(slice_sizes) != x.ndim or any(not 0 <= s <= d for s, d in zip(slice_sizes, x.shape)):
            raise KernelError(f"STABLEHLO_GATHER: slice sizes {slice_sizes} for an operand {list(x.shape)}")
        if any(slice_sizes[d] != 1 for d in collapsed):
            raise KernelError(f"STABLEHLO_GATHER: collapsed dimensions {collapsed} must have slices of size 1")
        vectors = _index_vectors(xs[1], index_vector_dim)
        if vectors.shape[-1] != len(start_map):
            raise KernelError(f"STABLEHLO_GATHER: index vectors of {vectors.shape[-1]} for a start index map of "
                              f"{len(start_map)}")
        batch = vectors.shape[:-1]
        starts = np.zeros((*batch, x.ndim), np.int64)
        for k, d in enumerate(start_map):
            starts[..., d] = vectors[..., k]
        starts = np.clip(starts, 0, np.array(x.shape) - np.array(slice_sizes))  # (each slice inside the operand)
        nb = len(batch)
        coords = []
        for d in range(x.ndim):
            within = np.arange(slice_sizes[d]).reshape([1] * (nb + d) + [-1] + [1] * (x.ndim - d - 1))
            coords.append(starts[..., d].reshape(batch + (1,) * x.ndim) + within)
        picked = x[tuple(coords)] if x.size else np.zeros((*batch, *slice_sizes), x.dtype)
        kept = [d for d in range(x.ndim) if d not in collapsed]
        picked = picked.reshape((*batch, *(slice_sizes[d] for d in kept)))
        if len(offset_dims) != len(kept):
            raise KernelError(f"STABLEHLO_GATHER: {len(offset_dims)} offset dims for {len(kept)} uncollapsed "
                              "slice dimensions")
        rank = nb + len(kept)
        batch_axes = iter(range(nb))
        order = sorted(offset_dims)
        perm = [nb + order.index(o) if o in offset_dims else next(batch_axes) for o in range(rank)]
        return [np.ascontiguousarray(np.transpose(picked, perm))]

    return run


# a reduce_window's body, by the one op of its subgraph (LiteRT's kinds): (accumulated, value) -> new. A scatter's
# update computation applies its op as the elementwise op does, (old, update) -> new (LiteRT's std::max of the two)
_FOLD = {"STABLEHLO_ADD": np.add, "STABLEHLO_MULTIPLY": np.multiply, "STABLEHLO_MAXIMUM": np.maximum,
         "STABLEHLO_MINIMUM": np.minimum}


def _computation(ctx: OpContext, option: str, replace: bool) -> str | None:
    """The op a scatter's update computation or a reduce_window's body applies (None: the second value replaces the
    first, where ``replace`` allows), from its subgraph: no op, returning its second input; or one StableHLO op of the
    two inputs (LiteRT refuses a TFLite ADD there)."""
    sg = ctx.runtime.model.subgraphs[subgraph_option(ctx, option)]
    if len(sg.inputs) != 2 or len(sg.outputs) != 1:
        raise ctx.fail(f"the computation of {option} {sg.index} must take 2 values and return 1")
    if replace and not sg.operators and sg.outputs[0] == sg.inputs[1]:
        return None
    op = sg.operators[0] if len(sg.operators) == 1 else None
    if op is None or op.name not in _FOLD or sorted(op.inputs) != sorted(sg.inputs) or op.outputs != sg.outputs:
        raise ctx.fail(f"the computation of {option} {sg.index} is not one of {'replace, ' if replace else ''}add, "
                       f"multiply, maximum or minimum: {[o.name for o in sg.operators]}")
    return op.name


@register("STABLEHLO_SCATTER")
def stablehlo_scatter(ctx: OpContext):
    """Each update's value combined into the operand at its scatter index plus its window position; a value whose
    index lies outside the operand is skipped (LiteRT checks each value, not each window as XLA). Updates apply in
    their row-major order (a repeated index: the last one replaces; the sums' order)."""
    window_dims, inserted, to_operand = (
        _dims(ctx, k) for k in ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims"))
    index_vector_dim = int(ctx.opt("index_vector_dim", 0))
    computation = _computation(ctx, "update_computation_subgraph_index", replace=True)
    combine = (lambda old, new: new) if computation is None else _ELEMENTWISE[computation][0]

    def run(xs):
        x, updates = np.asarray(xs[0]), np.asarray(xs[2])
        vectors = _index_vectors(xs[1], index_vector_dim)
        if vectors.shape[-1] != len(to_operand):
            raise KernelError(f"STABLEHLO_SCATTER: index vectors of {vectors.shape[-1]} for "
                              f"{len(to_operand)} scatter dims")
        scatter_axes = [d for d in range(updates.ndim) if d not in window_dims]
        window_operand = [d for d in range(x.ndim) if d not in inserted]
        if len(window_operand) != len(window_dims) or [updates.shape[d] for d in scatter_axes] != \
                list(vectors.shape[:-1]):
            raise KernelError(f"STABLEHLO_SCATTER: updates {list(updates.shape)} do not match the indices "
                              f"{list(vectors.shape)} and window dims {window_dims}")
        # every update element's operand index: [updates.size, rank]
        grid = np.indices(updates.shape).reshape(updates.ndim, -1)
        starts = np.zeros((grid.shape[1], x.ndim), np.int64)
        index = vectors[tuple(grid[d] for d in scatter_axes)]
        for k, d in enumerate(to_operand):
            starts[:, d] = index[:, k]
        within = np.zeros_like(starts)
        for k, d in enumerate(window_operand):
            within[:, d] = grid[window_dims[k]]
        full = starts + within
        fits = ((full >= 0) & (full < np.array(x.shape))).all(axis=1)  # (each element's own index, as LiteRT)
        out = np.array(x, copy=True)
        flat = np.ravel_multi_index(tuple(full[fits].T), x.shape) if x.ndim else np.zeros(int(fits.sum()), np.int64)
        values = updates.reshape(-1)[fits]
        # in rounds: each update's repeat count of its index so far, so that repeated indices apply in order
        order = np.argsort(flat, kind="stable")
        first = np.r_[0, np.flatnonzero(np.diff(flat[order])) + 1] if flat.size else np.zeros(0, np.int64)
        rank = np.empty(flat.size, np.int64)
        rank[order] = np.arange(flat.size) - np.repeat(first, np.diff(np.r_[first, flat.size]))
        dest = out.reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            for r in range(int(rank.max(initial=-1)) + 1):
                at = rank == r
                dest[flat[at]] = combine(dest[flat[at]], values[at])
        return [out]

    return run


@register("STABLEHLO_REDUCE_WINDOW")
def stablehlo_reduce_window(ctx: OpContext):
    """The operand dilated by ``base_dilations`` and padded by ``padding`` (both with the init value), then each
    window's values folded into the init value by the body's op, in the window's row-major order (as TFLite's
    REDUCE_WINDOW, which LiteRT runs with the same kernel)."""
    fn = _FOLD[_computation(ctx, "body_subgraph_index", replace=False)]
    window, strides, base, dilations, padding = (_dims(ctx, k) for k in (
        "window_dimensions", "window_strides", "base_dilations", "window_dilations", "padding"))

    def run(xs):
        x, init = np.asarray(xs[0]), np.asarray(xs[1])
        rank = x.ndim
        w = window or [1] * rank
        s, b, d = (v or [1] * rank for v in (strides, base, dilations))
        pad = padding or [0] * (2 * rank)
        if not len(w) == len(s) == len(b) == len(d) == rank or len(pad) != 2 * rank or \
                min(w + s + b + d, default=1) < 1:
            raise KernelError(f"STABLEHLO_REDUCE_WINDOW: window {w}, strides {s}, base dilations {b}, window "
                              f"dilations {d} and padding {pad} for an operand of rank {rank} (each >= 1)")
        if init.size != 1:
            raise KernelError(f"STABLEHLO_REDUCE_WINDOW: the init value must be a scalar, got {list(init.shape)}")
        grown = padded(x, init.reshape(()), pad[0::2], pad[1::2], [v - 1 for v in b], "STABLEHLO_REDUCE_WINDOW")
        return [fold_windows(grown, init.reshape(()), fn, w, s, d)]

    return run


_THREEFRY, _PHILOX = 2, 1  # RngAlgorithm (DEFAULT, 0, is Philox, as in LiteRT)
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(key: tuple[int, int], x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds (Random123's, JAX's) of the counter words ``x0``, ``x1`` (uint32 arrays)."""
    ks = [np.uint32(key[0]), np.uint32(key[1]), np.uint32(key[0] ^ key[1] ^ 0x1BD11BDA)]
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0, x1 = x0 + ks[(i + 1) % 3], x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


@register("STABLEHLO_RNG_BIT_GENERATOR")
def stablehlo_rng_bit_generator(ctx: OpContext):
    """LiteRT's bits: the state's uint64 words as uint32, the key its first two; Philox-4x32-10 counting from the
    next two, its high half the last two of a 3-word state or the key again of a 2-word one; Threefry-2x32 (a 2-word
    state) from the second word. Each call's words fill the output in order (a 64-bit output takes two, low first),
    the counter's low 64 bits counting up once per call, a partial last one too; the new state is the old with that
    counter."""
    algorithm = int(ctx.opt("algorithm", 0))
    if algorithm not in (0, _PHILOX, _THREEFRY):
        raise ctx.fail(f"algorithm {algorithm} is none of DEFAULT, PHILOX, THREEFRY")
    out = ctx.output_tensor(1)
    if out.dtype not in (np.int32, np.int64, np.uint32, np.uint64):
        raise ctx.fail(f"output type {out.type_name} is not INT32, INT64, UINT32 or UINT64")
    shape, words_per = tuple(out.shape), out.dtype.itemsize // 4

    def run(xs):
        state = np.ascontiguousarray(xs[0], np.uint64)
        n = state.shape[0] if state.ndim == 1 else 0
        if n not in ((2,) if algorithm == _THREEFRY else (2, 3)):
            raise KernelError(f"STABLEHLO_RNG_BIT_GENERATOR: a state of {list(state.shape)} words; this algorithm "
                              f"takes {'2' if algorithm == _THREEFRY else '2 or 3'}")
        words = int(np.prod(shape, dtype=np.int64)) * words_per
        key = (int(state[0]) & 0xFFFFFFFF, int(state[0]) >> 32)
        start = int(state[1])
        per_call = 2 if algorithm == _THREEFRY else 4
        calls = -(-words // per_call)
        lo = np.uint64(start) + np.arange(calls, dtype=np.uint64)  # (wraps without a carry, as LiteRT's)
        if algorithm == _THREEFRY:
            a, b = threefry2x32(key, (lo & np.uint64(0xFFFFFFFF)).astype(np.uint32),
                                (lo >> np.uint64(32)).astype(np.uint32))
            bits = np.stack([a, b], axis=1)
        else:
            bits = philox4x32(key, lo, np.full(calls, state[2] if n == 3 else state[0], np.uint64))
        values = bits.reshape(-1)[:words].view(np.uint32).view(out.dtype).reshape(shape)
        new = state.copy()
        new[1] = np.uint64((start + calls) % (1 << 64))
        return [new, values]

    return run
