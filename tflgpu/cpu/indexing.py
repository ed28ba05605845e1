"""Ops that place or pick values by index arrays: ONE_HOT, EMBEDDING_LOOKUP, DYNAMIC_UPDATE_SLICE,
UNSORTED_SEGMENT_{SUM,PROD,MAX,MIN}, REVERSE_SEQUENCE, MATRIX_DIAG, MATRIX_SET_DIAG, BROADCAST_ARGS, BITCAST, WHERE,
SPARSE_TO_DENSE, DILATE, EMBEDDING_LOOKUP_SPARSE, with LiteRT's rules for indices out of range (each op's own:
ignored, clamped or refused)."""

from __future__ import annotations

import numpy as np

from ..ops.quantization import qparams
from .registry import KernelError, OpContext, fits, normalize_axis, register


def _scalar_int(x, what: str) -> int:
    a = np.asarray(x).reshape(-1)
    if a.size != 1:
        raise KernelError(f"{what} must hold one value, got {a.size}")
    return int(a[0])


@register("ONE_HOT")
def one_hot(ctx: OpContext):
    """on_value where the index equals the position along the new ``axis`` of ``depth``, off_value elsewhere
    (an index out of [0, depth) gives a row of off_value)."""
    axis = int(ctx.opt("axis", -1))
    fixed = ctx.const(1)
    if fixed is not None and fixed.size == 1 and int(fixed.reshape(-1)[0]) < 0:
        raise ctx.fail(f"depth {int(fixed.reshape(-1)[0])} must be >= 0")

    def run(xs):
        idx, depth = np.asarray(xs[0]), _scalar_int(xs[1], "ONE_HOT's depth")
        if depth < 0:
            raise KernelError(f"ONE_HOT: depth {depth} must be >= 0")
        a = axis + idx.ndim + 1 if axis < 0 else axis
        if not 0 <= a <= idx.ndim:
            raise KernelError(f"ONE_HOT: axis {axis} out of range for indices of rank {idx.ndim}")
        on, off = np.asarray(xs[2]).reshape(()), np.asarray(xs[3]).reshape(())
        hit = np.expand_dims(idx, a) == np.arange(depth).reshape([-1] + [1] * (idx.ndim - a))
        return [np.where(hit, on, off).astype(on.dtype)]

    return run


@register("EMBEDDING_LOOKUP")
def embedding_lookup(ctx: OpContext):
    """The rows of the table (input 1) that the ids (input 0) name, in order; an int8 table with a float output
    is dequantized by its scale per row or per tensor (LiteRT's hybrid lookup, zero point not applied)."""
    table_t, out_t = ctx.input_tensor(1), ctx.output_tensor()
    hybrid = table_t.dtype == np.int8 and out_t.dtype == np.float32
    q = qparams(table_t) if hybrid else None
    if hybrid and q is None:
        raise ctx.fail("an int8 table with a float output needs the table's scale")
    scales = None if q is None else np.asarray(table_t.quantization.scales, np.float32)

    def run(xs):
        ids, table = np.asarray(xs[0]).reshape(-1).astype(np.int64), np.asarray(xs[1])
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            bad = int(ids[(ids < 0) | (ids >= table.shape[0])][0])
            raise KernelError(f"Embedding Lookup: index {bad} out of bounds for a table of {table.shape[0]} rows")
        rows = table[ids]
        if scales is None:
            return [rows.copy()]
        s = scales[ids] if scales.size > 1 else scales[0]
        s = np.asarray(s, np.float32).reshape([-1] + [1] * (rows.ndim - 1))
        return [(rows.astype(np.float32) * s).astype(np.float32)]

    return run


@register("DYNAMIC_UPDATE_SLICE")
def dynamic_update_slice(ctx: OpContext):
    """The operand with the update written at the start indices, each clamped so that the update fits (XLA's
    rule, LiteRT's)."""

    def run(xs):
        operand, update = np.asarray(xs[0]), np.asarray(xs[1])
        starts = np.asarray(xs[2]).reshape(-1).astype(np.int64)
        if update.ndim != operand.ndim or starts.size != operand.ndim:
            raise KernelError(f"DYNAMIC_UPDATE_SLICE: an update of rank {update.ndim} and {starts.size} start "
                              f"indices for an operand of rank {operand.ndim}")
        if any(u > o for u, o in zip(update.shape, operand.shape)):
            raise KernelError(f"DYNAMIC_UPDATE_SLICE: update {list(update.shape)} larger than the operand "
                              f"{list(operand.shape)}")
        out = operand.copy()
        at = [int(min(max(s, 0), o - u)) for s, o, u in zip(starts, operand.shape, update.shape)]
        out[tuple(slice(a, a + u) for a, u in zip(at, update.shape))] = update
        return [out]

    return run


def _segment(reduce_name: str):
    ufunc = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}[reduce_name]

    def factory(ctx: OpContext):
        def run(xs):
            data, ids = np.asarray(xs[0]), np.asarray(xs[1])
            count = _scalar_int(xs[2], "num_segments")
            if ids.shape != data.shape[: ids.ndim]:
                raise KernelError(f"segment_ids {list(ids.shape)} must be a prefix of the data's shape "
                                  f"{list(data.shape)}")
            if ids.size and ids.max() >= count:
                raise KernelError(f"segment id {int(ids.max())} not below num_segments {count}")
            rows = data.reshape((ids.size,) + data.shape[ids.ndim:])
            flat = ids.reshape(-1)
            if reduce_name == "SUM":
                start = np.zeros((), data.dtype)
            elif reduce_name == "PROD":
                start = np.ones((), data.dtype)
            else:
                info = np.finfo(data.dtype) if data.dtype.kind == "f" else np.iinfo(data.dtype)
                start = np.array(info.min if reduce_name == "MAX" else info.max, data.dtype)
            out = np.full((count,) + data.shape[ids.ndim:], start, data.dtype)
            keep = flat >= 0  # (a negative id drops its row)
            ufunc.at(out, flat[keep], rows[keep])
            return [out]

        return run

    return factory


for _name in ("SUM", "PROD", "MAX", "MIN"):
    register(f"UNSORTED_SEGMENT_{_name}")(_segment(_name))


@register("REVERSE_SEQUENCE")
def reverse_sequence(ctx: OpContext):
    """Along ``seq_dim``, the first seq_lengths[b] values of each batch entry b (along ``batch_dim``) reversed."""
    seq_dim, batch_dim = int(ctx.opt("seq_dim", 0)), int(ctx.opt("batch_dim", 0))

    def run(xs):
        x, lengths = np.asarray(xs[0]), np.asarray(xs[1]).reshape(-1).astype(np.int64)
        sd, bd = normalize_axis(seq_dim, x.ndim), normalize_axis(batch_dim, x.ndim)
        if sd == bd or lengths.size != x.shape[bd]:
            raise KernelError(f"REVERSE_SEQUENCE: seq_dim {seq_dim}, batch_dim {batch_dim} and {lengths.size} "
                              f"lengths for an input of shape {list(x.shape)}")
        if lengths.size and (lengths.min() < 0 or lengths.max() > x.shape[sd]):
            raise KernelError(f"REVERSE_SEQUENCE: sequence lengths {lengths.tolist()} must lie in [0, "
                              f"{x.shape[sd]}]")
        out = x.copy()
        for b, n in enumerate(lengths):
            where = [slice(None)] * x.ndim
            where[bd], where[sd] = b, slice(0, int(n))
            src = list(where)
            src[sd] = slice(int(n) - 1, None, -1) if n else slice(0, 0)
            out[tuple(where)] = x[tuple(src)]
        return [out]

    return run


@register("MATRIX_DIAG")
def matrix_diag(ctx: OpContext):
    """[..., N] to [..., N, N]: each vector on the diagonal of a zero matrix."""

    def run(xs):
        d = np.asarray(xs[0])
        if d.ndim < 1:
            raise KernelError("MATRIX_DIAG takes an input of rank >= 1")
        n = d.shape[-1]
        out = np.zeros(d.shape + (n,), d.dtype)
        out[..., np.arange(n), np.arange(n)] = d
        return [out]

    return run


@register("MATRIX_SET_DIAG")
def matrix_set_diag(ctx: OpContext):
    """[..., M, N] with its main diagonal replaced by the diagonal input [..., min(M, N)]."""

    def run(xs):
        x, d = np.asarray(xs[0]), np.asarray(xs[1])
        k = min(x.shape[-2:]) if x.ndim >= 2 else -1
        if x.ndim < 2 or d.shape != x.shape[:-2] + (k,):
            raise KernelError(f"MATRIX_SET_DIAG: a diagonal {list(d.shape)} for an input {list(x.shape)}")
        out = x.copy()
        out[..., np.arange(k), np.arange(k)] = d
        return [out]

    return run


@register("BROADCAST_ARGS")
def broadcast_args(ctx: OpContext):
    """The shape two shapes broadcast to (numpy's rule, TFLite's); shapes that do not broadcast are refused."""

    def run(xs):
        a, b = np.asarray(xs[0]).reshape(-1), np.asarray(xs[1]).reshape(-1)
        try:
            shape = np.broadcast_shapes(tuple(int(v) for v in a), tuple(int(v) for v in b))
        except ValueError:
            raise KernelError(f"BROADCAST_ARGS: shapes {a.tolist()} and {b.tolist()} do not broadcast") from None
        return [np.array(shape, a.dtype)]

    return run


@register("BITCAST")
def bitcast(ctx: OpContext):
    """The same bytes read as the output's type: the last dimension grows or shrinks by the size ratio."""
    out_t = ctx.output_tensor()

    def run(xs):
        x = np.ascontiguousarray(xs[0])
        to = np.dtype(out_t.dtype)
        if to.itemsize == x.dtype.itemsize:
            return [x.view(to)]
        if to.itemsize < x.dtype.itemsize:
            return [x.view(to).reshape(x.shape + (x.dtype.itemsize // to.itemsize,))]
        if not x.ndim or x.shape[-1] != to.itemsize // x.dtype.itemsize:
            raise KernelError(f"BITCAST: {list(x.shape)} {x.dtype} cannot be read as {to}")
        return [x.view(to).reshape(x.shape[:-1])]

    return run


@register("WHERE")
def where(ctx: OpContext):
    """The coordinates of the condition's true (non-zero) values, in row-major order: [count, rank] int64 (or the
    output's declared index type). Its size is the data's: a plan learns it when the values are known."""
    index_type = ctx.output_tensor().dtype

    def run(xs):
        cond = np.asarray(xs[0])
        return [np.argwhere(cond).astype(index_type).reshape(-1, cond.ndim)]

    return run


@register("UNIQUE")
def unique(ctx: OpContext):
    """A 1-D input's distinct values in the order they first appear, and for each value the position of its
    value among them (as ``out_idx``'s type). Its size is the data's."""
    index_type = ctx.output_tensor(1).dtype

    def run(xs):
        x = np.asarray(xs[0])
        if x.ndim != 1:
            raise KernelError(f"UNIQUE takes a 1-D input, got {list(x.shape)}")
        values, first, where = np.unique(x, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # (first appearance, not sorted)
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        return [values[order], rank[where.reshape(-1)].astype(index_type)]

    return run


@register("SEGMENT_SUM")
def segment_sum(ctx: OpContext):
    """The sums of the data's rows per segment id (ids from 0 up, each the one before or the next, as LiteRT
    requires): as many rows as the last id plus one, a size the data sets."""

    def run(xs):
        data, ids = np.asarray(xs[0]), np.asarray(xs[1]).reshape(-1)
        if data.ndim < 1 or ids.size != data.shape[0]:
            raise KernelError(f"SEGMENT_SUM: {ids.size} segment ids for data of shape {list(data.shape)}")
        steps = np.diff(np.concatenate([[-1], ids.astype(np.int64)]))
        if np.any((steps != 0) & (steps != 1)):
            raise KernelError(f"SEGMENT_SUM: segment ids {ids.tolist()} must start at 0 and grow by 0 or 1")
        out = np.zeros((int(ids.max()) + 1 if ids.size else 0,) + data.shape[1:], data.dtype)
        np.add.at(out, ids, data)
        return [out]

    return run


@register("SPARSE_TO_DENSE")
def sparse_to_dense(ctx: OpContext):
    """``output_shape`` filled with ``default_value``, then ``values[i]`` (or the one value) at ``indices[i]`` in
    order (a repeated index: the last one's value); an index outside the shape fails the invoke, as in LiteRT."""

    def run(xs):
        shape = np.asarray(xs[1]).reshape(-1)
        rank = shape.size
        dims = fits(shape, np.asarray(xs[2]).dtype, "SPARSE_TO_DENSE")
        idx = np.asarray(xs[0]).astype(np.int64)
        idx = idx.reshape(-1, 1) if idx.ndim < 2 else idx  # (one index per value, or per row of a 2-D array)
        if idx.shape[1] != rank:
            raise KernelError(f"SPARSE_TO_DENSE: indices of {idx.shape[1]} coordinates for an output of rank {rank}")
        values = np.asarray(xs[2])
        if values.size != 1 and values.size != idx.shape[0]:
            raise KernelError(f"SPARSE_TO_DENSE: {values.size} values for {idx.shape[0]} indices")
        out = np.full(dims, np.asarray(xs[3]).reshape(()), dtype=values.dtype)
        if idx.shape[0]:
            if np.any(idx < 0) or np.any(idx >= np.asarray(dims, np.int64)):
                raise KernelError(f"SPARSE_TO_DENSE: an index outside the output shape {list(dims)}")
            out[tuple(idx.T)] = np.broadcast_to(values.reshape(-1), (idx.shape[0],))  # (numpy: the last one wins)
        return [out]

    return run


@register("DILATE")
def dilate(ctx: OpContext):
    """The input's values spread ``dilations`` apart along each axis (output size (n - 1) x d + 1), the gaps
    filled with ``padding_value``."""

    def run(xs):
        x = np.asarray(xs[0])
        d = np.asarray(xs[1]).reshape(-1).astype(np.int64)
        if d.size != x.ndim or np.any(d < 1):
            raise KernelError(f"DILATE: dilations {d.tolist()} for an input of rank {x.ndim} (one per axis, >= 1)")
        dims = fits([(n - 1) * k + 1 if n else 0 for n, k in zip(x.shape, d)], x.dtype, "DILATE")
        out = np.full(dims, np.asarray(xs[2]).reshape(()), dtype=x.dtype)
        out[tuple(slice(None, None, int(k)) for k in d)] = x
        return [out]

    return run


# EMBEDDING_LOOKUP_SPARSE's combiner (CombinerType): SUM, MEAN, SQRTN
_SUM, _MEAN, _SQRTN = 0, 1, 2


@register("EMBEDDING_LOOKUP_SPARSE")
def embedding_lookup_sparse(ctx: OpContext):
    """TF1's embedding_lookup_sparse as LiteRT computes it: each lookup's row of ``params`` times its weight, added
    into the output row its sparse index names (the index's last coordinate dropped); with MEAN / SQRTN, a run of
    lookups into one row is divided by its weights' sum (root of squared sum) when the next lookup goes
    elsewhere, in LiteRT's order, so unsorted indices give LiteRT's numbers too."""
    combiner = int(ctx.opt("combiner", 0))
    if combiner not in (_SUM, _MEAN, _SQRTN):
        raise ctx.fail(f"combiner {combiner} is not SUM, MEAN or SQRTN")

    def run(xs):
        ids, indices, dense, weights, params = (np.asarray(x) for x in xs)
        if params.ndim < 2 or indices.ndim != 2 or dense.size != indices.shape[1] or \
                not ids.size == weights.size == indices.shape[0]:
            raise KernelError(f"EMBEDDING_LOOKUP_SPARSE: ids {list(ids.shape)}, indices {list(indices.shape)}, "
                              f"dense shape {dense.tolist()}, weights {list(weights.shape)} and params "
                              f"{list(params.shape)} do not fit")
        rows = [int(d) for d in dense[:-1]]
        out = np.zeros(fits(rows + list(params.shape[1:]), np.float32, "EMBEDDING_LOOKUP_SPARSE"), np.float32)
        flat, table = out.reshape(int(np.prod(rows, dtype=np.int64)), -1), params.reshape(params.shape[0], -1)
        current, count, total, squares = 0, 0, np.float32(0), np.float32(0)

        def finish():
            if combiner != _SUM and count:
                flat[current] /= total if combiner == _MEAN else np.sqrt(squares)

        for i, idx in enumerate(ids.reshape(-1).astype(np.int64)):
            if not 0 <= idx < table.shape[0]:
                raise KernelError(f"EMBEDDING_LOOKUP_SPARSE: id {idx} out of [0, {table.shape[0]})")
            coords = indices[i, :-1].astype(np.int64)
            if np.any(coords < 0) or np.any(coords >= np.asarray(rows, np.int64)):
                raise KernelError(f"EMBEDDING_LOOKUP_SPARSE: index {indices[i].tolist()} outside {dense.tolist()}")
            bucket = int(np.ravel_multi_index(tuple(coords), rows)) if rows else 0
            if bucket != current:
                finish()
                current, count, total, squares = bucket, 0, np.float32(0), np.float32(0)
            w = np.float32(weights.reshape(-1)[i])
            count += 1
            squares = np.float32(squares + w * w)
            total = np.float32(total + w)
            flat[current] += table[idx] * w
        finish()
        return [out]

    return run
