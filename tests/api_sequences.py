"""Random sequences of Interpreter calls (resize_tensor_input, allocate_tensors, set_tensor, invoke, get_tensor, a
signature runner), run on tflgpu and on LiteRT side by side: each call must end the same way (returned, or raised
the same kind of error) with the same values. Batches run from 0 to 3: an empty batch is a second stage's when
the first found nothing.

Left out of the comparison, where LiteRT's answer is not defined: a read before an invoke, or of results computed
from an input never set (LiteRT's arena holds whatever it held), and a set_tensor between a resize and
allocate_tensors(), which tflgpu refuses (LiteRT writes into an arena the allocation may then move).

    python -m tests.api_sequences --seeds 0:300 [--delegate] [--stateful MODEL]
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass, field

import numpy as np

from tflgpu import GpuDelegate, Interpreter

from .oputil import add_mul_model

STEPS = 12


def _outcome(call):
    """('ok', value) or ('error', kind): LiteRT raises RuntimeError where tflgpu raises a subclass of it."""
    try:
        r = call()
    except Exception as e:  # noqa: BLE001 (the kind of error is what is compared)
        return ("error", "RuntimeError" if isinstance(e, RuntimeError) else type(e).__name__)
    if isinstance(r, np.ndarray):
        return ("ok", r.shape, np.round(r.astype(np.float64), 4).tolist())
    return ("ok", r)


@dataclass
class Divergence:
    seed: int
    delegate: bool
    steps: list = field(default_factory=list)  # (call, LiteRT's outcome, tflgpu's), up to the first that differs

    def __str__(self) -> str:
        lines = [f"seed {self.seed}{' (GpuDelegate)' if self.delegate else ''}:"]
        lines += [f"  {call}: {a}" if a == b else f"  {call}: LiteRT {a} / tflgpu {b}" for call, a, b in self.steps]
        return "\n".join(lines)


def run(seed: int, delegate: bool, model: bytes | None = None) -> Divergence | None:
    """One random sequence of STEPS calls; the Divergence ending at the first call that ends differently, or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    model = model or add_mul_model(dynamic_batch=True)
    rng = np.random.default_rng(seed)
    ours = Interpreter(model_content=model, delegate=GpuDelegate(cache=False) if delegate else None)
    pair = (LiteRT(model_content=model), ours)
    seen = Divergence(seed, delegate)
    defined, inputs_set = False, set()  # (an invoke's results are defined: since the last allocate / resize)
    for _ in range(STEPS):
        kind = int(rng.integers(0, 8))
        if kind == 0:
            i, n = int(rng.integers(0, 2)), int(rng.integers(0, 4))
            call, fn = f"resize_tensor_input({i}, [{n}, 3])", lambda it, i=i, n=n: it.resize_tensor_input(i, [n, 3])
        elif kind == 1:
            call, fn = "allocate_tensors()", lambda it: it.allocate_tensors()
        elif kind in (2, 3):
            i, v = int(rng.integers(0, 2)), rng.uniform(-1, 1, (int(rng.integers(0, 4)), 3)).astype(np.float32)
            call, fn = f"set_tensor({i}, {list(v.shape)})", lambda it, i=i, v=v: it.set_tensor(i, v)
        elif kind in (4, 5):
            call, fn = "invoke()", lambda it: it.invoke()
        elif kind == 6:
            t = int(rng.integers(2, 4))
            call, fn = f"get_tensor({t})", lambda it, t=t: it.get_tensor(t)
        else:
            n = int(rng.integers(0, 4))
            x, y = (rng.uniform(-1, 1, (n, 3)).astype(np.float32) for _ in range(2))
            call = f"get_signature_runner()(x, y: [{n}, 3])"
            fn = lambda it, x=x, y=y: it.get_signature_runner()(x=x, y=y)["prod"]
        a, b = (_outcome(lambda it=it, fn=fn: fn(it)) for it in pair)
        seen.steps.append((call, a, b))
        if kind in (0, 1) and a[0] == "ok":
            defined = False
            if kind == 1:
                inputs_set.clear()
        if kind in (2, 3) and a[0] == "ok":
            inputs_set.add(call[11])
            if b == ("error", "ValueError") and not ours._session(0).allocated:
                continue  # (tflgpu's refusal between a resize and allocate_tensors())
        if kind in (4, 5, 7) and a[0] == b[0] == "ok":
            defined = kind == 7 or len(inputs_set) == 2
        if kind == 6 and a[0] == b[0] == "ok" and not defined:
            continue  # (LiteRT's arena: any values)
        if a != b:
            return seen
    return None


def run_stateful(seed: int, delegate: bool, model_path: str) -> Divergence | None:
    """One random sequence of STEPS calls on a model with variable tensors (an LSTM's state): sets of the input and
    of the state, invokes, reads of the output and the state, reset_all_variables(). Values within 2e-3 (the state
    runs through 16 time steps)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    ours = Interpreter(model_path=model_path, delegate=GpuDelegate(cache=False) if delegate else None)
    pair = (LiteRT(model_path=model_path), ours)
    for it in pair:
        it.allocate_tensors()
    state = [t.index for t in ours.model.main.tensors if t.is_variable]
    x, out = ours.get_input_details()[0], ours.get_output_details()[0]["index"]
    rng = np.random.default_rng(seed)
    seen = Divergence(seed, delegate)
    input_set, output_defined, state_defined = False, False, True  # (LiteRT zeroes the state when it allocates)
    for _ in range(STEPS):
        kind, t = int(rng.integers(0, 6)), state[int(rng.integers(0, len(state)))]
        if kind == 0:
            v = rng.uniform(-1, 1, x["shape"]).astype(np.float32)
            call, fn = "set_tensor(input)", lambda it, v=v: it.set_tensor(x["index"], v)
        elif kind == 1:
            call, fn = "invoke()", lambda it: it.invoke()
        elif kind == 2:
            call, fn = "get_tensor(output)", lambda it: it.get_tensor(out)
        elif kind == 3:
            call, fn = f"get_tensor({t}) (state)", lambda it, t=t: it.get_tensor(t)
        elif kind == 4:
            call, fn = "reset_all_variables()", lambda it: it.reset_all_variables()
        else:
            v = rng.uniform(-1, 1, ours.get_tensor_details()[t]["shape"]).astype(np.float32)
            call, fn = f"set_tensor({t}) (state)", lambda it, t=t, v=v: it.set_tensor(t, v)
        a, b = (_outcome(lambda it=it, fn=fn: fn(it)) for it in pair)
        seen.steps.append((call, a, b))
        input_set |= kind == 0
        if kind == 1:
            output_defined = state_defined = input_set and state_defined
        state_defined |= kind == 4
        if kind in (2, 3) and not (output_defined if kind == 2 else state_defined):
            continue  # (computed from an input never set: LiteRT's arena)
        if a[0] == b[0] == "ok" and len(a) == 3 and a[1] == b[1] and np.allclose(a[2], b[2], atol=2e-3):
            continue
        if a != b:
            return seen
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0:100", help="FIRST:END")
    ap.add_argument("--delegate", action="store_true", help="tflgpu with a GpuDelegate (else its CPU kernels)")
    ap.add_argument("--stateful", metavar="MODEL", help="sequences of state calls on MODEL (one with variable "
                    "tensors, e.g. the corpus' lstm_small.tflite) instead")
    args = ap.parse_args()
    first, end = (int(s) for s in args.seeds.split(":"))
    one = (lambda s: run_stateful(s, args.delegate, args.stateful)) if args.stateful else \
        (lambda s: run(s, args.delegate))
    found = [d for d in (one(s) for s in range(first, end)) if d]
    for d in found:
        print(d)
    print(f"{end - first} sequences, {len(found)} diverged")


if __name__ == "__main__":
    main()
