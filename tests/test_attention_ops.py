"""MediaPipe's face-mesh attention ops (Landmarks2TransformMatrix, TransformTensorBilinear, TransformLandmarks;
versions 1 and 2), which LiteRT cannot run: checked against references written here, loop by loop, from
MediaPipe's published kernels (mediapipe/util/tflite/operations/), on the CPU kernels and on the OpenCL
device; and a small model chaining them as the face mesh does, its plain-TFLite middle run by LiteRT."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flatbuffers import flexbuffers

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, assert_fp16_close, litert, run_model


def flex(**options) -> bytes:
    return bytes(flexbuffers.Dumps(options))


# -- references -------------------------------------------------------------------------------------------------

def _mat(rows):
    return [list(map(float, r)) for r in rows]


def _mul(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def ref_matrix_v1(lm, o):
    (lx, ly), (rx, ry) = lm[o["left_rotation_idx"]][:2], lm[o["right_rotation_idx"]][:2]
    a = -math.atan((ry - ly) / (rx - lx))
    flat = o["subset"] + ([o["subset"][-1]] if len(o["subset"]) % 2 else [])
    hi, lo = [-100000.0, -100000.0], [100000.0, 100000.0]
    for i in flat:
        x, y = lm[i][0], lm[i][1]
        px, py = x * math.cos(a) - y * math.sin(a), x * math.sin(a) + y * math.cos(a)
        hi, lo = [max(hi[0], px), max(hi[1], py)], [min(lo[0], px), min(lo[1], py)]
    rng, mult = o["landmarks_range"], o["bbox_size_multiplier"]
    bw, bh = (hi[0] - lo[0]) * mult, (hi[1] - lo[1]) * mult
    mx, my = (hi[0] + lo[0]) / 2, (hi[1] + lo[1]) / 2
    rmx, rmy = mx * math.cos(-a) - my * math.sin(-a), mx * math.sin(-a) + my * math.cos(-a)
    in_h, in_w = o["input_hw"]
    out_h, out_w = o["output_hw"]
    m = _mul(_mul(_mul(
        _mat([[(in_w - 1) / 2, 0, (in_w - 1) / 2], [0, (in_h - 1) / 2, (in_h - 1) / 2], [0, 0, 1]]),
        _mat([[math.cos(-a), -math.sin(-a), rmx / rng * 2 - 1], [math.sin(-a), math.cos(-a), rmy / rng * 2 - 1],
              [0, 0, 1]])),
        _mat([[bw / rng, 0, 0], [0, bh / rng, 0], [0, 0, 1]])),
        _mat([[2 / (out_w - 1), 0, -1], [0, 2 / (out_h - 1), -1], [0, 0, 1]]))
    return [[m[0][0], m[0][1], 0, m[0][2]], [m[1][0], m[1][1], 0, m[1][2]], [m[2][0], m[2][1], m[2][2], 0],
            [0, 0, 0, 1]]


def ref_matrix_v2(lm, o):
    (lx, ly), (rx, ry) = lm[o["left_rotation_idx"]][:2], lm[o["right_rotation_idx"]][:2]
    r = o["target_rotation_radians"] - math.atan2(ry - ly, rx - lx)
    idx = o["subset_idxs"] + ([o["subset_idxs"][-1]] if len(o["subset_idxs"]) % 2 else [])
    pts = [(lm[i][0] * math.cos(r) - lm[i][1] * math.sin(r), lm[i][0] * math.sin(r) + lm[i][1] * math.cos(r))
           for i in idx]
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    w, h = max(xs) - min(xs), max(ys) - min(ys)
    cx, cy = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2
    cx, cy = cx * math.cos(-r) - cy * math.sin(-r), cx * math.sin(-r) + cy * math.cos(-r)
    t = _mat([[1, 0, 0, cx], [0, 1, 0, cy], [0, 0, 1, 0], [0, 0, 0, 1]])
    t = _mul(t, _mat([[math.cos(-r), -math.sin(-r), 0, 0], [math.sin(-r), math.cos(-r), 0, 0], [0, 0, 1, 0],
                      [0, 0, 0, 1]]))
    t = _mul(t, _mat([[o["scale_x"] * w / o["output_width"], 0, 0, 0], [0, o["scale_y"] * h / o["output_height"], 0, 0],
                      [0, 0, 1, 0], [0, 0, 0, 1]]))
    return _mul(t, _mat([[1, 0, 0, -o["output_width"] / 2], [0, 1, 0, -o["output_height"] / 2], [0, 0, 1, 0],
                         [0, 0, 0, 1]]))


def ref_transform_tensor(x, m, out_h, out_w, align):
    _, h, w, c = x.shape
    rx, ry = list(m[0:4]), list(m[4:8])
    if align:
        rx[3] += rx[0] * 0.5 + rx[1] * 0.5 - 0.5
        ry[3] += ry[0] * 0.5 + ry[1] * 0.5 - 0.5
    out = np.zeros((1, out_h, out_w, c), np.float64)

    def read(yy, xx, z):
        return 0.0 if yy < 0 or xx < 0 or yy >= h or xx >= w else float(x[0, yy, xx, z])

    for oy in range(out_h):
        for ox in range(out_w):
            tx, ty = rx[0] * ox + rx[1] * oy + rx[3], ry[0] * ox + ry[1] * oy + ry[3]
            if tx < 0 or tx > w - 1 or ty < 0 or ty > h - 1:
                continue
            fx, fy = math.floor(tx), math.floor(ty)
            ax, ay = tx - fx, ty - fy
            for z in range(c):
                upper = (1 - ax) * read(fy, fx, z) + ax * read(fy, fx + 1, z)
                lower = (1 - ax) * read(fy + 1, fx, z) + ax * read(fy + 1, fx + 1, z)
                out[0, oy, ox, z] = ay * lower + (1 - ay) * upper
    return out


def ref_transform_landmarks(lm, m, dims, scale):
    out = np.array(lm, np.float64)
    flat = out.reshape(-1, dims)
    src = np.array(lm, np.float64).reshape(-1, dims)
    for i in range(len(flat)):
        x, y = src[i, 0], src[i, 1]
        flat[i, 0] = m[0] * x + m[1] * y + m[3] * scale
        flat[i, 1] = m[4] * x + m[5] * y + m[7] * scale
    return out


# -- single-op models ------------------------------------------------------------------------------------------

def _one_op(op: str, version: int, options: bytes, ins: list[np.ndarray], out_shape) -> bytes:
    b = ModelBuilder()
    idx = [b.input(f"in{i}", x.shape) for i, x in enumerate(ins)]
    y = b.tensor("out", out_shape)
    b.op(op, idx, [y], custom_options=options, version=version)
    b.output(y)
    return b.build()


PATHS = ["cpu", "gpu-fp32", "gpu-fp16"]


def _ours(model: bytes, ins, path: str, opencl_device=None):
    if path == "cpu":
        return run_model(Interpreter, model, ins)
    if path == "gpu-fp16" and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    it = Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=path == "gpu-fp16"))
    assert it.gpu_plan is not None and it.gpu_plan.cpu_op_count == 0, it.backend
    return run_model(lambda **kw: it, model, ins)


def _check(got, want, path):
    (assert_fp16_close if path == "gpu-fp16" else assert_close)(got, np.asarray(want, np.float32))


def _landmarks(rng, n: int, scale: float = 100.0) -> np.ndarray:
    return (rng.uniform(0, 1, (n, 3)) * [scale, scale, 10]).astype(np.float32)


V1_MATRIX = {"input_hw": [64, 48], "output_hw": [16, 12], "dimensions": 3, "landmarks_range": 100,
             "bbox_size_multiplier": 1.5, "left_rotation_idx": 3, "right_rotation_idx": 7,
             "subset": [0, 5, 9, 12, 14, 2, 11]}
V2_MATRIX = {"left_rotation_idx": 3, "right_rotation_idx": 7, "target_rotation_radians": 0.3, "output_height": 16,
             "output_width": 12, "scale_x": 1.5, "scale_y": 1.25, "subset_idxs": [0, 5, 9, 12, 14, 2, 11]}


@pytest.fixture(params=PATHS)
def path(request):
    if request.param != "cpu":
        request.getfixturevalue("opencl_device")
    return request.param


@pytest.mark.parametrize("version", [1, 2])
def test_landmarks_to_transform_matrix(version, path, rng, request):
    lm = _landmarks(rng, 15)
    opts = V1_MATRIX if version == 1 else V2_MATRIX
    x = lm.reshape(1, 1, 1, 45) if version == 1 else lm.reshape(1, 15, 3)
    model = _one_op("Landmarks2TransformMatrix", version, flex(**opts), [x], (1, 4, 4))
    want = (ref_matrix_v1 if version == 1 else ref_matrix_v2)(lm.astype(np.float64).tolist(), opts)
    (got,) = _ours(model, [x], path, request.getfixturevalue("opencl_device") if path != "cpu" else None)
    _check(got, np.array(want).reshape(1, 4, 4), path)


def _matrix(rng) -> np.ndarray:
    """A rotation-scale-shift matrix mapping a 12x16 crop into a 24x20 input, part of it outside."""
    a, s = rng.uniform(-0.4, 0.4), rng.uniform(1.1, 1.4)
    return np.array([[s * np.cos(a), -s * np.sin(a), 0, rng.uniform(5, 9)],
                     [s * np.sin(a), s * np.cos(a), 0, rng.uniform(3, 6)], [0, 0, 1, 0], [0, 0, 0, 1]],
                    np.float32).reshape(1, 4, 4)


@pytest.mark.parametrize("name,version,channels", [("TransformTensorBilinear", 2, 5), ("TransformTensorBilinear", 1, 8),
                                                    ("TransformTensor", 1, 3)])
def test_transform_tensor_bilinear(name, version, channels, path, rng, request):
    x = rng.uniform(-1, 1, (1, 20, 24, channels)).astype(np.float32)
    m = _matrix(rng)
    opts = flex(output_height=16, output_width=12) if version == 2 else flex(mode="bilinear", output_size=[16, 12])
    model = _one_op(name, version, opts, [x, m], (1, 16, 12, channels))
    want = ref_transform_tensor(x, m.reshape(-1).astype(np.float64), 16, 12, version == 2)
    assert (want == 0).mean() > 0.05 and (want != 0).mean() > 0.3  # both in- and out-of-bounds samples
    if path == "gpu-fp16":  # FP16 storage hands the kernel a rounded matrix: it must sample where that one says
        half = [a.astype(np.float16).astype(np.float64) for a in (x, m.reshape(-1))]
        want = ref_transform_tensor(half[0], half[1], 16, 12, version == 2)
    (got,) = _ours(model, [x, m], path, request.getfixturevalue("opencl_device") if path != "cpu" else None)
    _check(got, want, path)


@pytest.mark.parametrize("version,shape,dims,scale", [(2, (1, 30, 3), 3, 1.0), (2, (1, 7, 2), 2, 1.0),
                                                      (1, (1, 1, 1, 90), 3, 0.5), (1, (1, 2, 3, 8), 2, 2.0)])
def test_transform_landmarks(version, shape, dims, scale, path, rng, request):
    lm = rng.uniform(0, 16, shape).astype(np.float32)
    m = _matrix(rng)
    opts = flex(dimensions=dims, scale=scale) if version == 1 else flex()
    model = _one_op("TransformLandmarks", version, opts, [lm, m], shape)
    want = ref_transform_landmarks(lm, m.reshape(-1).astype(np.float64), dims, scale)
    (got,) = _ours(model, [lm, m], path, request.getfixturevalue("opencl_device") if path != "cpu" else None)
    _check(got, want, path)


@pytest.mark.parametrize("op,version,options,why", [
    ("Landmarks2TransformMatrix", 2, b"\x00\x01\x02", "not a flexbuffer map"),
    ("Landmarks2TransformMatrix", 2, flex(**{**V2_MATRIX, "scale_x": 0.0}), "must be > 0"),
    ("Landmarks2TransformMatrix", 2, flex(**{k: v for k, v in V2_MATRIX.items() if k != "subset_idxs"}),
     "'subset_idxs' is missing"),
    ("Landmarks2TransformMatrix", 3, flex(**V2_MATRIX), "versions 1 and 2"),
    ("TransformTensorBilinear", 1, flex(mode="nearest", output_size=[16, 12]), "only bilinear"),
    ("TransformLandmarks", 1, flex(dimensions=4, scale=1.0), "dimensions 4"),
    ("Landmarks2TransformMatrix", 2, flex(**{**V2_MATRIX, "subset_idxs": [0, 15]}), "name landmark 15, the input"),
])
def test_bad_options_are_refused_at_allocate(op, version, options, why):
    ins = {"Landmarks2TransformMatrix": [np.zeros((1, 15, 3), np.float32)],
           "TransformTensorBilinear": [np.zeros((1, 8, 8, 2), np.float32), np.zeros((1, 4, 4), np.float32)],
           "TransformLandmarks": [np.zeros((1, 1, 1, 12), np.float32), np.zeros((1, 4, 4), np.float32)]}[op]
    out = {"Landmarks2TransformMatrix": (1, 4, 4), "TransformTensorBilinear": (1, 16, 12, 2),
           "TransformLandmarks": (1, 1, 1, 12)}[op]
    it = Interpreter(model_content=_one_op(op, version, options, ins, out))
    with pytest.raises(RuntimeError, match=f"Node number 0 \\({op}\\) failed to prepare: .*{why}"):
        it.allocate_tensors()


# -- the face mesh's pattern -----------------------------------------------------------------------------------

def _middle(b: ModelBuilder, rng, crop: int) -> int:
    """crop [1, 16, 12, 8] -> conv 3x3 (6) -> MEAN -> RESHAPE [1, 2, 3]: local landmarks in crop pixels."""
    w = b.const("conv/w", (rng.standard_normal((6, 3, 3, 8)) * 0.2).astype(np.float32))
    bias = b.const("conv/b", np.float32([6, 8, 1, 10, 4, 2]))
    conv = b.tensor("conv", (1, 16, 12, 6))
    b.op("CONV_2D", [crop, w, bias], [conv], padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU")
    pooled = b.tensor("pooled", (1, 6))
    b.op("MEAN", [conv, b.const("axes", np.int32([1, 2]))], [pooled], keep_dims=False)
    local = b.tensor("local", (1, 2, 3))
    b.op("RESHAPE", [pooled, b.const("shape", np.int32([1, 2, 3]))], [local])
    return local


def face_mesh_chain() -> bytes:
    """Landmarks [1, 15, 3] -> crop matrix -> the feature map [1, 24, 24, 8] resampled into the crop -> a conv
    head's landmarks in crop pixels -> mapped back through the matrix (outputs: those, the crop)."""
    b = ModelBuilder()
    feats, lms = b.input("features", (1, 24, 24, 8)), b.input("landmarks", (1, 15, 3))
    matrix, crop = b.tensor("matrix", (1, 4, 4)), b.tensor("crop", (1, 16, 12, 8))
    b.op("Landmarks2TransformMatrix", [lms], [matrix], custom_options=flex(**V2_MATRIX), version=2)
    b.op("TransformTensorBilinear", [feats, matrix], [crop], custom_options=flex(output_height=16, output_width=12),
         version=2)
    local = _middle(b, np.random.default_rng(9), crop)
    mapped = b.tensor("mapped", (1, 2, 3))
    b.op("TransformLandmarks", [local, matrix], [mapped], custom_options=flex(), version=2)
    b.output(mapped, crop)
    return b.build()


def test_attention_chain_like_the_face_mesh(opencl_device):
    """The face mesh's pattern (``face_mesh_chain``). The references give the custom ops' results, LiteRT the conv
    head's; ours must match on the CPU and, fully delegated, on the device."""
    rng = np.random.default_rng(5)
    model = face_mesh_chain()
    x = rng.uniform(-1, 1, (1, 24, 24, 8)).astype(np.float32)
    lm = _landmarks(rng, 15, scale=24.0)
    m = np.array(ref_matrix_v2(lm.astype(np.float64).tolist(), V2_MATRIX))
    want_crop = ref_transform_tensor(x, m.reshape(-1), 16, 12, True)
    head = ModelBuilder()
    head.output(_middle(head, np.random.default_rng(9), head.input("crop", (1, 16, 12, 8))))
    (local_ref,) = run_model(litert(), head.build(), [want_crop.astype(np.float32)])
    want = ref_transform_landmarks(local_ref, m.reshape(-1), 3, 1.0)

    for delegate in (None, GpuDelegate()):
        it = Interpreter(model_content=model, delegate=delegate)
        if delegate is not None:
            assert it.gpu_plan is not None and it.gpu_plan.cpu_op_count == 0, it.backend
        got_mapped, got_crop = run_model(lambda **kw: it, model, [x, lm])  # noqa: B023
        assert_close(got_crop, want_crop.astype(np.float32))
        assert_close(got_mapped, want.astype(np.float32), rtol_scale=1e-3)
