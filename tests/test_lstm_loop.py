"""A Keras LSTM's time loop (a WHILE running one LSTM cell a step) becomes one UNIDIRECTIONAL_SEQUENCE_LSTM
(graph.lstm_loop), on the device and on the CPU kernels, against LiteRT running the loop itself."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, assert_fp16_close, corpus_model, litert

I32 = np.int32


def lstm_loop_model(rng, batch=1, steps=5, n_in=3, units=4, order="ifgo", bias="add", batch_major_input=False,
                    c_out=False, extra_op=False):
    """A WHILE over ``steps`` time steps whose body is Keras's LSTM cell: the gates' sum x[t] W + h U (+ bias, as
    an ADD or the first FC's bias), split into four gates in ``order``. Initial state: random constants."""
    f32 = np.float32
    b = ModelBuilder()
    if batch_major_input:  # (Keras's input, made time-major by a reshape: a batch of one)
        src = b.input("x", (1, steps, n_in))
        x = b.tensor("x_tm", (steps, 1, n_in))
        b.op("RESHAPE", [src, b.const("tm_shape", np.array([steps, 1, n_in], I32))], [x])
    else:
        x = b.input("x", (steps, batch, n_in))
    ci, cond = b.subgraph("cond")
    ct = cond.input("t", (), I32)
    for name, shape in (("o", (batch, units)), ("h", (batch, units)), ("c", (batch, units)),
                        ("x", (steps, batch, n_in))):
        cond.input(name, shape)
    go = cond.tensor("go", (), np.bool_)
    cond.op("LESS", [ct, cond.const("n", np.array(steps, I32))], [go])
    cond.output(go)
    bi, body = b.subgraph("body")
    t, _, h, c, xs = (body.input("t", (), I32), body.input("o", (batch, units)), body.input("h", (batch, units)),
                      body.input("c", (batch, units)), body.input("x", (steps, batch, n_in)))
    t2, xt = body.tensor("t2", (), I32), body.tensor("xt", (batch, n_in))
    body.op("ADD", [t, body.const("one", np.array(1, I32))], [t2])
    body.op("GATHER", [xs, t], [xt], axis=0, batch_dims=0)
    wx = body.const("wx", rng.uniform(-0.5, 0.5, (4 * units, n_in)).astype(f32))
    wh = body.const("wh", rng.uniform(-0.5, 0.5, (4 * units, units)).astype(f32))
    bvec = body.const("bias", rng.uniform(-0.5, 0.5, (4 * units,)).astype(f32))
    a, r, z = (body.tensor(n, (batch, 4 * units)) for n in ("a", "r", "z"))
    body.op("FULLY_CONNECTED", [xt, wx, bvec if bias == "fc" else -1], [a])
    body.op("FULLY_CONNECTED", [h, wh, -1], [r])
    if bias == "add":
        z0 = body.tensor("z0", (batch, 4 * units))
        body.op("ADD", [a, r], [z0])
        body.op("ADD", [z0, bvec], [z])
    else:
        body.op("ADD", [r, a], [z])
    parts = [body.tensor(f"s{k}", (batch, units)) for k in range(4)]
    body.op("SPLIT", [body.const("axis", np.array(1, I32)), z], parts, num_splits=4)
    gate = {}
    for k, role in enumerate(order):
        gate[role] = body.tensor(f"gate_{role}", (batch, units))
        body.op("TANH" if role == "g" else "LOGISTIC", [parts[k]], [gate[role]])
    fc, ig, c2, tc, h2 = (body.tensor(n, (batch, units)) for n in ("fc", "ig", "c2", "tc", "h2"))
    body.op("MUL", [c, gate["f"]], [fc])
    body.op("MUL", [gate["i"], gate["g"]], [ig])
    body.op("ADD", [ig, fc], [c2])
    body.op("TANH", [c2], [tc])
    body.op("MUL", [gate["o"], tc], [h2])
    if extra_op:  # (h scaled: not an LSTM cell)
        h3 = body.tensor("h3", (batch, units))
        body.op("MUL", [h2, body.const("k", np.array([0.5], f32))], [h3])
        h2 = h3
    body.output(t2, h2, h2, c2, xs)
    outs = [b.tensor(n, s, d) for n, s, d in (("t_out", (), I32), ("o_out", (batch, units), f32),
                                               ("h_out", (batch, units), f32), ("c_out", (batch, units), f32),
                                               ("x_out", (steps, batch, n_in), f32))]
    inits = [b.const("t0", np.array(0, I32)), b.const("o0", np.zeros((batch, units), f32)),
             b.const("h0", rng.uniform(-1, 1, (batch, units)).astype(f32)),
             b.const("c0", rng.uniform(-1, 1, (batch, units)).astype(f32))]
    b.op("WHILE", [*inits, x], outs, cond_subgraph_index=ci, body_subgraph_index=bi)
    y = b.tensor("y", (batch, units))
    b.op("TANH", [outs[1]], [y])  # (an op after the loop, on its last output)
    b.output(y, *([outs[3]] if c_out else []))
    return b.build(), (1, steps, n_in) if batch_major_input else (steps, batch, n_in)


CASES = {
    "keras": {"batch_major_input": True},
    "batch2_fc_bias": {"batch": 2, "bias": "fc"},
    "gate_order_fogi": {"order": "fogi", "units": 6, "n_in": 5},
    "one_step": {"steps": 1},
}


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", list(CASES))
def test_an_lstm_time_loop_is_one_sequence_op_matching_litert(opencl_device, rng, case, fp16):
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    model, shape = lstm_loop_model(rng, **CASES[case])
    ours = Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=fp16))
    plan = ours.gpu_plan
    assert plan.pass_counts["lstm_loop"] == 1 and plan.pass_counts["unroll_while"] == 0
    assert next(s.op.name for s in plan.steps if s.device == "gpu" and s.specs) == "UNIDIRECTIONAL_SEQUENCE_LSTM"
    assert plan.cpu_op_count == 0
    ref = litert()(model_content=model)
    for it in (ours, ref):
        it.allocate_tensors()
    for k in range(3):  # (each invoke starts from the loop's initial state: none is carried over)
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        for it in (ours, ref):
            it.set_tensor(it.get_input_details()[0]["index"], x)
            it.invoke()
        idx = ref.get_output_details()[0]["index"]
        (assert_fp16_close if fp16 else assert_close)(ours.get_tensor(idx), ref.get_tensor(idx), what=f"invoke {k}")


@pytest.mark.parametrize("variant", ["c_out", "extra_op"])
def test_a_loop_that_is_not_exactly_the_cell_is_unrolled_instead(opencl_device, rng, variant):
    model, shape = lstm_loop_model(rng, **{variant: True})
    ours = Interpreter(model_content=model, delegate=GpuDelegate())
    assert ours.gpu_plan.pass_counts["lstm_loop"] == 0 and ours.gpu_plan.pass_counts["unroll_while"] == 1
    ref = litert()(model_content=model)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    for it in (ours, ref):
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
    for d in ref.get_output_details():
        assert_close(ours.get_tensor(d["index"]), ref.get_tensor(d["index"]))


def test_the_rewritten_graph_runs_on_the_cpu_kernels_without_keeping_state(rng):
    """The fused op's state is constants: the CPU kernel starts from them every run and never writes them."""
    from tflgpu.cpu.executor import ModelRunner
    from tflgpu.model.reader import read_model
    from tflgpu.runtime.selection import transform_graph

    model, shape = lstm_loop_model(rng, batch=2, order="gifo")
    runtime = ModelRunner(read_model(model))
    graph = transform_graph(runtime.runner(0), quantized_models_allowed=False)
    assert graph.counts["lstm_loop"] == 1
    assert not any(op.name == "WHILE" for op in graph.runner.sg.operators)
    ref = litert()(model_content=model)
    ref.allocate_tensors()
    out = ref.get_output_details()[0]["index"]
    for _ in range(2):
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        ref.set_tensor(ref.get_input_details()[0]["index"], x)
        ref.invoke()
        assert_close(graph.runner.run([x])[out], ref.get_tensor(out))


def test_the_corpus_keras3_lstm_runs_as_one_launch(opencl_device):
    it = Interpreter(str(corpus_model("lstm_small_keras3_while.tflite")), delegate=GpuDelegate())
    plan = it.gpu_plan
    assert plan.pass_counts["lstm_loop"] == 1
    launches = sum(len(s.specs) for s in plan.steps if s.device == "gpu")
    assert launches <= 3, [s.op.name for s in plan.steps if s.specs]  # (was 129 unrolled: 16 steps)
