"""The options of MediaPipe's custom ops. The pooling / transposed-conv ones keep raw C structs (TfLitePadding
in those structs: 0 unknown, 1 SAME, 2 VALID; we map to the builtin schema's 0 SAME / 1 VALID); the face-mesh
attention ops keep a flexbuffer map, as does TFLite's own custom op TFLite_Detection_PostProcess.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
from flatbuffers import flexbuffers

from .context import OpView

_PAD = {1: 0, 2: 1}


def transpose_conv_params(ctx: OpView) -> tuple[int, int, int]:
    """TfLiteTransposeConvParams: padding, stride_width, stride_height (int32 each)."""
    raw = ctx.op.custom_options
    if len(raw) < 12:
        raise ctx.fail(f"custom options hold {len(raw)} bytes, TfLiteTransposeConvParams needs 12")
    pad, sw, sh = struct.unpack_from("<3i", raw, 0)
    if pad not in _PAD or sw < 1 or sh < 1:
        raise ctx.fail(f"bad transpose-conv options padding={pad} stride={sw}x{sh}")
    return _PAD[pad], sw, sh


def pool_params(ctx: OpView) -> dict[str, int]:
    """TfLitePoolParams: padding, stride_w, stride_h, filter_w, filter_h, activation (+ computed)."""
    raw = ctx.op.custom_options
    if len(raw) < 24:
        raise ctx.fail(f"custom options hold {len(raw)} bytes, TfLitePoolParams needs at least 24")
    pad, sw, sh, fw, fh, act = struct.unpack_from("<6i", raw, 0)
    if pad not in _PAD or min(sw, sh, fw, fh) < 1:
        raise ctx.fail(f"bad pooling options padding={pad} stride={sw}x{sh} filter={fw}x{fh}")
    return {"padding": _PAD[pad], "stride_w": sw, "stride_h": sh, "filter_width": fw,
            "filter_height": fh, "fused_activation_function": act}


# -- MediaPipe's face-mesh "attention" ops: options in a flexbuffer map -----------------------------------------
# (mediapipe/util/tflite/operations/{landmarks_to_transform_matrix,transform_landmarks,
# transform_tensor_bilinear}.cc define the keys and the checks; the TFLite GPU delegate parses the same keys)


def _flex_map(ctx: OpView) -> dict:
    try:
        m = flexbuffers.Loads(bytes(ctx.op.custom_options))
    except Exception as e:  # noqa: BLE001 - the reader's errors on bad bytes are many kinds, all one verdict
        raise ctx.fail(f"custom options are not a flexbuffer map ({type(e).__name__}: {e})") from None
    if not isinstance(m, dict):
        raise ctx.fail(f"custom options are not a flexbuffer map (a {type(m).__name__})")
    return m


def _flex(ctx: OpView, m: dict, key: str, kind: type, default=None):
    if key not in m:
        if default is None:
            raise ctx.fail(f"custom option {key!r} is missing")
        return default
    v = m[key]
    if kind is float and isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if kind is int and isinstance(v, int) and not isinstance(v, bool):
        return int(v)
    if kind is tuple and isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v):
        return tuple(int(x) for x in v)
    if kind is str and isinstance(v, str):
        return v
    raise ctx.fail(f"custom option {key!r} is {v!r}, not {kind.__name__}")


def _pairs(ctx: OpView, flat: tuple[int, ...], key: str) -> tuple[tuple[int, int], ...]:
    """Index pairs from a flat list; an odd last index pairs with itself (as MediaPipe reads it)."""
    if any(i < 0 for i in flat):
        raise ctx.fail(f"custom option {key!r} holds a negative index: {list(flat)}")
    pairs = [(flat[i], flat[i + 1]) for i in range(0, len(flat) - 1, 2)]
    if len(flat) % 2:
        pairs.append((flat[-1], flat[-1]))
    return tuple(pairs)


@dataclass(frozen=True)
class LandmarksToMatrixV1:
    """Landmarks2TransformMatrix v1: the crop around ``subset`` landmarks, rotated so that the left and right
    rotation landmarks lie level, as the matrix from output pixels to input pixels."""

    input_hw: tuple[int, int]
    output_hw: tuple[int, int]
    landmarks_range: int
    bbox_size_multiplier: float
    left: int
    right: int
    subset: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class LandmarksToMatrixV2:
    """Landmarks2TransformMatrix v2: the crop's centre, size and rotation (to ``target_rotation_radians``) as
    a 4x4 matrix from output pixel to input coordinates (scaled by ``scale_x``/``scale_y``)."""

    left: int
    right: int
    target_rotation_radians: float
    output_height: int
    output_width: int
    scale_x: float
    scale_y: float
    subset: tuple[tuple[int, int], ...]


def landmarks_read(p: LandmarksToMatrixV1 | LandmarksToMatrixV2) -> int:
    """How many landmarks the matrix reads: one past the highest index its options name."""
    return 1 + max(p.left, p.right, *(i for pair in p.subset for i in pair))


def landmarks_to_matrix_params(ctx: OpView) -> LandmarksToMatrixV1 | LandmarksToMatrixV2:
    m = _flex_map(ctx)
    if ctx.op.version not in (1, 2):
        raise ctx.fail(f"version {ctx.op.version}: Landmarks2TransformMatrix has versions 1 and 2")
    left, right = _flex(ctx, m, "left_rotation_idx", int), _flex(ctx, m, "right_rotation_idx", int)
    if left < 0 or right < 0:
        raise ctx.fail(f"rotation landmarks {left}, {right}: indices must be >= 0")
    if ctx.op.version == 2:
        p = LandmarksToMatrixV2(left, right, _flex(ctx, m, "target_rotation_radians", float),
                                _flex(ctx, m, "output_height", int), _flex(ctx, m, "output_width", int),
                                _flex(ctx, m, "scale_x", float), _flex(ctx, m, "scale_y", float),
                                _pairs(ctx, _flex(ctx, m, "subset_idxs", tuple), "subset_idxs"))
        if p.output_height <= 0 or p.output_width <= 0 or p.scale_x <= 0 or p.scale_y <= 0:
            raise ctx.fail(f"output {p.output_height}x{p.output_width}, scale {p.scale_x}x{p.scale_y}: "
                           "all must be > 0")
        if not p.subset:
            raise ctx.fail("custom option 'subset_idxs' is empty")
        return p
    in_hw, out_hw = _flex(ctx, m, "input_hw", tuple), _flex(ctx, m, "output_hw", tuple)
    p = LandmarksToMatrixV1(in_hw[:2], out_hw[:2], _flex(ctx, m, "landmarks_range", int),
                            _flex(ctx, m, "bbox_size_multiplier", float), left, right,
                            _pairs(ctx, _flex(ctx, m, "subset", tuple), "subset"))
    if _flex(ctx, m, "dimensions", int) != 3:
        raise ctx.fail(f"dimensions {m.get('dimensions')}: version 1 reads 3-D landmarks")
    if len(in_hw) != 2 or len(out_hw) != 2 or min(*in_hw, *out_hw) <= 0:
        raise ctx.fail(f"input_hw {list(in_hw)} and output_hw {list(out_hw)} must be two sizes > 0")
    if p.landmarks_range <= 0 or p.bbox_size_multiplier == 0 or not p.subset:
        raise ctx.fail(f"landmarks_range {p.landmarks_range} (> 0), bbox_size_multiplier "
                       f"{p.bbox_size_multiplier} (!= 0) and a non-empty subset are needed")
    return p


def transform_landmarks_params(ctx: OpView) -> tuple[int, float]:
    """TransformLandmarks: (dimensions 2 or 3, scale of the matrix's translation). Version 2 takes both from
    the landmarks' shape ([1, N, dimensions]) and scale 1."""
    if ctx.op.version == 2:
        dims = ctx.input_tensor(0).shape[-1] if ctx.input_tensor(0) is not None else 0
        scale = 1.0
    elif ctx.op.version == 1:
        m = _flex_map(ctx)
        dims, scale = _flex(ctx, m, "dimensions", int), _flex(ctx, m, "scale", float)
    else:
        raise ctx.fail(f"version {ctx.op.version}: TransformLandmarks has versions 1 and 2")
    if dims not in (2, 3) or scale == 0:
        raise ctx.fail(f"dimensions {dims} (2 or 3) and scale {scale} (non-zero) are needed")
    return dims, scale


def transform_tensor_params(ctx: OpView) -> tuple[int, int, bool]:
    """TransformTensorBilinear: (output height, output width, align corners). Version 1 (also registered as
    "TransformTensor") reads ``output_size`` and ``mode`` (only "bilinear"); version 2 reads
    ``output_height``/``output_width`` and samples with align-corners correction."""
    m = _flex_map(ctx)
    if ctx.op.version == 2 and ctx.op.name == "TransformTensorBilinear":
        h, w, align = _flex(ctx, m, "output_height", int), _flex(ctx, m, "output_width", int), True
    elif ctx.op.version == 1:
        if _flex(ctx, m, "mode", str, "bilinear") != "bilinear":
            raise ctx.fail(f"mode {m['mode']!r}: only bilinear interpolation is defined")
        size = _flex(ctx, m, "output_size", tuple)
        if len(size) != 2:
            raise ctx.fail(f"output_size {list(size)} must be [height, width]")
        (h, w), align = size, False
    else:
        raise ctx.fail(f"version {ctx.op.version} of {ctx.op.name}: TransformTensorBilinear has versions 1 "
                       "and 2, TransformTensor version 1")
    if h <= 0 or w <= 0:
        raise ctx.fail(f"output size {h}x{w} must be > 0")
    return h, w, align


# -- TFLite_Detection_PostProcess: an SSD's box decoding and non-max suppression, options in a flexbuffer map ----
# (tensorflow/lite/kernels/detection_postprocess.cc reads the keys; TensorFlow's object-detection exporter writes
# them all)


@dataclass(frozen=True)
class DetectionPostProcess:
    """The options of TFLite_Detection_PostProcess. ``scales``: the box coder's (y, x, h, w) scales. The fast
    suppression (``use_regular_nms`` false) ranks each box by its best class and keeps its
    ``max_classes_per_detection`` best; the regular one suppresses per class, ``detections_per_class`` each."""

    max_detections: int
    max_classes_per_detection: int
    detections_per_class: int
    use_regular_nms: bool
    score_threshold: float
    iou_threshold: float
    num_classes: int
    scales: tuple[float, float, float, float]

    @property
    def detections(self) -> int:
        """The rows of its boxes, classes and scores outputs."""
        return self.max_detections * self.max_classes_per_detection

    def output_shapes(self) -> list[tuple[int, ...]]:
        """Boxes [1, rows, 4], classes and scores [1, rows], the count [1]: from the options alone."""
        return [(1, self.detections, 4), (1, self.detections), (1, self.detections), (1,)]

    def input_problem(self, box: tuple, cls: tuple, anchors: tuple) -> str | None:
        """What is wrong with the shapes of its box encodings, class predictions and anchors, or None."""
        if len(box) != 3 or len(cls) != 3 or len(anchors) != 2:
            return (f"box encodings {list(box)} (rank 3), class predictions {list(cls)} (rank 3) and anchors "
                    f"{list(anchors)} (rank 2) are needed")
        if box[0] != 1 or cls[0] != 1:
            return f"box encodings {list(box)} and class predictions {list(cls)}: LiteRT's kernel takes batch 1"
        if box[2] < 4:
            return f"box encodings {list(box)} hold {box[2]} values per box, at least 4 (y, x, h, w) are needed"
        if cls[1] != box[1]:
            return f"class predictions {list(cls)} score {cls[1]} boxes, the box encodings {list(box)} hold {box[1]}"
        if cls[2] - self.num_classes not in (0, 1):
            return (f"class predictions {list(cls)} hold {cls[2]} scores per box for num_classes {self.num_classes}: "
                    "one more (a background class first) or as many are needed")
        if anchors[1] != 4 or anchors[0] < box[1]:
            return f"anchors {list(anchors)}: [boxes, 4] (y, x, h, w) are needed for {box[1]} boxes"
        return None


def _flex_value(m: dict, key: str, kind: type, default=None):
    """``m[key]`` as LiteRT's flexbuffer accessors read it (AsInt32 truncates a float, AsFloat rounds to float32,
    AsBool is "not zero"); ``default`` where the key is absent, a ValueError where it has no default or is not a
    number."""
    if key not in m:
        if default is None:
            raise ValueError(f"custom option {key!r} is missing")
        return default
    v = m[key]
    if not isinstance(v, (bool, int, float)):
        raise ValueError(f"custom option {key!r} is {v!r}, not a number")  # noqa: TRY004 - a model's fault
    if kind is bool:
        return bool(v)
    if kind is int:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"custom option {key!r} is {v!r}, not an integer")
        return int(v)
    return float(np.float32(v))


def detection_postprocess_options(raw: bytes) -> DetectionPostProcess:
    """Parse and check TFLite_Detection_PostProcess's options; a ValueError says what is wrong. Where LiteRT reads
    an absent key as 0 and would compute nonsense from it (a scale, a count), the key is required; its defaults
    are kept: ``detections_per_class`` 100, ``use_regular_nms`` false, ``nms_score_threshold`` 0."""
    try:
        m = flexbuffers.Loads(bytes(raw))
    except Exception as e:  # noqa: BLE001 - the reader's errors on bad bytes are many kinds, all one verdict
        raise ValueError(f"custom options are not a flexbuffer map ({type(e).__name__}: {e})") from None
    if not isinstance(m, dict):
        raise ValueError(f"custom options are not a flexbuffer map (a {type(m).__name__})")  # noqa: TRY004 - as above
    p = DetectionPostProcess(
        _flex_value(m, "max_detections", int), _flex_value(m, "max_classes_per_detection", int),
        _flex_value(m, "detections_per_class", int, 100), _flex_value(m, "use_regular_nms", bool, False),
        _flex_value(m, "nms_score_threshold", float, 0.0), _flex_value(m, "nms_iou_threshold", float),
        _flex_value(m, "num_classes", int),
        tuple(_flex_value(m, f"{k}_scale", float) for k in "yxhw"))
    if p.max_detections < 0 or p.max_classes_per_detection < 1 or p.num_classes < 1:
        raise ValueError(f"max_detections {p.max_detections} (>= 0), max_classes_per_detection "
                         f"{p.max_classes_per_detection} (>= 1) and num_classes {p.num_classes} (>= 1) are needed")
    if p.use_regular_nms and min(p.detections_per_class, p.max_detections) < 1:
        raise ValueError(f"detections_per_class {p.detections_per_class} and max_detections {p.max_detections}: the "
                         "regular suppression needs both >= 1")
    if not 0.0 < p.iou_threshold <= 1.0:
        raise ValueError(f"nms_iou_threshold {p.iou_threshold} must lie in (0, 1]")
    if 0.0 in p.scales or not all(math.isfinite(s) for s in p.scales):
        raise ValueError(f"the box coder's scales (y, x, h, w) {list(p.scales)} must be finite and non-zero")
    return p


def detection_postprocess_params(ctx: OpView) -> DetectionPostProcess:
    try:
        return detection_postprocess_options(ctx.op.custom_options)
    except ValueError as e:
        raise ctx.fail(str(e)) from None
