"""The ops a detector ends with, as LiteRT computes them, ties included.

TFLite_Detection_PostProcess: the last op of an SSD exported by TensorFlow's object-detection API (the
``detect.tflite`` of TFLite's examples, EfficientDet-Lite). LiteRT registers it as a builtin custom op; TFLite's GPU
delegate leaves it to the CPU, and so does ours. It decodes each anchor's box from its encoding (a centre-size box
coder), then keeps the best-scoring boxes that do not overlap a better one: the fast suppression ranks each box by
its best class, the regular one suppresses per class. The order of equal scores is the one LiteRT's sorts leave (a
stable sort or merge where it sorts stably, GCC's heap-based ``std::partial_sort``, which LiteRT's wheels are built
with, where it ranks a box's classes), and the arithmetic is its (decoding in float64 rounded to float32, overlaps
in float32). Rows past the detections found are zeros (LiteRT leaves some of them unwritten). The regular
suppression's order among equal scores of different classes is LiteRT's on one thread: on several, LiteRT
suppresses classes in parallel and its order among such ties depends on which thread took which class.

NON_MAX_SUPPRESSION_V4 / V5 (``tf.image.non_max_suppression`` and ``..._with_scores``: hard and soft (Gaussian)
suppression of one class): TFLite's reference kernel, its candidates in GCC's ``std::priority_queue``; the outputs
have max_output_size rows whatever the count, zeros past it, as LiteRT's wheel gives them (a max_output_size
computed at run time too), so a plan's shapes after it are fixed. Float32 only.
"""

from __future__ import annotations

import math

import numpy as np

from ..ops.custom_options import detection_postprocess_params
from ..ops.jit import njit
from .quantized import register_int
from .registry import KernelError, OpContext, register

F = np.float32


@njit(cache=True)
def _decode(enc, anchors, scales, out):
    """Centre-size encodings ``enc`` [N, >=4] (y, x, h, w) against ``anchors`` [>=N, 4] into corners ``out``
    [N, 4] (ymin, xmin, ymax, xmax), computed in float64 and rounded to float32, as LiteRT does."""
    for i in range(out.shape[0]):
        ay, ax, ah, aw = float(anchors[i, 0]), float(anchors[i, 1]), float(anchors[i, 2]), float(anchors[i, 3])
        yc = np.float32(float(enc[i, 0]) / scales[0] * ah + ay)
        xc = np.float32(float(enc[i, 1]) / scales[1] * aw + ax)
        half_h = np.float32(0.5 * math.exp(float(enc[i, 2]) / scales[2]) * ah)
        half_w = np.float32(0.5 * math.exp(float(enc[i, 3]) / scales[3]) * aw)
        out[i, 0] = yc - half_h
        out[i, 1] = xc - half_w
        out[i, 2] = yc + half_h
        out[i, 3] = xc + half_w


@njit(cache=True)
def _iou(boxes, i, j):
    """Intersection over union of boxes ``i`` and ``j`` in float32; 0 where either has no area."""
    zero = np.float32(0.0)
    area_i = (boxes[i, 2] - boxes[i, 0]) * (boxes[i, 3] - boxes[i, 1])
    area_j = (boxes[j, 2] - boxes[j, 0]) * (boxes[j, 3] - boxes[j, 1])
    if area_i <= zero or area_j <= zero:
        return zero
    h = max(min(boxes[i, 2], boxes[j, 2]) - max(boxes[i, 0], boxes[j, 0]), zero)
    w = max(min(boxes[i, 3], boxes[j, 3]) - max(boxes[i, 1], boxes[j, 1]), zero)
    inter = h * w
    return inter / (area_i + area_j - inter)


@njit(cache=True)
def _sift(idx, values, sign, hole, length, value):
    """GCC's ``__adjust_heap`` then ``__push_heap`` on the heap ``idx[:length]`` of positions into ``values``,
    with the comparison ``comp(a, b) = sign * values[a] > sign * values[b]``: ``sign`` 1 keeps the smallest value
    at the root (``std::partial_sort`` by "greater"), -1 the largest (``std::priority_queue``'s "less")."""
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if sign * values[idx[child]] > sign * values[idx[child - 1]]:
            child -= 1
        idx[hole] = idx[child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        idx[hole] = idx[child - 1]
        hole = child - 1
    _push_up(idx, values, sign, hole, top, value)


@njit(cache=True)
def _push_up(idx, values, sign, hole, top, value):
    """GCC's ``__push_heap``: ``value`` moved up from ``hole`` towards ``top`` past the parents it beats."""
    parent = (hole - 1) // 2
    while hole > top and sign * values[idx[parent]] > sign * values[value]:
        idx[hole] = idx[parent]
        hole = parent
        parent = (hole - 1) // 2
    idx[hole] = value


@njit(cache=True)
def _partial_argsort(values, count, k, out):
    """The positions of the ``k`` largest of ``values[:count]``, largest first, into ``out[:k]``, as LiteRT's
    DecreasingPartialArgSort leaves them: its arg-max (the first largest) for k = 1, else GCC's
    ``std::partial_sort`` (a heap of the first k, each later value sifted in where it beats the root, the heap
    then sorted), whose order among equal values is its own."""
    if k == 1:
        best = 0
        for i in range(1, count):
            if values[i] > values[best]:
                best = i
        out[0] = best
        return
    idx = np.arange(count)
    if k >= 2:  # make_heap
        parent = (k - 2) // 2
        while True:
            _sift(idx, values, F(1), parent, k, idx[parent])
            if parent == 0:
                break
            parent -= 1
    for i in range(k, count):  # heap_select
        if values[idx[i]] > values[idx[0]]:
            v = idx[i]
            idx[i] = idx[0]
            _sift(idx, values, F(1), 0, k, v)
    last = k
    while last > 1:  # sort_heap
        last -= 1
        v = idx[last]
        idx[last] = idx[0]
        _sift(idx, values, F(1), 0, last, v)
    out[:k] = idx[:k]


@njit(cache=True)
def _suppress(boxes, scores, threshold, iou_threshold, most, selected):
    """One class's greedy non-max suppression (LiteRT's NonMaxSuppressionSingleClassHelper): the boxes scoring
    at least ``threshold``, best first (a stable sort: equal scores keep the lower box first), each kept unless it
    overlaps a kept one by more than ``iou_threshold``, at most ``most`` of them; their box indices into
    ``selected``, their count returned."""
    n = scores.shape[0]
    keep = np.empty(n, np.int64)
    kept = 0
    for i in range(n):
        if scores[i] >= threshold:
            keep[kept] = i
            kept += 1
    keep_scores = np.empty(kept, np.float32)
    for i in range(kept):
        keep_scores[i] = -scores[keep[i]]
    order = np.argsort(keep_scores, kind="mergesort")
    out_size = min(kept, most)
    active = np.ones(kept, np.bool_)
    n_active = kept
    count = 0
    for i in range(kept):
        if n_active == 0 or count >= out_size:
            break
        if not active[i]:
            continue
        bi = keep[order[i]]
        selected[count] = bi
        count += 1
        active[i] = False
        n_active -= 1
        for j in range(i + 1, kept):
            if active[j] and _iou(boxes, bi, keep[order[j]]) > iou_threshold:
                active[j] = False
                n_active -= 1
    return count


@njit(cache=True)
def _fast(boxes, scores, offset, num_classes, per_box, most, threshold, iou_threshold, out_boxes, out_classes,
          out_scores):
    """The fast suppression: each box ranked by its best class's score, its ``min(per_box, num_classes)`` best
    classes written for each box kept (``per_box`` rows each); returns the boxes kept."""
    n = boxes.shape[0]
    k = min(per_box, num_classes)
    classes = np.empty((n, k), np.int64)
    best = np.empty(n, np.float32)
    row_scores = np.empty(num_classes, np.float32)
    for r in range(n):
        for c in range(num_classes):
            row_scores[c] = scores[r, offset + c]
        _partial_argsort(row_scores, num_classes, k, classes[r])
        best[r] = row_scores[classes[r, 0]]
    selected = np.empty(max(min(n, most), 1), np.int64)
    count = _suppress(boxes, best, threshold, iou_threshold, most, selected)
    for o in range(count):
        b = selected[o]
        for col in range(k):
            at = per_box * o + col
            out_boxes[at, :] = boxes[b, :]
            out_classes[at] = classes[b, col]
            out_scores[at] = scores[b, offset + classes[b, col]]
    return count


@njit(cache=True)
def _regular(boxes, scores, offset, num_classes, per_class, most, threshold, iou_threshold, out_boxes,
             out_classes, out_scores):
    """The regular suppression: each class suppressed on its own (``min(per_class, most)`` boxes at most), the
    ``most`` best of all classes kept; returns the detections kept. As LiteRT merges them on one thread: class by
    class, each class's picks (best first) merged stably into the best so far, so among equal scores the lower
    class, then the class's earlier pick, comes first."""
    n, width = scores.shape
    per_class = min(per_class, most)
    picked = np.empty(2 * most, np.int64)  # box * width + class column, best first
    picked_scores = np.empty(2 * most, np.float32)
    merged = np.empty(most, np.int64)
    merged_scores = np.empty(most, np.float32)
    class_scores = np.empty(n, np.float32)
    selected = np.empty(max(min(n, per_class), 1), np.int64)
    size = 0
    for c in range(num_classes):
        for r in range(n):
            class_scores[r] = scores[r, c + offset]
        count = _suppress(boxes, class_scores, threshold, iou_threshold, per_class, selected)
        total = min(size + count, most)
        i = j = 0
        for k in range(total):  # a stable merge: the earlier list's value first among equals
            if j < count and (i >= size or class_scores[selected[j]] > picked_scores[i]):
                merged[k] = selected[j] * width + c + offset
                merged_scores[k] = class_scores[selected[j]]
                j += 1
            else:
                merged[k] = picked[i]
                merged_scores[k] = picked_scores[i]
                i += 1
        picked[:total] = merged[:total]
        picked_scores[:total] = merged_scores[:total]
        size = total
    for o in range(size):
        box = picked[o] // width
        out_boxes[o, :] = boxes[box, :]
        out_classes[o] = picked[o] - box * width - offset
        out_scores[o] = picked_scores[o]
    return size


def _dequantized(x: np.ndarray, t) -> np.ndarray:
    """A uint8 input's real values in float32 (one rounding of scale times the offset value, as LiteRT's);
    a float32 input as it is."""
    if x.dtype != np.uint8:
        return np.ascontiguousarray(x, F)
    scale, zero = t.quantization.per_tensor if t.quantization is not None else (0.0, 0)
    return ((x.astype(F) - F(zero)) * F(scale)).astype(F)


@register_int("TFLite_Detection_PostProcess")  # (its uint8 inputs dequantized as LiteRT does, not emulated)
@register("TFLite_Detection_PostProcess")
def detection_postprocess(ctx: OpContext):
    p = detection_postprocess_params(ctx)
    box_t, cls_t, anchor_t = (ctx.input_tensor(i) for i in range(3))
    if box_t.dtype not in (np.float32, np.uint8) or cls_t.dtype not in (np.float32, np.uint8):
        raise ctx.fail(f"box encodings {box_t.type_name} and class predictions {cls_t.type_name}: LiteRT's kernel "
                       "takes FLOAT32 or UINT8")
    if anchor_t.dtype != box_t.dtype:
        raise ctx.fail(f"anchors {anchor_t.type_name} with box encodings {box_t.type_name}: LiteRT's kernel reads "
                       "the anchors in the box encodings' type")
    if any(ctx.output_tensor(i).dtype != np.float32 for i in range(4)):
        raise ctx.fail("its four outputs must be FLOAT32")
    if all(-1 not in t.shape_signature for t in (box_t, cls_t, anchor_t)):
        problem = p.input_problem(box_t.shape, cls_t.shape, anchor_t.shape)
        if problem:
            raise ctx.fail(problem)
    suppress = _regular if p.use_regular_nms else _fast
    per = p.detections_per_class if p.use_regular_nms else p.max_classes_per_detection
    scales = np.array(p.scales, F).astype(np.float64)
    threshold, iou_threshold = F(p.score_threshold), F(p.iou_threshold)
    fixed = ctx.const(2)  # (anchors are a model's constant: dequantized once)
    fixed_anchors = None if fixed is None else _dequantized(np.asarray(fixed), anchor_t)

    def run(xs):
        box, cls, anchors = xs[0], xs[1], xs[2]
        problem = p.input_problem(box.shape, cls.shape, anchors.shape)
        if problem:
            raise KernelError(f"TFLite_Detection_PostProcess: {problem}")
        n = box.shape[1]
        decoded = np.empty((n, 4), F)
        _decode(_dequantized(box, box_t)[0], fixed_anchors if fixed_anchors is not None else
                _dequantized(anchors, anchor_t), scales, decoded)
        if np.any(decoded[:, 0] > decoded[:, 2]) or np.any(decoded[:, 1] > decoded[:, 3]):
            raise KernelError("TFLite_Detection_PostProcess: a decoded box has ymin > ymax or xmin > xmax (an "
                              "anchor of negative height or width)")
        rows = p.detections
        out_boxes, out_classes, out_scores = np.zeros((rows, 4), F), np.zeros(rows, F), np.zeros(rows, F)
        count = suppress(decoded, _dequantized(cls, cls_t)[0], cls.shape[2] - p.num_classes, p.num_classes, per,
                         p.max_detections, threshold, iou_threshold, out_boxes, out_classes, out_scores)
        return [out_boxes[None], out_classes[None], out_scores[None], np.array([count], F)]

    return run


# -- NON_MAX_SUPPRESSION_V4 / V5: tf.image.non_max_suppression(_with_scores), one class ----------------------------


@njit(cache=True)
def _corner_iou(boxes, i, j):
    """Intersection over union of boxes ``i`` and ``j`` given as any two opposite corners, in float32; 0 where
    either has no area."""
    zero = np.float32(0.0)
    iy0, iy1 = min(boxes[i, 0], boxes[i, 2]), max(boxes[i, 0], boxes[i, 2])
    ix0, ix1 = min(boxes[i, 1], boxes[i, 3]), max(boxes[i, 1], boxes[i, 3])
    jy0, jy1 = min(boxes[j, 0], boxes[j, 2]), max(boxes[j, 0], boxes[j, 2])
    jx0, jx1 = min(boxes[j, 1], boxes[j, 3]), max(boxes[j, 1], boxes[j, 3])
    area_i = (iy1 - iy0) * (ix1 - ix0)
    area_j = (jy1 - jy0) * (jx1 - jx0)
    if area_i <= zero or area_j <= zero:
        return zero
    inter = max(min(iy1, jy1) - max(iy0, jy0), zero) * max(min(ix1, jx1) - max(ix0, jx0), zero)
    union = area_i + area_j - inter
    if union == zero:
        return zero
    return inter / union


@njit(cache=True)
def _soft_nms(boxes, scores, most, iou_threshold, score_threshold, sigma, selected, selected_scores):
    """TFLite's NonMaxSuppression (reference_ops, TensorFlow's NonMaxSuppressionV5): candidates above
    ``score_threshold`` in a priority queue (GCC's heap, so equal scores come out in its order), each taken unless a
    box selected since it was last looked at overlaps it by ``iou_threshold`` or more; with ``sigma`` > 0 each such
    look decays its score by exp(-0.5 / sigma * iou^2), and a decayed candidate goes back into the queue. Returns
    the count selected; their indices and (decayed) scores fill ``selected`` and ``selected_scores``."""
    n = scores.shape[0]
    index = np.empty(n, np.int64)  # one slot per candidate: its box, its score now, the selections it has seen
    score = np.empty(n, np.float32)
    seen = np.empty(n, np.int64)
    heap = np.empty(n, np.int64)
    size = 0
    for i in range(n):
        if scores[i] > score_threshold:
            index[size], score[size], seen[size] = i, scores[i], 0
            _push_up(heap, score, F(-1), size, 0, size)  # push_heap: the new last moved up
            size += 1
    count = 0
    outputs = min(size, most)
    scale = F(-0.5) / sigma if sigma > F(0) else F(0)
    while count < outputs and size > 0:
        c = heap[0]
        if size > 1:  # pop_heap: the last moved to the root and sifted down
            last = heap[size - 1]
            heap[size - 1] = heap[0]
            _sift(heap, score, F(-1), 0, size - 1, last)
        size -= 1
        original = score[c]
        hard = False
        for j in range(count - 1, seen[c] - 1, -1):
            iou = _corner_iou(boxes, index[c], selected[j])
            if iou >= iou_threshold:
                hard = True
                break
            if sigma > F(0):
                score[c] = score[c] * np.exp(scale * iou * iou)
            if score[c] <= score_threshold:
                break
        seen[c] = count
        if not hard:
            if score[c] == original:
                selected[count] = index[c]
                selected_scores[count] = score[c]
                count += 1
            if score[c] > score_threshold:
                _push_up(heap, score, F(-1), size, 0, c)
                size += 1
    return count


def _scalar(x: np.ndarray, what: str):
    if np.ndim(x) != 0:
        raise KernelError(f"{what} of shape {list(np.shape(x))}: a scalar is needed")
    return x[()]


def _non_max_suppression(soft: bool):
    def factory(ctx: OpContext):
        boxes_t, scores_t = ctx.input_tensor(0), ctx.input_tensor(1)
        if boxes_t.dtype != np.float32 or scores_t.dtype != np.float32:
            raise ctx.fail(f"boxes {boxes_t.type_name} and scores {scores_t.type_name}: FLOAT32 is needed")
        if -1 not in boxes_t.shape_signature + scores_t.shape_signature and (
                boxes_t.shape[1] != 4 or scores_t.shape[0] != boxes_t.shape[0]):
            raise ctx.fail(f"boxes {list(boxes_t.shape)} and scores {list(scores_t.shape)}: [boxes, 4] and [boxes] "
                           "are needed")
        fixed = ctx.const(2)
        if fixed is not None and int(fixed.reshape(-1)[0]) < 0:
            raise ctx.fail(f"max_output_size {int(fixed.reshape(-1)[0])} must be >= 0")
        index_type = ctx.output_tensor(0).dtype

        def run(xs):
            boxes, scores = np.ascontiguousarray(xs[0], F), np.ascontiguousarray(xs[1], F)
            if boxes.ndim != 2 or boxes.shape[1] != 4 or scores.shape != (boxes.shape[0],):
                raise KernelError(f"boxes {list(boxes.shape)} and scores {list(scores.shape)}: [boxes, 4] and "
                                  "[boxes] are needed")
            most = int(_scalar(xs[2], "max_output_size"))
            if most < 0:
                raise KernelError(f"max_output_size {most} must be >= 0")
            sigma = F(_scalar(xs[5], "soft_nms_sigma")) if soft else F(0)
            if sigma < 0:
                raise KernelError(f"Invalid sigma value for soft NMS: {sigma}")
            selected, selected_scores = np.zeros(most, np.int64), np.zeros(most, F)
            count = _soft_nms(boxes, scores, most, F(_scalar(xs[3], "iou_threshold")),
                              F(_scalar(xs[4], "score_threshold")), sigma, selected, selected_scores)
            out = [selected.astype(index_type)] + ([selected_scores] if soft else [])  # (zeros past the count)
            return [*out, np.array(count, np.int32)]

        return run

    return factory


register("NON_MAX_SUPPRESSION_V4")(_non_max_suppression(soft=False))
register("NON_MAX_SUPPRESSION_V5")(_non_max_suppression(soft=True))
