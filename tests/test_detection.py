"""TFLite_Detection_PostProcess, the last op of an SSD exported by TensorFlow's object-detection API (the
``detect.tflite`` of TFLite's examples): LiteRT runs it as a builtin custom op, so a drop-in must. Checked against
LiteRT on one thread (on several, its regular suppression orders ties between classes by which thread took them):
the fast and the regular suppression, float and uint8 inputs, ties, boxes with keypoints, no boxes; a model's
malformed options and inputs refused with their names; and a small SSD whose convolutions run on the OpenCL
device while the suppression runs on the CPU kernels. Then NON_MAX_SUPPRESSION_V4 / V5 (tf.image's one-class
suppression, hard and soft) the same way."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from flatbuffers import flexbuffers

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder
from tflgpu.model.reader import read_model
from tflgpu.ops.shapes import output_shapes

from .conftest import litert, run_model

OP = "TFLite_Detection_PostProcess"
F = np.float32


@dataclass(frozen=True)
class Case:
    boxes: int
    classes: int
    background: int  # 1: a background class's score before the classes' (label offset 1)
    max_detections: int
    per_box: int  # max_classes_per_detection
    regular: bool
    per_class: int | None  # detections_per_class; None: absent (LiteRT's default, 100)
    quantized: bool  # uint8 box encodings, scores and anchors
    coords: int  # values per box encoding (4, or more: keypoints after the box)
    threshold: float
    iou: float

    @property
    def rows(self) -> int:
        return self.max_detections * self.per_box


def options(case: Case, **changes) -> bytes:
    o = {"max_detections": case.max_detections, "max_classes_per_detection": case.per_box,
         "use_regular_nms": case.regular, "nms_score_threshold": case.threshold, "nms_iou_threshold": case.iou,
         "num_classes": case.classes, "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0}
    if case.per_class is not None:
        o["detections_per_class"] = case.per_class
    o.update(changes)
    return bytes(flexbuffers.Dumps({k: v for k, v in o.items() if v is not None}))


def postprocess_model(case: Case, rng, custom: bytes | None = None, anchors: np.ndarray | None = None,
                      box_type=None, batch: int = 1) -> bytes:
    """Box encodings and class predictions as inputs, the anchors a constant, the op's four outputs."""
    b = ModelBuilder()
    n, width = case.boxes, case.classes + case.background
    if case.quantized:
        box = b.input("box_encodings", [batch, n, case.coords], box_type or np.uint8,
                      quant={"scale": [0.05], "zero_point": [128]})
        cls = b.input("class_predictions", [batch, n, width], np.uint8, quant={"scale": [1 / 255], "zero_point": [0]})
        if anchors is None:
            anchors = np.concatenate([rng.integers(20, 230, (n, 2)), rng.integers(5, 100, (n, 2))], 1).astype(np.uint8)
        a = b.const("anchors", anchors, quant={"scale": [1 / 255], "zero_point": [0]})
    else:
        box = b.input("box_encodings", [batch, n, case.coords], box_type or F)
        cls = b.input("class_predictions", [batch, n, width])
        if anchors is None:
            anchors = np.concatenate([rng.uniform(0.1, 0.9, (n, 2)), rng.uniform(0.02, 0.4, (n, 2))], 1).astype(F)
        a = b.const("anchors", anchors)
    outs = [b.tensor("detection_boxes", [1, case.rows, 4]), b.tensor("detection_classes", [1, case.rows]),
            b.tensor("detection_scores", [1, case.rows]), b.tensor("num_detections", [1])]
    b.op(OP, [box, cls, a], outs, custom_options=custom if custom is not None else options(case))
    b.output(*outs)
    return b.build()


def feeds(case: Case, rng, levels: int = 0) -> list[np.ndarray]:
    """Random box encodings and scores; ``levels`` > 0: scores of that many values only (ties everywhere)."""
    n, width = case.boxes, case.classes + case.background
    if case.quantized:
        scores = rng.integers(0, levels or 256, (1, n, width)).astype(np.uint8)
        return [rng.integers(0, 256, (1, n, case.coords)).astype(np.uint8), scores]
    scores = rng.uniform(0, 1, (1, n, width)).astype(F)
    if levels:
        scores = (np.round(scores * (levels - 1)) / (levels - 1)).astype(F)
    return [rng.normal(0, 1, (1, n, case.coords)).astype(F), scores]


def run(model: bytes, feeds: list, reference: bool = False, **kw) -> list[np.ndarray]:
    """Our outputs, or LiteRT's on one thread (``reference``)."""
    return run_model(litert(), model, feeds, num_threads=1) if reference else run_model(Interpreter, model, feeds, **kw)


def written(case: Case, outputs: list[np.ndarray]) -> list[np.ndarray]:
    """The rows LiteRT writes: the fast suppression's ``min(per_box, classes)`` rows of each detection found (it
    leaves the others as they were), the regular one's first ``max_detections`` (zeros past those found)."""
    count = int(outputs[3][0])
    if case.regular:
        rows = np.arange(case.max_detections)
    else:
        k = min(case.per_box, case.classes)
        rows = np.array([d * case.per_box + c for d in range(count) for c in range(k)], int)
    return [o[0][rows] for o in outputs[:3]] + [outputs[3]]


def assert_same(case: Case, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert [o.shape for o in got] == [(1, case.rows, 4), (1, case.rows), (1, case.rows), (1,)]
    assert got[3][0] == want[3][0], (case, got[3], want[3])
    for g, w, what in zip(written(case, got), written(case, want), ("boxes", "classes", "scores", "count")):
        np.testing.assert_array_equal(g, w, err_msg=f"{what} of {case}")


def random_case(seed: int, regular: bool, quantized: bool) -> tuple[Case, int]:
    rng = np.random.default_rng(seed)
    case = Case(boxes=int(rng.choice([0, 1, 7, 60, 400])), classes=int(rng.integers(1, 12)),
                background=int(rng.integers(0, 2)), max_detections=int(rng.integers(1 if regular else 0, 25)),
                per_box=int(rng.integers(1, 4)), regular=regular,
                per_class=None if rng.random() < 0.4 else int(rng.integers(1, 30)), quantized=quantized,
                coords=4 if rng.random() < 0.7 else int(rng.integers(5, 10)),
                threshold=float(rng.choice([-1.0, 0.0, 0.1, 0.5, 0.9])), iou=float(rng.choice([0.1, 0.5, 0.6, 1.0])))
    levels = int(rng.choice([0, 0, 3, 8]))  # ties: among a box's classes, between boxes, between classes
    return case, levels


@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "uint8"])
def test_matches_litert(regular, quantized):
    """60 random cases per suppression and type (seeded), LiteRT's outputs value for value, ties included."""
    for seed in range(60):
        case, levels = random_case(seed * 4 + 2 * regular + quantized, regular, quantized)
        rng = np.random.default_rng(seed)
        model, inputs = postprocess_model(case, rng), feeds(case, rng, levels)
        assert_same(case, run(model, inputs), run(model, inputs, reference=True))


def test_ties_follow_litert_sorts():
    """Scores of three levels: the fast suppression's classes of a box ranked by GCC's heap-based partial sort
    (three per box), the boxes by a stable sort; the regular suppression merging classes stably (a lower class
    first among equal scores). A plain stable sort gives other rows in the first case."""
    rng = np.random.default_rng(7)
    for regular in (False, True):
        case = Case(200, 9, 1, 20, 3, regular, 10, False, 4, 0.0, 0.5)
        model, inputs = postprocess_model(case, rng), feeds(case, rng, levels=3)
        got, want = run(model, inputs), run(model, inputs, reference=True)
        assert_same(case, got, want)
        assert want[3][0] == 20
    boxes = written(Case(200, 9, 1, 20, 3, False, 10, False, 4, 0.0, 0.5), want)
    assert boxes[1].size == 60  # (three classes of each of the 20 boxes: where equal scores' order shows)


def test_defaults_as_litert():
    """detections_per_class, use_regular_nms and nms_score_threshold absent: LiteRT's 100, fast, 0."""
    case = Case(50, 4, 1, 8, 2, False, None, False, 4, 0.0, 0.5)
    rng = np.random.default_rng(3)
    model = postprocess_model(case, rng, custom=options(case, use_regular_nms=None, nms_score_threshold=None))
    inputs = feeds(case, rng)
    assert_same(case, run(model, inputs), run(model, inputs, reference=True))


@pytest.mark.parametrize(("change", "words"), [
    ({"max_detections": None}, "custom option 'max_detections' is missing"),
    ({"y_scale": None}, "custom option 'y_scale' is missing"),
    ({"nms_iou_threshold": 0.0}, "nms_iou_threshold 0.0 must lie in (0, 1]"),
    ({"max_classes_per_detection": 0}, "max_classes_per_detection 0 (>= 1)"),
    ({"num_classes": 5}, "hold 7 scores per box for num_classes 5"),
    ({"use_regular_nms": True, "max_detections": 0}, "the regular suppression needs both >= 1"),
    ({"w_scale": 0.0}, "must be finite and non-zero"),
    ({"x_scale": "ten"}, "custom option 'x_scale' is 'ten', not a number"),
])
def test_bad_options_named(change, words):
    """Options LiteRT reads as 0 and fails on at invoke (or computes nonsense from) are refused when the model is
    prepared, naming the option."""
    case = Case(30, 6, 1, 5, 1, False, None, False, 4, 0.1, 0.5)
    model = postprocess_model(case, np.random.default_rng(0), custom=options(case, **change))
    it = Interpreter(model_content=model)
    with pytest.raises(RuntimeError, match=r"Node number 0 \(TFLite_Detection_PostProcess\) failed to prepare") as e:
        it.allocate_tensors()
    assert words in str(e.value)


def test_bad_inputs_named():
    case = Case(30, 6, 1, 5, 1, False, None, False, 4, 0.1, 0.5)
    rng = np.random.default_rng(0)
    bad = {
        "anchors [20, 4]: [boxes, 4] (y, x, h, w) are needed for 30 boxes":
            postprocess_model(case, rng, anchors=np.ones((20, 4), F)),
        "LiteRT's kernel takes batch 1": postprocess_model(case, rng, batch=2),
        "box encodings INT8 and class predictions FLOAT32": postprocess_model(case, rng, box_type=np.int8),
        "anchors FLOAT32 with box encodings UINT8": postprocess_model(
            Case(30, 6, 1, 5, 1, False, None, True, 4, 0.1, 0.5), rng, anchors=np.ones((30, 4), F)),
    }
    for words, model in bad.items():
        with pytest.raises(RuntimeError, match="failed to prepare") as e:
            Interpreter(model_content=model).allocate_tensors()
        assert words in str(e.value)


def test_negative_anchor_refused_at_invoke():
    """An anchor of negative height decodes a box with ymin > ymax: LiteRT's kernel fails, and so does ours."""
    case = Case(10, 3, 1, 5, 1, False, None, False, 4, 0.0, 0.5)
    rng = np.random.default_rng(1)
    anchors = np.tile(np.array([[0.5, 0.5, 0.2, 0.2]], F), (10, 1))
    anchors[4, 2] = -0.2
    model, inputs = postprocess_model(case, rng, anchors=anchors), feeds(case, rng)
    with pytest.raises(RuntimeError, match="failed to invoke"):
        run(model, inputs, reference=True)
    with pytest.raises(RuntimeError, match=r"failed to invoke: .*ymin > ymax"):
        run(model, inputs)


def test_output_shapes_from_options():
    """Shape propagation takes the outputs' rows from the options without running the kernel; a node whose
    inputs are wrong is left to the kernel, which names what is wrong."""
    case = Case(30, 6, 1, 7, 2, False, None, False, 4, 0.1, 0.5)
    m = read_model(postprocess_model(case, np.random.default_rng(0)))
    op = m.subgraphs[0].operators[0]
    assert output_shapes(op, [(1, 30, 4), (1, 30, 7), (30, 4)], [None] * 3) == [(1, 14, 4), (1, 14), (1, 14), (1,)]
    assert output_shapes(op, [(1, 30, 4), (1, 29, 7), (30, 4)], [None] * 3) is None


def ssd_model(rng, classes: int = 6, anchors_per_cell: int = 3, side: int = 12, regular: bool = False) -> bytes:
    """A small SSD: a strided conv, a box predictor and a class predictor (1x1 convs, reshaped), sigmoid scores,
    anchors on the feature grid, then the post-processing op."""
    b = ModelBuilder()
    grid = side // 2
    cells = grid * grid * anchors_per_cell

    def conv(x, out_ch, in_ch, k, stride, name, bias=0.0, act="NONE", shape=None):
        y = b.tensor(name, shape or [1, grid, grid, out_ch])
        w = b.const(f"{name}/w", rng.normal(0, 0.5, (out_ch, k, k, in_ch)).astype(F))
        b.op("CONV_2D", [x, w, b.const(f"{name}/b", np.full(out_ch, bias, F))], [y], padding="SAME",
             stride_h=stride, stride_w=stride, fused_activation_function=act)
        return y

    def reshape(x, shape, name):
        y = b.tensor(name, shape)
        b.op("RESHAPE", [x, b.const(f"{name}/shape", np.array(shape, np.int32))], [y], new_shape=shape)
        return y

    feature = conv(b.input("image", [1, side, side, 3]), 16, 3, 3, 2, "feature", act="RELU")
    box = reshape(conv(feature, anchors_per_cell * 4, 16, 1, 1, "box_conv"), [1, cells, 4], "box_encodings")
    logits = reshape(conv(feature, anchors_per_cell * (classes + 1), 16, 1, 1, "class_conv", bias=-2.0),
                     [1, cells, classes + 1], "class_logits")
    scores = b.tensor("class_scores", [1, cells, classes + 1])
    b.op("LOGISTIC", [logits], [scores])
    yy, xx, aa = np.meshgrid((np.arange(grid) + 0.5) / grid, (np.arange(grid) + 0.5) / grid,
                             np.arange(anchors_per_cell), indexing="ij")
    size = np.array([0.1, 0.2, 0.35])[aa]
    anchors = np.stack([yy, xx, size, size * 1.3], -1).reshape(-1, 4).astype(F)
    case = Case(cells, classes, 1, 10, 1, regular, 100, False, 4, 1e-8, 0.6)
    outs = [b.tensor("detection_boxes", [1, 10, 4]), b.tensor("detection_classes", [1, 10]),
            b.tensor("detection_scores", [1, 10]), b.tensor("num_detections", [1])]
    b.op(OP, [box, scores, b.const("anchors", anchors)], outs, custom_options=options(case))
    b.output(*outs)
    return b.build()


@pytest.mark.parametrize("regular", [False, True], ids=["fast", "regular"])
def test_ssd_through_delegate(opencl_device, regular):
    """The convolutions on the OpenCL device, the post-processing on the CPU kernels, as TFLite's GPU delegate
    splits such a model: LiteRT's detections (the same boxes and classes; the device's sums may differ from
    LiteRT's in the last bits)."""
    rng = np.random.default_rng(11)
    model = ssd_model(rng, regular=regular)
    image = rng.uniform(-1, 1, (1, 12, 12, 3)).astype(F)
    want = run(model, [image], reference=True)
    assert want[3][0] == 10
    it = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()])
    it.allocate_tensors()
    assert "6 ops on device, 1 on cpu" in it.backend
    it.set_tensor(it.get_input_details()[0]["index"], image)
    it.invoke()
    got = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[3], want[3])
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got[2], want[2], rtol=0, atol=1e-5)


# -- NON_MAX_SUPPRESSION_V4 / V5 (tf.image.non_max_suppression, _with_scores) --------------------------------------


def nms_model(boxes: int, soft: bool, most: int, iou: float, threshold: float, sigma: float,
              most_as_input: bool = False, gather: bool = False) -> bytes:
    """Boxes [n, 4] and scores [n] as inputs, the thresholds constants; max_output_size a constant or an input;
    ``gather``: the selected boxes gathered after it (as a detector's graph does)."""
    b = ModelBuilder()
    box, score = b.input("boxes", [boxes, 4]), b.input("scores", [boxes])
    size = (b.input("max_output_size", [], np.int32) if most_as_input
            else b.const("max_output_size", np.array(most, np.int32)))
    ins = [box, score, size, b.const("iou_threshold", np.array(iou, F)),
           b.const("score_threshold", np.array(threshold, F))]
    rows = max(most, 0)  # (declared; the kernel sizes them)
    outs = [b.tensor("selected_indices", [rows], np.int32)]
    if soft:
        ins.append(b.const("soft_nms_sigma", np.array(sigma, F)))
        outs.append(b.tensor("selected_scores", [rows]))
    outs.append(b.tensor("valid_outputs", [], np.int32))
    b.op("NON_MAX_SUPPRESSION_V5" if soft else "NON_MAX_SUPPRESSION_V4", ins, outs)
    if gather:
        picked = b.tensor("selected_boxes", [rows, 4])
        b.op("GATHER", [box, outs[0]], [picked], axis=0)
        outs.append(picked)
    b.output(*outs)
    return b.build()


def nms_feeds(rng, boxes: int, levels: int, swapped: bool) -> list[np.ndarray]:
    centre, size = rng.uniform(0, 1, (boxes, 2)), rng.uniform(0.02, 0.4, (boxes, 2))
    corners = np.concatenate([centre - size / 2, centre + size / 2], 1)
    if swapped:  # (either pair of opposite corners is a box)
        corners = corners[:, [2, 3, 0, 1]]
    scores = rng.uniform(0, 1, boxes)
    if levels:
        scores = np.round(scores * (levels - 1)) / (levels - 1)
    return [corners.astype(F), scores.astype(F)]


@pytest.mark.parametrize("soft", [False, True], ids=["v4", "v5"])
def test_non_max_suppression_matches_litert(soft):
    """120 random cases per version (seeded): hard and soft suppression (sigma 0 to 1), thresholds from -inf,
    IoU thresholds 0 to 1.5, scores with ties (the priority queue's order among them is GCC's heap's), boxes
    with their corners either way round, max_output_size a constant or an input: LiteRT's outputs exactly, zeros
    past the count."""
    for seed in range(120):
        rng = np.random.default_rng(seed * 2 + soft)
        boxes, most = int(rng.choice([0, 1, 5, 40, 300])), int(rng.integers(0, 30))
        as_input = bool(rng.random() < 0.3) and most > 0  # (LiteRT cannot read back a computed size 0)
        model = nms_model(boxes, soft, most, float(rng.choice([0.0, 0.3, 0.5, 0.7, 1.0, 1.5])),
                          float(rng.choice([-np.inf, -1.0, 0.0, 0.2, 0.6])), float(rng.choice([0.0, 0.1, 0.5, 1.0])),
                          most_as_input=as_input)
        inputs = nms_feeds(rng, boxes, int(rng.choice([0, 0, 3, 10])), bool(rng.random() < 0.3))
        inputs += [np.array(most, np.int32)] if as_input else []
        got, want = run(model, inputs), run(model, inputs, reference=True)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (seed, g.shape, w.shape)
            np.testing.assert_array_equal(g, w, err_msg=f"seed {seed}")


def test_non_max_suppression_refusals():
    rng = np.random.default_rng(0)
    inputs = nms_feeds(rng, 20, 0, False)
    model = nms_model(20, True, 5, 0.5, 0.0, -0.5)
    with pytest.raises(RuntimeError, match="failed to invoke"):
        run(model, inputs, reference=True)
    with pytest.raises(RuntimeError, match="Invalid sigma value for soft NMS: -0.5"):
        run(model, inputs)
    with pytest.raises(RuntimeError, match=r"failed to prepare: max_output_size -1 must be >= 0"):
        Interpreter(model_content=nms_model(20, False, -1, 0.5, 0.0, 0.0)).allocate_tensors()


def test_non_max_suppression_through_delegate(opencl_device):
    """The suppression on the CPU kernels, the GATHER of the boxes it selects on the device: its rows are
    max_output_size whatever the count (zeros past it, as LiteRT's), so the plan's shapes are fixed."""
    rng = np.random.default_rng(4)
    model = nms_model(50, True, 30, 0.3, 0.5, 0.5, gather=True)
    inputs = nms_feeds(rng, 50, 0, False)
    want = run(model, inputs, reference=True)
    it = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()])
    it.allocate_tensors()
    assert "1 ops on device, 1 on cpu" in it.backend
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    got = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    assert 0 < want[2] < 30
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
