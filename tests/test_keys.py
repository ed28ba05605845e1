"""Cache and tuning identities: derived, not remembered, and stable where nothing changed."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu.autotune import kernel_key
from tflgpu.kernels import GenContext, generator_for
from tflgpu.kernels.expressions import BINARY, UNARY
from tflgpu.model import read_model
from tflgpu.model.builder import ModelBuilder
from tflgpu.ops.traits import ops_with
from tflgpu.runtime.config import PlanConfig


def _specs(op_name: str, inputs, out_shape, fp16: bool = False, **options):
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    idx = [b.input("x", shape) if kind == "in" else b.const(f"c{i}", rng.standard_normal(shape).astype(np.float32))
           for i, (kind, shape) in enumerate(inputs)]
    y = b.tensor("y", out_shape)
    b.op(op_name, idx, [y], **options)
    b.output(y)
    sg = read_model(b.build()).main
    consts = {t.index: t.data for t in sg.tensors if t.data is not None}
    op = sg.operators[0]
    return generator_for(op_name)(GenContext(op, sg, consts, fp16)), f"{op_name.lower()}_0"


# A kernel's key, with the generator version held fixed, for reference ops. The key changes when the
# generated source, launch sizes or the key's own recipe change: if you changed a generator on purpose,
# put the new value here; if you did not, the change is a bug (records and binaries would be orphaned).
PINNED = {
    "conv3x3": ("CONV_2D", [("in", (1, 8, 8, 4)), ("const", (8, 3, 3, 4)), ("const", (8,))], (1, 8, 8, 8),
                {"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU6"}),
    "depthwise": ("DEPTHWISE_CONV_2D", [("in", (1, 8, 8, 8)), ("const", (1, 3, 3, 8)), ("const", (8,))], (1, 4, 4, 8),
                  {"padding": "SAME", "stride_w": 2, "stride_h": 2, "depth_multiplier": 1}),
    "add": ("ADD", [("in", (1, 5, 5, 6)), ("const", (6,))], (1, 5, 5, 6), {}),
}
EXPECTED = {
    "conv3x3": "34f4eae136828ae9",  # (its RELU6 compares and selects as TFLite clamps: -0.0 and NaN pass)
    "depthwise": "b2c66a7e02be19cc",  # (two slices per work-item; each input column loaded once per kernel row)
    "add": "961b982434460dcb",
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_kernel_key_is_pinned(name):
    op, inputs, out, options = PINNED[name]
    specs, base = _specs(op, inputs, out, **options)
    assert kernel_key(op, specs, False, base, version=1) == EXPECTED[name]


def test_kernel_key_follows_the_generator_version_and_precision():
    specs, base = _specs(*PINNED["add"][:3], **PINNED["add"][3])
    keys = {kernel_key("ADD", specs, fp16, base, version=v) for fp16 in (False, True) for v in (1, 2)}
    assert len(keys) == 4


def test_plan_config_key_names_every_field():
    a = PlanConfig(fp16=False, max_partitions=4, records=True, subgraph=0, quantized_models_allowed=True)
    key = a.key()
    for field in ("fp16", "max_partitions", "records", "subgraph", "quantized_models_allowed"):
        assert f"{field}=" in key
    assert "tuning" not in key  # (a stored plan's parameters are a start, whatever searched them)
    assert PlanConfig(True, 4, True, 0, True).key() != key


def test_fusable_ops_have_kernel_expressions():
    """The traits table says which elementwise ops may join a producer's kernel; the generators must be
    able to write each of them as an epilogue step."""
    assert ops_with(fusable="unary") <= set(UNARY)
    assert ops_with(fusable="binary") <= set(BINARY)


def test_identical_layers_share_one_kernel_function_and_keep_their_key():
    """Two layers with the same shapes and attributes (different weights) compile to one kernel function, named
    by its code; the tuning key of a plan's step is the key the generator's own specs give."""
    from tflgpu.kernels.program import program_source, shared_base, shared_names

    rng = np.random.default_rng(1)
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 8))
    t = x
    for i in range(3):
        y = b.tensor(f"y{i}", (1, 8, 8, 8))
        b.op("CONV_2D", [t, b.const(f"w{i}", rng.standard_normal((8, 3, 3, 8)).astype(np.float32)),
                         b.const(f"b{i}", rng.standard_normal(8).astype(np.float32))], [y], padding="SAME",
             stride_w=1, stride_h=1)
        t = y
    b.output(t)
    sg = read_model(b.build()).main
    consts = {t.index: t.data for t in sg.tensors if t.data is not None}
    raw = [generator_for("CONV_2D")(GenContext(op, sg, consts, False)) for op in sg.operators]
    shared = [shared_names(specs, f"conv_2d_{op.index}") for specs, op in zip(raw, sg.operators)]
    assert len({s[0].name for s in shared}) == 1 and len({s[0].source for s in shared}) == 1
    assert program_source([s[0].source for s in shared]).count("__kernel void") == 1
    for specs, op, r in zip(shared, sg.operators, raw):
        assert kernel_key("CONV_2D", specs, False, shared_base(specs)) == kernel_key("CONV_2D", r, False,
                                                                                      f"conv_2d_{op.index}")
    # a layer of another shape gets a function of its own
    other = shared_names(_specs("CONV_2D", [("in", (1, 8, 8, 8)), ("const", (4, 3, 3, 8)), ("const", (4,))],
                                (1, 8, 8, 4), padding="SAME", stride_w=1, stride_h=1)[0], "conv_2d_0")
    assert other[0].name != shared[0][0].name


def test_a_generator_change_leaves_the_other_generators_records():
    """A kernel's version (a tuning record's validity) hashes its generator's module and the modules it imports,
    nested imports too: editing one module changes the versions of the kernels made with it, and no others."""
    import ast
    from pathlib import Path

    import tflgpu.kernels as kernels
    from tflgpu.cache.records import TuningRecord
    from tflgpu.kernels.base import generator_version
    from tflgpu.kernels.common import _package_imports

    sources = {p.stem: p.read_bytes() for p in Path(kernels.__file__).parent.glob("*.py")}
    ops = ["CONV_2D", "DEPTHWISE_CONV_2D", "TFLGPU_SEPARABLE_EXPAND", "TFLGPU_POOLED_DENSE", "PAD", "RESIZE_BILINEAR",
           "MEAN", "ADD"]
    assert all(generator_version(op, sources) == generator_version(op) for op in ops)
    for name, source in sources.items():  # (the imports are read by a pattern: as a parse reads them)
        parsed = {(node.module or "").split(".")[0] or alias.name for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.ImportFrom) and node.level == 1 for alias in node.names}
        assert _package_imports(source) == parsed, name

    def changed(module: str) -> set[str]:
        edited = {**sources, module: sources[module] + b"\n# edited\n"}
        return {op for op in ops if generator_version(op, edited) != generator_version(op)}

    assert changed("reindex") == {"PAD", "RESIZE_BILINEAR"}  # (not pool's: the lane kernel is lanes.py's)
    assert changed("lanes") == {"PAD", "RESIZE_BILINEAR", "MEAN", "TFLGPU_POOLED_DENSE"}
    assert changed("conv") == {"CONV_2D", "DEPTHWISE_CONV_2D", "TFLGPU_SEPARABLE_EXPAND", "TFLGPU_POOLED_DENSE"}
    assert changed("winograd") == changed("conv")  # (imported inside a function of conv)
    assert changed("elementwise") == {"ADD", "PAD", "RESIZE_BILINEAR", "MEAN", "TFLGPU_POOLED_DENSE"}
    assert changed("common") == changed("base") == set(ops)
    assert changed("program") == set()  # (builds programs; no generator imports it)
    assert generator_version("NO_SUCH_OP") == kernels.GENERATOR_VERSION  # (every generator's)

    conv, pad = TuningRecord({}, 1.0, 1.0, op="CONV_2D"), TuningRecord({}, 1.0, 1.0, op="PAD")
    assert conv.current and pad.current and conv.generator_version != pad.generator_version
    edited = {**sources, "reindex": sources["reindex"] + b"\n# edited\n"}
    stale = [TuningRecord({}, 1.0, 1.0, op=op, generator_version=generator_version(op, edited)) for op in ops]
    assert {r.op for r in stale if r.current} == {"CONV_2D", "DEPTHWISE_CONV_2D", "TFLGPU_SEPARABLE_EXPAND", "ADD",
                                                  "MEAN", "TFLGPU_POOLED_DENSE"}
