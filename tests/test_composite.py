"""STABLEHLO_COMPOSITE (ai-edge-torch's ``odml.*`` blocks): LiteRT calls the decomposition subgraph; the CPU kernels
call it too, and a GpuDelegate's plan inlines it (graph.composite), so its ops run on the device."""

from __future__ import annotations

import numpy as np
import pytest
from flatbuffers import flexbuffers

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import litert
from .test_ops_indexing import invokes

F = np.float32


def composite(b: ModelBuilder, inputs: list[int], outputs: list[int], decomposition: int, name="odml.block"):
    b.op("STABLEHLO_COMPOSITE", inputs, outputs,
         option_fields={"name": name, "decomposition_subgraph_index": decomposition, "version": 1,
                        "composite_attributes": bytes(flexbuffers.Dumps({}))})


def composite_model(rng, nested: bool = False, passthrough: bool = False) -> bytes:
    """x -> CONV_2D -> composite(y, w) -> RELU: the decomposition (a, c) -> (a + c) * c through a FULLY_CONNECTED
    (``nested``: the multiplication is itself a composite; ``passthrough``: the composite also returns a as is,
    a graph output)."""
    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, 3])
    y = b.tensor("y", [1, 4, 4, 3])
    b.op("CONV_2D", [x, b.const("w", rng.normal(0, .5, (3, 1, 1, 3)).astype(F)), b.const("bias", np.zeros(3, F))],
         [y], padding="SAME", stride_h=1, stride_w=1)
    inner = None
    if nested:
        inner, sub2 = b.subgraph("mul")
        p, q = sub2.input("p", [1, 4, 4, 3]), sub2.input("q", [1, 4, 4, 3])
        r = sub2.tensor("r", [1, 4, 4, 3])
        sub2.op("MUL", [p, q], [r])
        sub2.output(r)
    dec, sub = b.subgraph("block")
    a, c = sub.input("a", [1, 4, 4, 3]), sub.input("c", [1, 4, 4, 3])
    s, t = sub.tensor("s", [1, 4, 4, 3]), sub.tensor("t", [1, 4, 4, 3])
    sub.op("ADD", [a, c], [s])
    if nested:
        composite(sub, [s, c], [t], inner, "odml.mul")
    else:
        sub.op("MUL", [s, c], [t])
    u = sub.tensor("u", [1, 4, 4, 3])
    sub.op("FULLY_CONNECTED", [t, sub.const("fc", rng.normal(0, .5, (3, 3)).astype(F)), -1], [u], keep_num_dims=True)
    sub.output(u, *([a] if passthrough else []))
    z = b.tensor("z", [1, 4, 4, 3])
    same = b.tensor("same", [1, 4, 4, 3])
    composite(b, [y, x], [z] + ([same] if passthrough else []), dec)
    out = b.tensor("out", [1, 4, 4, 3])
    b.op("RELU", [z], [out])
    b.output(out, *([same] if passthrough else []))
    return b.build()


@pytest.mark.parametrize("variant", ["plain", "nested", "passthrough"])
def test_composite_runs_its_decomposition(rng, opencl_device, variant):
    model = composite_model(rng, nested=variant == "nested", passthrough=variant == "passthrough")
    feeds = [[rng.normal(0, 1, (1, 4, 4, 3)).astype(F)]]
    want = invokes(litert()(model_content=model, num_threads=1), feeds)
    for kw in ({}, {"experimental_delegates": [GpuDelegate()]}):
        it = Interpreter(model_content=model, **kw)
        got = invokes(it, feeds)
        for g, w in zip(got[0][0], want[0][0]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        if kw:  # (the decomposition inlined: every op on the device)
            assert it.gpu_plan.cpu_op_count == 0, it.backend


def test_a_composite_calling_its_own_subgraph_is_refused(rng):
    b = ModelBuilder()
    x = b.input("x", [2])
    y = b.tensor("y", [2])
    composite(b, [x], [y], 0)
    b.output(y)
    with pytest.raises(RuntimeError, match="decomposition_subgraph_index 0 is the subgraph the composite is in"):
        Interpreter(model_content=b.build()).allocate_tensors()
