"""WHILE loops compiled whole: the cond and body subgraphs as one numba function.

A recurrent model exported as a WHILE loop (Keras 3's LSTM / GRU) runs a body of ~20 small ops per time step.
Interpreted, each op costs a few microseconds of Python around microseconds of work, so a 16-step loop took
~0.9 ms where LiteRT takes ~0.06 ms. Here both subgraphs are written out as straight-line Python over numpy
arrays (one statement per op, from the op's static shapes, dtypes and constant operands) inside a ``while``, and
numba compiles that: one call runs the whole loop.

A loop is compiled only when every op of both subgraphs has an emitter below, every tensor has a static shape
and a numeric dtype, and each value carried from one step to the next keeps its shape; anything else stays
interpreted (``Unsupported`` names why, logged at debug level). Compiling takes ~1 s, so by default it happens on
a background thread while the interpreted loop serves invokes; the first compiled run is then checked against
the interpreted one, and a loop whose results differ is logged and never used (``TFLGPU_CPU_LOOPS``: ``background``
(default), ``sync`` (compile at the first run; tests), ``off``). The generated source is written to the runtime's
``code_dir`` (named by its hash) so numba's on-disk cache keeps the machine code across processes; with no
usable directory it is compiled in memory each time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..model.ir import Operator, Subgraph
from ..ops.attributes import activation_bounds
from ..ops.jit import materialize, njit
from .elementwise import LOGISTIC_FLOOR

log = logging.getLogger("tflgpu")

MODES = ("background", "sync", "off")


def mode() -> str:
    m = os.environ.get("TFLGPU_CPU_LOOPS", "background").strip().lower()
    return m if m in MODES else "background"


class Unsupported(Exception):
    """Why a loop is not compiled (it then runs interpreted)."""


@njit(cache=True)
def small_fc(x, wt):
    """x [m, k] @ wt [k, n] in float32, for the small products of a loop body (numba's own ``@`` needs SciPy)."""
    m, k = x.shape
    n = wt.shape[1]
    out = np.zeros((m, n), np.float32)
    for i in range(m):
        o = out[i]
        for kk in range(k):
            xv = x[i, kk]
            w = wt[kk]
            for j in range(n):
                o[j] += xv * w[j]
    return out


# -- source generation --------------------------------------------------------------------------------------

FINISHED, UNFINISHED, OUT_OF_RANGE = 0, 1, 2  # what the compiled loop returns with its values

_DTYPES = {np.dtype(np.float32): "np.float32", np.dtype(np.int32): "np.int32", np.dtype(np.bool_): "np.bool_"}


@dataclass
class _Graph:
    """One subgraph being written out: its tensors' expression names and the constants it passes in."""

    sg: Subgraph
    prefix: str
    consts: dict[int, np.ndarray]
    args: dict[str, np.ndarray]  # argument name -> value (shared by both graphs)
    names: dict[int, str] = field(default_factory=dict)

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(int(d) for d in self.sg.tensors[i].shape)

    def dtype(self, i: int) -> np.dtype:
        return np.dtype(self.sg.tensors[i].dtype)

    def const(self, i: int) -> np.ndarray | None:
        return self.consts.get(i)

    def name(self, i: int) -> str:
        """The expression for tensor ``i``: a computed value's variable, or a constant passed as an argument."""
        if i in self.names:
            return self.names[i]
        c = self.consts.get(i)
        if c is None:
            raise Unsupported(f"tensor {i} of subgraph {self.sg.index} is read before it is computed")
        arg = f"k{self.prefix}{i}"
        self.args[arg] = _scalar(c) if c.ndim == 0 else np.ascontiguousarray(c)
        self.names[i] = arg
        return arg

    def define(self, i: int) -> str:
        self.names[i] = f"{self.prefix}{i}"
        return self.names[i]


def _scalar(c: np.ndarray):
    return np.dtype(c.dtype).type(c)


def _clamp(expr: str, act: int) -> str:
    lo, hi = activation_bounds(act)
    if act not in (0, 1, 2, 3):
        raise Unsupported(f"fused activation {act}")
    if lo > -np.inf:
        expr = f"np.maximum({expr}, np.float32({lo}))"
    if hi < np.inf:
        expr = f"np.minimum({expr}, np.float32({hi}))"
    return expr


_BINARY = {"ADD": "({a} + {b})", "SUB": "({a} - {b})", "MUL": "({a} * {b})", "DIV": "({a} / {b})",
           "MAXIMUM": "np.maximum({a}, {b})", "MINIMUM": "np.minimum({a}, {b})"}
_COMPARE = {"LESS": "<", "LESS_EQUAL": "<=", "GREATER": ">", "GREATER_EQUAL": ">=", "EQUAL": "==", "NOT_EQUAL": "!="}
_LOGIC = {"LOGICAL_AND": "&", "LOGICAL_OR": "|"}
_UNARY = {"TANH": "np.tanh({x})", "EXP": "np.exp({x})", "RELU": "np.maximum({x}, np.float32(0))",
          "RELU6": "np.minimum(np.maximum({x}, np.float32(0)), np.float32(6))",
          "LOGISTIC": "(np.float32(1) / (np.float32(1) + np.exp(-np.maximum({x}, np.float32(%r)))))"
                      % float(LOGISTIC_FLOOR)}


def _typed(expr: str, dtype: np.dtype, scalar: bool) -> str:
    """``expr`` cast to ``dtype`` (numba widens int32 arithmetic to int64; a scalar's cast is free)."""
    t = _DTYPES[dtype]
    return f"{t}({expr})" if scalar else f"({expr}).astype({t})"


def _emit(g: _Graph, op: Operator) -> list[str]:
    name, opts = op.name, op.options or {}
    ins = list(op.inputs)
    if any(i < 0 for i in ins) and name != "FULLY_CONNECTED":
        raise Unsupported(f"{name} with an omitted input")
    for o in op.outputs:
        if o < 0 or g.dtype(o) not in _DTYPES:
            raise Unsupported(f"{name}: output dtype {g.dtype(o) if o >= 0 else 'omitted'}")
    out = op.outputs[0]
    scalar = g.shape(out) == ()
    if name in _BINARY or name in _COMPARE or name in _LOGIC:
        a, b = ins
        if g.dtype(a) != g.dtype(b):
            raise Unsupported(f"{name} of {g.dtype(a)} and {g.dtype(b)}")
        if name in _BINARY:
            if g.dtype(a) == np.int32 and name == "DIV":
                raise Unsupported("integer DIV")
            if g.dtype(a) == np.bool_:
                raise Unsupported(f"{name} of bool")
            expr = _BINARY[name].format(a=g.name(a), b=g.name(b))
            if g.dtype(out) == np.float32:
                expr = _clamp(expr, opts.get("fused_activation_function", 0) or 0)
                if scalar:
                    expr = f"np.float32({expr})"
            else:
                if opts.get("fused_activation_function", 0):
                    raise Unsupported(f"integer {name} with a fused activation")
                expr = _typed(expr, g.dtype(out), scalar)
        elif name in _COMPARE:
            expr = f"({g.name(a)} {_COMPARE[name]} {g.name(b)})"
        else:
            if g.dtype(a) != np.bool_:
                raise Unsupported(f"{name} of {g.dtype(a)}")
            expr = f"({g.name(a)} {_LOGIC[name]} {g.name(b)})"
        return [f"{g.define(out)} = {expr}"]
    if name == "LOGICAL_NOT":
        return [f"{g.define(out)} = np.logical_not({g.name(ins[0])})"]
    if name in _UNARY:
        (x,) = ins
        if g.dtype(x) != np.float32 or scalar:
            raise Unsupported(f"{name} of a {g.dtype(x)} {'scalar' if scalar else 'tensor'}")
        return [f"{g.define(out)} = {_UNARY[name].format(x=g.name(x))}"]
    if name == "FULLY_CONNECTED":
        return _emit_fc(g, op)
    if name == "RESHAPE":
        x = ins[0]
        if g.shape(x) == () or scalar or -1 in g.shape(out) or g.shape(out) == ():
            raise Unsupported("RESHAPE to or from a scalar, or to an unknown shape")
        return [f"{g.define(out)} = np.ascontiguousarray({g.name(x)}).reshape({g.shape(out)!r})"]
    if name == "GATHER":
        return _emit_gather(g, op)
    if name == "SPLIT":
        axis_c = g.const(ins[0])
        x = ins[1]
        if axis_c is None:
            raise Unsupported("SPLIT along a computed axis")
        shape = g.shape(x)
        axis = int(np.asarray(axis_c).reshape(-1)[0])
        axis = axis + len(shape) if axis < 0 else axis
        n = len(op.outputs)
        if not 0 <= axis < len(shape) or shape[axis] % n:
            raise Unsupported("SPLIT of an uneven or out-of-range axis")
        step = shape[axis] // n
        lead = ":, " * axis
        return [f"{g.define(o)} = {g.name(x)}[{lead}{k * step}:{(k + 1) * step}]" for k, o in enumerate(op.outputs)]
    if name == "CONCATENATION":
        axis = int(opts.get("axis", 0))
        rank = len(g.shape(out))
        axis = axis + rank if axis < 0 else axis
        if opts.get("fused_activation_function", 0) or rank == 0 or any(g.shape(i) == () for i in ins):
            raise Unsupported("CONCATENATION with an activation or of scalars")
        parts = ", ".join(g.name(i) for i in ins)
        return [f"{g.define(out)} = np.concatenate(({parts},), axis={axis})"]
    raise Unsupported(f"no emitter for {name}")


def _emit_fc(g: _Graph, op: Operator) -> list[str]:
    opts = op.options or {}
    x, w = op.inputs[0], op.inputs[1]
    b = op.inputs[2] if len(op.inputs) > 2 else -1
    wc = g.const(w)
    if wc is None or wc.dtype != np.float32 or g.dtype(x) != np.float32 or wc.ndim != 2:
        raise Unsupported("FULLY_CONNECTED without constant float32 weights")
    if opts.get("keep_num_dims", False):
        raise Unsupported("FULLY_CONNECTED keeping its dims")
    units, depth = wc.shape
    size = int(np.prod(g.shape(x)))
    if depth == 0 or size % depth or g.shape(op.outputs[0]) != (size // depth, units):
        raise Unsupported("FULLY_CONNECTED shapes")
    wt = f"w{g.prefix}{w}"
    g.args[wt] = np.ascontiguousarray(wc.T)
    expr = f"small_fc(np.ascontiguousarray({g.name(x)}).reshape({size // depth}, {depth}), {wt})"
    if b >= 0:
        bc = g.const(b)
        if bc is None or bc.dtype != np.float32:
            raise Unsupported("FULLY_CONNECTED with a computed bias")
        expr = f"({expr} + {g.name(b)})"
    return [f"{g.define(op.outputs[0])} = {_clamp(expr, opts.get('fused_activation_function', 0) or 0)}"]


def _emit_gather(g: _Graph, op: Operator) -> list[str]:
    opts = op.options or {}
    x, idx = op.inputs
    shape = g.shape(x)
    axis = int(opts.get("axis", 0))
    axis = axis + len(shape) if axis < 0 else axis
    if opts.get("batch_dims", 0) or g.shape(idx) != () or g.dtype(idx) != np.int32 or not 0 <= axis < len(shape):
        raise Unsupported("GATHER other than of one int32 index")
    i = g.name(idx)
    lead = ":, " * axis
    return [f"if {i} < 0 or {i} >= {shape[axis]}:",
            f"    return carried, {OUT_OF_RANGE}",
            f"{g.define(op.outputs[0])} = {g.name(x)}[{lead}{i}]"]


@dataclass(frozen=True)
class Carried:
    """A value the loop carries: its static shape and dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def scalar(self) -> bool:
        return self.shape == ()


@dataclass
class LoopCode:
    source: str
    carried: list[Carried]
    args: dict[str, np.ndarray]

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:20]


def generate(cond: Subgraph, body: Subgraph, cond_consts: dict, body_consts: dict, cond_steps: list[Operator],
             body_steps: list[Operator], max_iterations: int) -> LoopCode:
    """The loop as Python source for numba: ``loop(carried, *args) -> (carried, status)``: FINISHED, UNFINISHED
    (``max_iterations`` ran out) or OUT_OF_RANGE (a GATHER's index: the interpreted loop then raises TFLite's
    error)."""
    n = len(body.inputs)
    if len(cond.inputs) != n or len(body.outputs) != n or len(cond.outputs) != 1:
        raise Unsupported("cond / body signatures differ from the loop's values")
    carried = []
    for k in range(n):
        t_in, t_out, t_cond = body.tensors[body.inputs[k]], body.tensors[body.outputs[k]], cond.tensors[cond.inputs[k]]
        shapes = {tuple(t_in.shape), tuple(t_out.shape), tuple(t_cond.shape)}
        dtypes = {np.dtype(t_in.dtype), np.dtype(t_out.dtype), np.dtype(t_cond.dtype)}
        if len(shapes) != 1 or len(dtypes) != 1 or any(d < 0 for d in t_in.shape) or dtypes.pop() not in _DTYPES:
            raise Unsupported(f"loop value {k} changes shape or dtype, or has an unknown shape or dtype")
        carried.append(Carried(tuple(int(d) for d in t_in.shape), np.dtype(t_in.dtype)))
    for sg in (cond, body):
        for t in sg.tensors:
            if t.shape is not None and any(d < 0 for d in t.shape):
                raise Unsupported(f"subgraph {sg.index} has a tensor of unknown shape")
    args: dict[str, np.ndarray] = {}
    gc, gb = _Graph(cond, "c", cond_consts, args), _Graph(body, "b", body_consts, args)
    lines = []
    for g in (gc, gb):
        for k, t in enumerate(g.sg.inputs):
            g.names[t] = f"v{k}"
    for op in cond_steps:
        lines += _emit(gc, op)
    cond_out = cond.outputs[0]
    if cond.tensors[cond_out].shape not in ((), (1,)) or np.dtype(cond.tensors[cond_out].dtype) != np.bool_:
        raise Unsupported("cond is not one bool")
    test = gc.name(cond_out) if tuple(cond.tensors[cond_out].shape) == () else f"{gc.name(cond_out)}[0]"
    lines += [f"if not {test}:", f"    return carried, {FINISHED}"]
    for op in body_steps:
        lines += _emit(gb, op)
    new = []
    for k, t in enumerate(body.outputs):
        c = carried[k]
        expr = gb.name(t)
        new.append(f"{_DTYPES[c.dtype]}({expr})" if c.scalar else f"np.ascontiguousarray({expr})")
    lines.append(f"carried = ({', '.join(new)}{',' if n == 1 else ''})")
    lines.append(f"{', '.join(f'v{k}' for k in range(n))}{',' if n == 1 else ''} = carried")
    arg_list = ", ".join(args)
    unpack = f"    {', '.join(f'v{k}' for k in range(n))}{',' if n == 1 else ''} = carried\n"
    body_src = "".join(f"        {line}\n" for line in lines)
    source = ("# generated by tflgpu.cpu.loops: a WHILE loop's cond and body as one function\n"
              "import numpy as np\n\nfrom tflgpu.cpu.loops import small_fc\nfrom tflgpu.ops.jit import njit\n\n\n"
              f"@njit(cache=True)\ndef loop(carried{', ' if arg_list else ''}{arg_list}):\n{unpack}"
              f"    for _ in range({max_iterations}):\n{body_src}    return carried, {UNFINISHED}\n")
    return LoopCode(source, carried, args)


# -- compiling and running -------------------------------------------------------------------------------------

def _load(code: LoopCode, code_dir: Path | None) -> Callable:
    materialize()  # (small_fc becomes numba's dispatcher before the generated module imports it)
    name = f"tflgpu_loop_{code.digest}"
    if code_dir is not None:
        try:
            code_dir.mkdir(parents=True, exist_ok=True)
            path = code_dir / f"{name}.py"
            if not path.exists() or path.read_text() != code.source:
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                try:
                    tmp.write_text(code.source)
                    os.replace(tmp, path)
                except OSError:
                    tmp.unlink(missing_ok=True)  # (a full disk: no partial file left taking its space)
                    raise
            spec = importlib.util.spec_from_file_location(name, path)
            module = sys.modules.get(name)
            if module is None:
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module  # (numba's cache finds a function's module by name)
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
            return module.loop
        except OSError as e:
            log.debug("tflgpu: compiled loop source not stored in %s (%s); compiled in memory", code_dir, e)
    namespace: dict = {"__name__": name}
    # (the source is ours, generated above from the model's static shapes: no text of the model's reaches it)
    exec(compile(code.source.replace("@njit(cache=True)", "@njit"), f"<{name}>", "exec"), namespace)  # noqa: S102
    return namespace["loop"]


def _forget(code: LoopCode, code_dir: Path) -> None:
    """Remove a loop's stored source and numba's cache entries for it (and its module from this process)."""
    name = f"tflgpu_loop_{code.digest}"
    sys.modules.pop(name, None)
    for path in [code_dir / f"{name}.py", *(code_dir / "__pycache__").glob(f"{name}.*")]:
        try:
            path.unlink()
        except OSError:
            pass


class CompiledLoop:
    """A WHILE loop's compiled form, made on a background thread (or at once), checked once, then used."""

    def __init__(self, code: LoopCode, code_dir: Path | None, how: str = "background"):
        self.code = code
        self._args = tuple(code.args.values())
        self._fn: Callable | None = None
        self.checked = False
        self.failed: str | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._code_dir, self._how = code_dir, how

    def _compile(self) -> None:
        # a stored entry numba cannot load (another numba, a damaged file) is removed and compiled again; then
        # in memory; numba refusing the source itself is a logged fallback to the interpreted loop
        why = ""
        for code_dir in dict.fromkeys([self._code_dir, None]):
            try:
                fn = _load(self.code, code_dir)
                fn(self._initial(), *self._args)  # (compiles: the carried values' types are the declared ones)
                self._fn = fn
                return
            except Exception as e:  # noqa: BLE001 (numba's errors have no common base short of Exception)
                why = f"{type(e).__name__}: {e}"
                if code_dir is not None:
                    _forget(self.code, code_dir)
                    log.debug("tflgpu: the stored compiled loop in %s did not load (%s); compiling again", code_dir,
                              why)
        self.failed = why
        log.info("tflgpu: a WHILE loop stays interpreted: compiling it failed (%s)", why)

    def _initial(self) -> tuple:
        return tuple(c.dtype.type(0) if c.scalar else np.zeros(c.shape, c.dtype) for c in self.code.carried)

    def ready(self) -> Callable | None:
        """The compiled loop if it is ready (starting its compilation the first time)."""
        if self._fn is not None or self.failed is not None:
            return self._fn
        with self._lock:
            if self._thread is None and self._fn is None and self.failed is None:
                if self._how == "sync":
                    self._compile()
                else:
                    self._thread = threading.Thread(target=self._compile, name="tflgpu-loop-compile", daemon=True)
                    self._thread.start()
        return self._fn

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def run(self, xs: list) -> tuple[list | None, int]:
        """(the loop's outputs, its status); (None, OUT_OF_RANGE) where the compiled form cannot run these values
        (not ready, other shapes than declared): the caller then interprets."""
        fn = self.ready()
        if fn is None:
            if self._thread is not None and self._thread.is_alive():
                # the GIL handed to the compile thread once per interpreted run: a thread invoking in a loop
                # otherwise starves it (numba's compiler is Python; LLVM's calls drop the GIL, and getting it back
                # waits out a busy thread's switch interval): a Keras LSTM loop compiled in 57 s instead of 2.7 s
                # under back-to-back invokes, 4 s with this
                time.sleep(0)
            return None, OUT_OF_RANGE
        vals = []
        for x, c in zip(xs, self.code.carried):
            a = np.asarray(x)
            if a.shape != c.shape or a.dtype != c.dtype:
                return None, OUT_OF_RANGE
            vals.append(c.dtype.type(a) if c.scalar else np.ascontiguousarray(a))
        out, status = fn(tuple(vals), *self._args)
        if status == OUT_OF_RANGE:
            return None, status
        return [np.asarray(v, c.dtype).reshape(c.shape) for v, c in zip(out, self.code.carried)], status

    def check(self, got: list, want: list) -> bool:
        """Adopt the compiled loop if its first results are the interpreted ones (to float32 rounding)."""
        self.checked = True
        for g, w in zip(got, want):
            w = np.asarray(w)
            if g.shape != w.shape or g.dtype != w.dtype or not np.allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True):
                self.failed = "its results differ from the interpreted loop's"
                self._fn = None
                log.warning("tflgpu: a compiled WHILE loop's results differ from the interpreted loop's; it stays "
                            "interpreted")
                return False
        return True


class LoopSlot:
    """One WHILE op's compiled form, generated when first asked for (its cond and body runners built then)."""

    def __init__(self, runtime, cond: int, body: int, max_iterations: int):
        self.runtime, self.cond, self.body, self.max_iterations = runtime, cond, body, max_iterations
        self._made = False
        self._loop: CompiledLoop | None = None

    def get(self) -> CompiledLoop | None:
        if not self._made:
            self._made = True
            self._loop = self._make()
        return self._loop

    def _make(self) -> CompiledLoop | None:
        how = mode()
        if how == "off":
            return None
        rt = self.runtime
        cond, body = rt.model.subgraphs[self.cond], rt.model.subgraphs[self.body]
        cr, br = rt.runner(self.cond), rt.runner(self.body)
        try:
            code = generate(cond, body, cr.consts, br.consts, [op for op, _ in cr.steps], [op for op, _ in br.steps],
                            self.max_iterations)
        except Unsupported as e:
            log.debug("tflgpu: WHILE (cond %d, body %d) stays interpreted: %s", self.cond, self.body, e)
            return None
        return CompiledLoop(code, getattr(rt, "code_dir", None), how)

    def settle(self, timeout: float | None = None) -> bool:
        """Compile now (on the background thread, waited for); False if ``timeout`` passed first."""
        loop = self.get()
        if loop is None:
            return True
        loop.ready()
        return loop.wait(timeout)
