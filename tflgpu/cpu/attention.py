"""MediaPipe's face-mesh "attention" custom ops, which LiteRT's runtime lacks: Landmarks2TransformMatrix (a crop
matrix from landmarks), TransformTensorBilinear (resample a feature map through that matrix) and
TransformLandmarks (map landmarks through it), versions 1 and 2 each, as MediaPipe's own kernels compute them
(mediapipe/util/tflite/operations/). Batch 1 only, as there. Math in float32, as there."""

from __future__ import annotations

import numpy as np

from ..ops.custom_options import (
    LandmarksToMatrixV1,
    LandmarksToMatrixV2,
    landmarks_read,
    landmarks_to_matrix_params,
    transform_landmarks_params,
    transform_tensor_params,
)
from .registry import KernelError, OpContext, register

F = np.float32


def _rotate(xy: np.ndarray, angle) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.stack([xy[..., 0] * c - xy[..., 1] * s, xy[..., 0] * s + xy[..., 1] * c], axis=-1).astype(F)


def matrix_v1(p: LandmarksToMatrixV1, lm: np.ndarray) -> np.ndarray:
    left, right = lm[p.left, :2], lm[p.right, :2]
    alpha = -np.arctan((right[1] - left[1]) / (right[0] - left[0]))
    pts = _rotate(lm[[i for pair in p.subset for i in pair], :2], alpha)
    hi = np.maximum(pts.max(axis=0), F(-100000))
    lo = np.minimum(pts.min(axis=0), F(100000))
    size = (hi - lo) * F(p.bbox_size_multiplier)
    rng = F(p.landmarks_range)
    scale = np.diag([size[0] / rng, size[1] / rng, F(1)]).astype(F)
    middle = _rotate((hi + lo) / F(2), -alpha)
    c, s = np.cos(-alpha), np.sin(-alpha)
    rotation = np.array([[c, -s, middle[0] / rng * 2 - 1], [s, c, middle[1] / rng * 2 - 1], [0, 0, 1]], F)
    (in_h, in_w), (out_h, out_w) = p.input_hw, p.output_hw
    to_relative = np.array([[F(2) / F(out_w - 1), 0, -1], [0, F(2) / F(out_h - 1), -1], [0, 0, 1]], F)
    to_absolute = np.array([[(in_w - 1) / 2, 0, (in_w - 1) / 2], [0, (in_h - 1) / 2, (in_h - 1) / 2], [0, 0, 1]], F)
    m = to_absolute @ rotation @ scale @ to_relative
    return np.array([[m[0, 0], m[0, 1], 0, m[0, 2]], [m[1, 0], m[1, 1], 0, m[1, 2]],
                     [m[2, 0], m[2, 1], m[2, 2], 0], [0, 0, 0, 1]], F)


def matrix_v2(p: LandmarksToMatrixV2, lm: np.ndarray) -> np.ndarray:
    left, right = lm[p.left], lm[p.right]
    r = F(p.target_rotation_radians) - np.arctan2(right[1] - left[1], right[0] - left[0])
    pts = _rotate(lm[[i for pair in p.subset for i in pair], :2], r)
    hi, lo = pts.max(axis=0), pts.min(axis=0)
    width, height = hi[0] - lo[0], hi[1] - lo[1]
    cx, cy = _rotate((lo + hi) / F(2), -r)
    c, s = np.cos(-r), np.sin(-r)
    shift = np.array([[1, 0, 0, cx], [0, 1, 0, cy], [0, 0, 1, 0], [0, 0, 0, 1]], F)
    rotation = np.array([[c, -s, 0, 0], [s, c, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], F)
    scale = np.diag([F(p.scale_x) * width / F(p.output_width), F(p.scale_y) * height / F(p.output_height), 1, 1])
    centre = np.array([[1, 0, 0, -p.output_width / 2], [0, 1, 0, -p.output_height / 2], [0, 0, 1, 0],
                       [0, 0, 0, 1]], F)
    return (shift @ rotation @ scale.astype(F) @ centre).astype(F)


def _batch_one(ctx: OpContext, i: int = 0) -> None:
    t = ctx.input_tensor(i)
    if t is not None and t.shape and t.shape[0] != 1:
        raise ctx.fail(f"input {i} has batch {t.shape[0]}: MediaPipe's kernel takes batch 1")


def _matrix_input(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    if x.size < 16:
        raise KernelError(f"{ctx.op.name}: the transform matrix has {x.size} values, 16 needed")
    return np.asarray(x, F).reshape(-1)[:16]


@register("Landmarks2TransformMatrix")
def landmarks_to_transform_matrix(ctx: OpContext):
    p = landmarks_to_matrix_params(ctx)
    rank = 4 if isinstance(p, LandmarksToMatrixV1) else 3
    x, out = ctx.input_tensor(0), ctx.output_tensor()
    if len(x.shape) != rank:
        raise ctx.fail(f"landmarks of shape {list(x.shape)}: version {ctx.op.version} takes rank {rank}")
    _batch_one(ctx)
    if tuple(out.shape) != (1, 4, 4):
        raise ctx.fail(f"output shape {list(out.shape)}, expected [1, 4, 4]")
    if 3 * landmarks_read(p) > int(np.prod(x.shape)):
        raise ctx.fail(f"the options name landmark {landmarks_read(p) - 1}, the input {list(x.shape)} holds "
                       f"{int(np.prod(x.shape)) // 3}")
    make = matrix_v1 if rank == 4 else matrix_v2

    def run(xs):
        lm = np.asarray(xs[0], F).reshape(-1)
        if lm.size < 3 * landmarks_read(p):
            raise KernelError(f"Landmarks2TransformMatrix reads landmark {landmarks_read(p) - 1}, the input holds "
                              f"{lm.size // 3}")
        with np.errstate(all="ignore"):  # level rotation landmarks divide by zero in v1, as in MediaPipe
            return [make(p, lm[: lm.size // 3 * 3].reshape(-1, 3)).reshape(1, 4, 4)]

    return run


def transform_landmarks(landmarks: np.ndarray, matrix: np.ndarray, dims: int, scale: float) -> np.ndarray:
    """Each landmark's (x, y) through the matrix's first two rows (translation times ``scale``); z kept."""
    m = matrix.astype(F)
    lm = landmarks.reshape(-1, dims)
    out = lm.copy()
    out[:, 0] = m[0] * lm[:, 0] + m[1] * lm[:, 1] + m[3] * F(scale)
    out[:, 1] = m[4] * lm[:, 0] + m[5] * lm[:, 1] + m[7] * F(scale)
    return out.reshape(landmarks.shape)


@register("TransformLandmarks")
def transform_landmarks_op(ctx: OpContext):
    dims, scale = transform_landmarks_params(ctx)
    x = ctx.input_tensor(0)
    rank = 4 if ctx.op.version == 1 else 3
    if len(x.shape) != rank or x.shape[-1] % dims:
        raise ctx.fail(f"landmarks of shape {list(x.shape)}: version {ctx.op.version} takes rank {rank} with a "
                       f"last dimension divisible by {dims}")
    _batch_one(ctx)
    if tuple(ctx.output_tensor().shape) != tuple(x.shape):
        raise ctx.fail(f"output shape {list(ctx.output_tensor().shape)}, expected {list(x.shape)}")

    def run(xs):
        return [transform_landmarks(np.asarray(xs[0], F), _matrix_input(ctx, xs[1]), dims, scale)]

    return run


def transform_tensor(x: np.ndarray, matrix: np.ndarray, out_h: int, out_w: int, align_corners: bool) -> np.ndarray:
    """Sample ``x`` ([1, H, W, C]) bilinearly at each output pixel's position through the matrix; a position
    outside the input gives 0, corners past the edge read 0."""
    _, h, w, c = x.shape
    row_x, row_y = matrix[0:4].astype(F).copy(), matrix[4:8].astype(F).copy()
    if align_corners:
        row_x[3] += row_x[0] * F(0.5) + row_x[1] * F(0.5) - F(0.5)
        row_y[3] += row_y[0] * F(0.5) + row_y[1] * F(0.5) - F(0.5)
    oy, ox = np.meshgrid(np.arange(out_h, dtype=F), np.arange(out_w, dtype=F), indexing="ij")
    tx = row_x[0] * ox + row_x[1] * oy + row_x[3]
    ty = row_y[0] * ox + row_y[1] * oy + row_y[3]
    inside = (tx >= 0) & (tx <= w - 1) & (ty >= 0) & (ty <= h - 1)
    fx, fy = np.floor(np.where(inside, tx, 0)), np.floor(np.where(inside, ty, 0))
    ax, ay = (np.where(inside, tx, 0) - fx)[..., None], (np.where(inside, ty, 0) - fy)[..., None]
    x0, y0 = fx.astype(np.int64), fy.astype(np.int64)
    padded = np.zeros((h + 1, w + 1, c), F)  # row and column h, w read as 0, as past the edge
    padded[:h, :w] = x[0]
    q11, q21 = padded[y0, x0], padded[y0, x0 + 1]
    q12, q22 = padded[y0 + 1, x0], padded[y0 + 1, x0 + 1]
    upper = (1 - ax) * q11 + ax * q21
    lower = (1 - ax) * q12 + ax * q22
    out = ay * lower + (1 - ay) * upper
    return np.where(inside[..., None], out, F(0)).astype(F)[None]


@register("TransformTensorBilinear", "TransformTensor")
def transform_tensor_op(ctx: OpContext):
    out_h, out_w, align = transform_tensor_params(ctx)
    x = ctx.input_tensor(0)
    if len(x.shape) != 4:
        raise ctx.fail(f"input of shape {list(x.shape)}: rank 4 needed")
    _batch_one(ctx)
    want = (1, out_h, out_w, x.shape[3])
    if tuple(ctx.output_tensor().shape) != want:
        raise ctx.fail(f"output shape {list(ctx.output_tensor().shape)}, expected {list(want)} from the options")

    def run(xs):
        return [transform_tensor(np.asarray(xs[0], F), _matrix_input(ctx, xs[1]), out_h, out_w, align)]

    return run
