"""The delegated plan: which ops run on the OpenCL device, their compiled kernels, buffers, and invoke().

Built once per (model, delegate options): every op gets a generated kernel or
stays on the CPU kernels; programs are compiled, arguments bound, buffers
planned. ``run`` then uploads the inputs, enqueues every launch, copies across
partition boundaries only where a CPU op needs a value, and reads the outputs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..cache.plans import StepRecord
from ..cpu.executor import SubgraphRunner, run_cpu_op
from ..kernels import GenContext, KernelSpec, Unsupported, generator_for
from ..kernels.common import boundary_kernels
from ..kernels.program import bind_kernel, build_program, program_key
from ..model.ir import Operator, Subgraph
from ..ops.layout import Layout, bhwc
from ..ops.quantization import dequantize_values, quantize_values
from . import DeviceError
from .device import DeviceInfo
from .memory import plan_memory

log = logging.getLogger("tflgpu")


@dataclass
class Step:
    op: Operator  # the op whose generator made the kernel (a fused group's producer)
    device: str  # "gpu" | "cpu"
    specs: list[KernelSpec] = field(default_factory=list)
    members: list = field(default_factory=list)  # [(op, cpu_fn)]: every op this step computes, in order
    reason: str = ""
    kernels: list = field(default_factory=list)  # bound pyopencl kernels, parallel to specs
    epilogue: list = field(default_factory=list)  # fused elementwise ops the kernels apply
    params: dict = field(default_factory=dict)  # generator knobs (explicit or tuned); {} = heuristics


@dataclass
class TunedKernel:
    """What tuning decided for one kernel identity of this plan."""

    key: str
    op: str
    layers: int  # steps of this plan sharing the identity
    default_us: float
    best_us: float
    params: dict  # {} = the heuristic default
    source: str  # "record" (from the tuning database) | "tuned" (searched now)
    result: object = None  # the TuneResult, when searched now
    flops: int = 0  # per launch of one layer

    @property
    def speedup(self) -> float:
        return self.default_us / self.best_us if self.best_us > 0 else 1.0


def propagate_shapes(runner: SubgraphRunner, input_shapes: list[tuple[int, ...]]) -> Subgraph:
    """The subgraph with every tensor's actual shape for these input shapes (one CPU run on zeros).

    Kernels are specialized for exact shapes, and a model's declared shapes may be stale
    (LiteRT recomputes them too); variables are reset afterwards.
    """
    sg = runner.sg
    zeros = [np.zeros(shape, sg.tensors[i].dtype) for i, shape in zip(sg.inputs, input_shapes)]
    with np.errstate(all="ignore"):  # zeros make LOG/RSQRT/DIV warn; only the shapes matter here
        values = runner.run(zeros)
    runner.reset_variables()
    tensors = [replace(t, shape=tuple(np.shape(v))) if v is not None else t for t, v in zip(sg.tensors, values)]
    return replace(sg, tensors=tensors)


class GpuPlan:
    def __init__(self, runner: SubgraphRunner, device: DeviceInfo, fp16: bool, max_partitions: int,
                 profile: bool = False, params: dict | None = None,
                 input_shapes: list[tuple[int, ...]] | None = None, tuning=None, cache=None, quant_io=None):
        """``cache``: a ``tflgpu.cache.PlanCache`` — a stored plan for these options and shapes is
        used as is (no shape propagation, graph-pass search, tuning or compilation), and a plan
        built here is stored. ``quant_io``: for a quantized model's float view (``runner.sg``), the
        quantization of tensors the caller sees as integers: dequantized on the way in, quantized on
        the way out."""
        from ..kernels.common import relayout_cache

        with relayout_cache():  # (weights re-laid out once, however often their op is generated)
            self._build_plan(runner, device, fp16, max_partitions, profile, params, input_shapes, tuning, cache,
                             quant_io)

    def _build_plan(self, runner, device, fp16, max_partitions, profile, params, input_shapes, tuning, cache,
                    quant_io) -> None:
        import pyopencl as cl

        quant_io = quant_io or {}
        self.quant_in = {t: p for t, p in quant_io.items() if t in runner.sg.inputs}  # dequantized per run
        self.quant_out = {t: p for t, p in quant_io.items() if t not in self.quant_in}  # quantized per run
        self.cl = cl
        self.runner = runner
        self.input_shapes = [tuple(s) for s in (input_shapes or [runner.sg.tensors[i].shape for i in runner.sg.inputs])]
        self.device = device
        self.fp16 = fp16
        self.np_dtype = np.float16 if fp16 else np.float32
        self.itemsize = 2 if fp16 else 4
        t0 = time.perf_counter()
        self.store = cache.store if cache is not None else None
        self.build_stats = {"source_builds": 0, "binary_loads": 0, "plan": "built"}
        record = cache.load(self.input_shapes, device.identity.key(), len(runner.sg.tensors)) if cache else None
        self.ctx = cl.Context([device.cl_device])
        self._prefetched = None
        if record is not None and record.program_key:  # load the binary while the kernels are generated
            from concurrent.futures import ThreadPoolExecutor

            from ..kernels.program import load_binary

            pool = ThreadPoolExecutor(1, thread_name_prefix="tflgpu-binary")
            self._prefetched = (record.program_key, pool.submit(load_binary, cl, self.ctx, record.program_key, fp16,
                                                                self.store, device))
            pool.shutdown(wait=False)
        if record is not None:
            self.sg = replace(runner.sg, tensors=[replace(t, shape=tuple(shape))
                                                  for t, shape in zip(runner.sg.tensors, record.tensor_shapes)])
            params = {s.op_index: s.params for s in record.steps if s.on_device and s.params}
        else:
            self.sg = propagate_shapes(runner, self.input_shapes)
        self.tuning_seconds = 0.0
        self.steps = self._select(params or {})
        if record is not None and not self._restore(record):
            cache.reject(record, device.identity.key(), "its steps no longer match what the graph passes produce")
            record, params = None, None
            self.steps = self._select({})
        props = cl.command_queue_properties.PROFILING_ENABLE if profile else 0
        self.queue = cl.CommandQueue(self.ctx, properties=props)
        self.profile = profile
        self.tuning_results: list[TunedKernel] = []  # one per tunable kernel identity
        if tuning is not None and record is None:
            self._apply_tuning(tuning, explicit=set(params or {}))
        self._compile()
        self._limit_partitions(max_partitions)
        if record is not None:
            self.build_stats["plan"] = "cache"
        self._report()
        self._allocate()
        if cache is not None and record is None:
            cache.save([StepRecord(s.op.index, s.device == "gpu", s.params, s.reason) for s in self.steps],
                       self.input_shapes, [t.shape for t in self.sg.tensors],
                       program_key([spec.source for s in self.steps if s.device == "gpu" for spec in s.specs], fp16),
                       device.identity.key())
        self.build_seconds = time.perf_counter() - t0
        self.last_events: list = []

    # -- selection and partitioning ---------------------------------------

    def _select(self, params: dict) -> list[Step]:
        """Place each op, run the graph passes, then generate the kernels of every device step."""
        from ..graph.passes import PassStep, cull_dead, drop_identities, fuse_elementwise, merge_pad

        consts = self.runner.consts
        reasons: dict[int, str] = {}
        generated: dict[int, tuple] = {}  # op index -> (op, specs) from the support check
        base = []
        for op, fn in self.runner.steps:
            if generator_for(op.name) is None:
                reasons[op.index] = "no OpenCL kernel"
            else:
                try:
                    generated[op.index] = (op, self._generate(op, [], params.get(op.index, {})))
                except Unsupported as e:
                    reasons[op.index] = str(e)
            base.append(PassStep(op, [(op, fn)], [], op.index in generated))
        self.pass_counts = {"fold_constants": len(self.runner.sg.operators) - len(self.runner.steps)}
        steps, self.pass_counts["cull_dead"] = cull_dead(base, self.sg)
        steps, self.pass_counts["drop_identities"] = drop_identities(steps, self.sg, consts)
        steps, self.pass_counts["merge_pad"] = merge_pad(steps, self.sg, consts)
        steps, self.pass_counts["fuse_elementwise"] = fuse_elementwise(steps, self.sg, consts)
        out = []
        for ps in steps:
            if not ps.gpu:
                out.append(Step(ps.op, "cpu", members=ps.members, reason=reasons.get(ps.op.index, "")))
                continue
            first = generated.get(ps.op.index)
            if first is not None and first[0] is ps.op and not ps.epilogue:
                specs = first[1]  # no pass changed this op: the check's kernels are the kernels
            else:
                specs = self._generate(ps.op, ps.epilogue, params.get(ps.op.index, {}))
            out.append(Step(ps.op, "gpu", specs, members=ps.members, epilogue=ps.epilogue,
                            params=params.get(ps.op.index, {})))
        return out

    def _generate(self, op: Operator, epilogue: list, params: dict) -> list[KernelSpec]:
        """The kernels of ``op`` (with its fused ops) for these generator parameters; raises Unsupported."""
        return generator_for(op.name)(GenContext(op, self.sg, self.runner.consts, self.fp16, params, epilogue,
                                                 frozenset(self.runner.variables)))

    # -- tuning ----------------------------------------------------------------

    def _apply_tuning(self, config, explicit: set) -> None:
        """Give every tunable device step its recorded parameters; search those without a record
        (unless tuning is "none"), record the results, and regenerate the steps' kernels."""
        from ..autotune import TuneTask, TuningRecord, kernel_key, tune_tasks
        from ..autotune.measure import KernelBench
        from ..autotune.tuner import space_size

        dev = self.device.identity.key()
        groups: dict[str, list[Step]] = {}
        for s in self.steps:
            if s.device != "gpu" or s.op.index in explicit or not s.specs:
                continue
            space = s.specs[0].space
            if space_size(space) <= 1 or any("state" in sp.params for sp in s.specs):
                continue
            if any(bhwc(self.sg.tensors[t].shape) is None for sp in s.specs for t in sp.inputs + sp.outputs):
                continue
            key = kernel_key(s.op.name, s.specs, self.fp16, f"{s.op.name.lower()}_{s.op.index}")
            groups.setdefault(key, []).append(s)
        todo = []
        for key, steps in groups.items():
            rec = config.db.get(dev, key) if config.db is not None and config.reuse_records else None
            if rec is not None:
                self._set_params(steps, rec.params)
                self.tuning_results.append(TunedKernel(key, steps[0].op.name, len(steps), rec.default_us,
                                                       rec.best_us, rec.params, "record",
                                                       flops=sum(sp.flops for sp in steps[0].specs)))
            elif config.mode != "none":
                s = steps[0]
                space = s.specs[0].space
                default = {k: s.specs[0].params.get(k, None if None in v else v[0]) for k, v in space.items()}
                layouts = {t: self._layout(t) for sp in s.specs for t in sp.inputs + sp.outputs}
                todo.append(TuneTask(key, s.op.name, lambda p, s=s: self._generate(s.op, s.epilogue, p), space,
                                     default, layouts))
        if not todo:
            return
        t0 = time.perf_counter()
        results = tune_tasks(todo, lambda task: KernelBench(self.cl, self.ctx, self.device, self.fp16, task.layouts,
                                                            seed=config.seed), dev, config)
        records = {}
        for r in results:
            self._set_params(groups[r.key], r.params)
            self.tuning_results.append(TunedKernel(r.key, r.op, len(groups[r.key]), r.default_us, r.best_us,
                                                   r.params, "tuned", r,
                                                   flops=sum(sp.flops for sp in groups[r.key][0].specs)))
            if r.strategy != "budget spent":
                records[r.key] = TuningRecord(r.params, r.default_us, r.best_us, r.trials, r.op)
        if records and config.db is not None:
            config.db.put_many(dev, records)
        self.tuning_seconds = time.perf_counter() - t0
        log.info("tuned %d kernels in %.1f s", len(results), self.tuning_seconds)

    def _set_params(self, steps: list[Step], params: dict) -> None:
        if not params:
            return
        for s in steps:
            try:
                specs = self._generate(s.op, s.epilogue, params)
            except Unsupported as e:  # a record from another shape family: keep the heuristics
                log.info("tuned parameters %s do not apply to %s: %s", params, s.op.name, e)
                continue
            s.specs, s.params = specs, dict(params)

    def _limit_partitions(self, max_partitions: int) -> None:
        runs, cur = [], []
        for i, s in enumerate(self.steps):
            if s.device == "gpu":
                cur.append(i)
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        if len(runs) <= max_partitions:
            self.partitions = len(runs)
            return
        keep = set()
        for run in sorted(runs, key=len, reverse=True)[:max_partitions]:
            keep.update(run)
        for i, s in enumerate(self.steps):
            if s.device == "gpu" and i not in keep:
                s.device, s.reason = "cpu", "outside the max_delegated_partitions largest partitions"
        self.partitions = max_partitions

    def _report(self) -> None:
        cpu = [s for s in self.steps if s.device == "cpu"]
        self.cpu_op_count = sum(len(s.members) for s in cpu)
        self.gpu_op_count = sum(len(s.members) for s in self.steps) - self.cpu_op_count
        if cpu:
            lines = [f"op code #{op.builtin_code} ({op.name}) cannot be handled by this delegate: {s.reason}"
                     for s in cpu for op, _ in s.members]
            log.warning("%s\n%d ops run on the OpenCL device (%d partitions), %d on the CPU",
                        "\n".join(dict.fromkeys(lines)), self.gpu_op_count, self.partitions, self.cpu_op_count)

    # -- compile and allocate ------------------------------------------------

    def _build(self, sources: list[str], store: bool = True):
        return build_program(self.cl, self.ctx, sources, self.fp16, self.store if store else None, self.device,
                             self.build_stats, prefetched=self._prefetched if store else None)

    def _restore(self, record) -> bool:
        """Apply a stored plan's placement to the freshly selected steps; False if they differ."""
        if [s.op.index for s in self.steps] != [r.op_index for r in record.steps]:
            return False
        for s, r in zip(self.steps, record.steps):
            if s.device == "gpu" and not r.on_device:
                s.device, s.reason = "cpu", r.reason  # e.g. its kernel failed to build, or a partition limit
            elif s.device == "cpu" and r.on_device:
                return False
        return True

    def _compile(self) -> None:
        """One program for all kernels; if the compiler rejects it, find the kernels it rejects
        and run those ops on the CPU instead (with the reason), never failing the model."""
        cl = self.cl
        gpu_steps = [s for s in self.steps if s.device == "gpu"]
        if not gpu_steps:  # nothing delegated (e.g. an integer model): no program to build
            self.program = None
            return
        try:
            self.program = self._build([spec.source for s in gpu_steps for spec in s.specs])
            return
        except cl.Error as e:
            log.info("OpenCL build of the whole plan failed, checking kernels one by one: %s", str(e)[:200])
        for s in gpu_steps:
            try:
                self._build([spec.source for spec in s.specs], store=False)
            except cl.Error as e:
                first = next((ln for ln in str(e).splitlines() if "error" in ln), str(e).splitlines()[0])
                s.device, s.reason = "cpu", f"OpenCL build failed: {first.strip()[:160]}"
        try:
            self.program = self._build([spec.source for s in self.steps if s.device == "gpu" for spec in s.specs])
        except cl.Error as e:
            raise RuntimeError(f"OpenCL build failed on {self.device.identity.device}: {e}") from e

    def _layout(self, idx: int) -> Layout:
        return bhwc(self.sg.tensors[idx].shape)

    def _allocate(self) -> None:
        cl, ctx = self.cl, self.ctx
        mf = cl.mem_flags
        n = len(self.steps)
        on_gpu: dict[int, tuple[int, int]] = {}  # tensor -> (first, last) step touching it on the device
        self.uploads_after: dict[int, list[int]] = {}  # step -> tensors produced on CPU, then read on GPU
        self.downloads_before: dict[int, list[int]] = {}  # step -> tensors produced on GPU, read on CPU
        producer = {}
        for i, s in enumerate(self.steps):
            for op, _ in s.members:
                for t in op.outputs:
                    producer[t] = i
        graph_in, graph_out = set(self.sg.inputs), set(self.sg.outputs)

        def touch(t, i):
            a, b = on_gpu.get(t, (i, i))
            on_gpu[t] = (min(a, i), max(b, i))

        for i, s in enumerate(self.steps):
            if s.device != "gpu":
                continue
            for spec in s.specs:
                for t in spec.inputs:
                    touch(t, i)
                    p = producer.get(t)
                    if t in graph_in:
                        touch(t, -1)
                    elif p is not None and self.steps[p].device == "cpu":
                        touch(t, p)
                        self.uploads_after.setdefault(p, []).append(t)
                for t in spec.outputs:
                    touch(t, i)
        for i, s in enumerate(self.steps):
            if s.device == "cpu":
                for t in {t for op, _ in s.members for t in op.inputs}:
                    p = producer.get(t)
                    if t >= 0 and p is not None and p != i and self.steps[p].device == "gpu":
                        self.downloads_before.setdefault(i, []).append(t)
                        touch(t, i)
        for t in graph_out:
            if t in on_gpu:
                touch(t, n)
        self.state_tensors = sorted({t for s in self.steps if s.device == "gpu" for spec in s.specs
                                     for t in spec.params.get("state", [])})
        for t in self.state_tensors:
            touch(t, -1)
            touch(t, n)
        self.input_uploads = [t for t in self.sg.inputs if t in on_gpu] + self.state_tensors
        self.output_downloads = [t for t in self.sg.outputs if t in producer and self.steps[producer[t]].device == "gpu"]
        sizes = {t: self._layout(t).elements * self.itemsize for t in on_gpu}
        assignment, buf_sizes = plan_memory({t: (sizes[t],) + on_gpu[t] for t in on_gpu})
        self.planned_bytes = sum(buf_sizes)
        self.naive_bytes = sum(sizes.values())
        self.buffers = [cl.Buffer(ctx, mf.READ_WRITE, max(sz, 16)) for sz in buf_sizes]
        self.tensor_buffer = {t: self.buffers[b] for t, b in assignment.items()}
        self.const_buffers = []
        for s in self.steps:
            if s.device != "gpu":
                continue
            for spec in s.specs:
                k, consts = bind_kernel(cl, ctx, self.program, spec, self.tensor_buffer, self.np_dtype)
                self.const_buffers.extend(consts)
                s.kernels.append(k)
        self.const_bytes = sum(b.size for b in self.const_buffers)
        consts = self.runner.consts
        # Every tensor a CPU step reads that no step produces and the caller does not set: a constant, or
        # (like the CPU runner's own loop) None for one that has no dense value, e.g. a sparse tensor
        ready = set(producer) | set(self.sg.inputs) | set(self.runner.variables)
        self.host_consts = {t: consts.get(t) for s in self.steps if s.device == "cpu"
                            for op, _ in s.members for t in op.inputs if t >= 0 and t not in ready}
        # graph outputs that folded to constants (e.g. an unrolled loop's counter)
        self.host_consts.update({t: consts[t] for t in self.sg.outputs if t in consts})
        self._boundary()

    def _boundary(self) -> None:
        """A dense NHWC float32 staging buffer and conversion kernels for each tensor crossing the boundary."""
        cl = self.cl
        crossing = set(self.input_uploads) | set(self.output_downloads) | set(self.state_tensors)
        for ts in list(self.uploads_after.values()) + list(self.downloads_before.values()):
            crossing.update(ts)
        self.staging: dict[int, tuple] = {}
        self.bound: set[int] = set()
        self.device_outputs = False  # allow_buffer_handle_output: bound outputs are not read back
        self.crossing = crossing
        if not crossing:
            return
        sources = [boundary_kernels(f"io_{t}", self._layout(t)) for t in sorted(crossing)]
        prog = build_program(cl, self.ctx, sources, self.fp16, self.store, self.device, self.build_stats,
                             options=[])
        for t in sorted(crossing):
            lay = self._layout(t)
            dense = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, max(4 * int(np.prod(lay.dims)), 16))
            k_in, k_out = getattr(prog, f"io_{t}_in"), getattr(prog, f"io_{t}_out")
            k_in.set_args(dense, self.tensor_buffer[t])
            k_out.set_args(self.tensor_buffer[t], dense)
            self.staging[t] = (dense, k_in, k_out, (lay.w, lay.b * lay.h, lay.s))

    # -- run -----------------------------------------------------------------

    def bind(self, t: int, buffer) -> None:
        """Use ``buffer`` (dense NHWC float32, in this plan's context) as tensor t's host-side data."""
        cl = self.cl
        if t not in self.staging:
            raise ValueError(f"tensor {t} does not cross the device boundary; only graph inputs/outputs can be bound")
        buf = getattr(buffer, "base_data", None) or getattr(buffer, "data", buffer)
        if not isinstance(buf, cl.MemoryObjectHolder):
            raise ValueError(f"bind_buffer needs a pyopencl Buffer or Array, got {type(buffer).__name__}")
        try:
            same = buf.context == self.ctx
        except cl.Error as e:
            raise ValueError(f"the buffer's OpenCL context is not usable: {e}") from e
        if not same:
            raise ValueError("the buffer belongs to another OpenCL context; create it in interpreter.gpu_context")
        need = 4 * int(np.prod(self.sg.tensors[t].shape))
        if buf.size < need:
            raise ValueError(f"buffer of {buf.size} bytes is too small for tensor {t} ({need} bytes, NHWC float32)")
        _, k_in, k_out, gsize = self.staging[t]
        k_in.set_arg(0, buf)
        k_out.set_arg(1, buf)
        self.staging[t] = (buf, k_in, k_out, gsize)
        self.bound.add(t)

    def read_bound(self, t: int) -> np.ndarray:
        """The current value of a bound output, copied from its device buffer."""
        dense = self.staging[t][0]
        host = np.empty(self.sg.tensors[t].shape, np.float32)
        self.cl.enqueue_copy(self.queue, host, dense, is_blocking=True)
        return host

    def _upload(self, t: int, value: np.ndarray) -> None:
        dense, k_in, _, gsize = self.staging[t]
        data = np.ascontiguousarray(value, dtype=np.float32)
        self.cl.enqueue_copy(self.queue, dense, data, is_blocking=False)
        self.cl.enqueue_nd_range_kernel(self.queue, k_in, gsize, None)
        self._keep.append(data)

    def _download(self, t: int) -> np.ndarray:
        dense, _, k_out, gsize = self.staging[t]
        self.cl.enqueue_nd_range_kernel(self.queue, k_out, gsize, None)
        tensor = self.sg.tensors[t]
        host = np.empty(tensor.shape, np.float32)
        self.cl.enqueue_copy(self.queue, host, dense, is_blocking=True)
        return host if tensor.dtype == np.float32 else (host != 0) if tensor.dtype == np.bool_ else host.astype(tensor.dtype)

    def run(self, inputs: list[np.ndarray]) -> dict[int, np.ndarray]:
        """Run once; returns host values of the graph outputs and of every CPU-side tensor.
        An OpenCL error on the way is a DeviceError (a RuntimeError)."""
        try:
            return self._run(inputs)
        except self.cl.Error as e:
            raise DeviceError(f"OpenCL device error during invoke ({e})") from e

    def _run(self, inputs: list[np.ndarray]) -> dict[int, np.ndarray]:
        cl, q = self.cl, self.queue
        values: dict[int, np.ndarray] = dict(self.host_consts)  # only what CPU-side ops read
        values.update(self.runner.variables)
        self._keep: list = []
        events = []
        for t, x in zip(self.sg.inputs, inputs):
            p = self.quant_in.get(t)
            values[t] = x if p is None else dequantize_values(x, p)
        for t in self.input_uploads:
            if t in self.bound:  # zero-copy: the data is already on the device, just convert the layout
                _, k_in, _, gsize = self.staging[t]
                cl.enqueue_nd_range_kernel(q, k_in, gsize, None)
            else:
                self._upload(t, values[t])
        for i, s in enumerate(self.steps):
            if s.device == "gpu":
                for spec, k in zip(s.specs, s.kernels):
                    ev = cl.enqueue_nd_range_kernel(q, k, spec.global_size, spec.local_size)
                    if self.profile:
                        events.append((spec.name, s.op, ev))
                continue
            for t in self.downloads_before.get(i, ()):
                if t not in values:
                    values[t] = self._download(t)
            for op, fn in s.members:
                outs = run_cpu_op(op, fn, [values[t] if t >= 0 else None for t in op.inputs])
                for t, v in zip(op.outputs, outs):
                    if t >= 0:
                        values[t] = self.runner._coerce(t, v)
            for t in self.uploads_after.get(i, ()):
                self._upload(t, values[t])
        for t in self.state_tensors:  # variables (LSTM state) carry over to the next invoke
            np.copyto(self.runner.variables[t], self._download(t).reshape(self.runner.variables[t].shape))
        for t in self.output_downloads:
            if t in self.bound and self.device_outputs:
                _, _, k_out, gsize = self.staging[t]
                cl.enqueue_nd_range_kernel(q, k_out, gsize, None)
                values[t] = None  # stays on the device; Interpreter.get_tensor reads it on demand
            else:
                values[t] = self._download(t)
        q.finish()
        self._keep = []
        self.last_events = events
        for t, p in self.quant_out.items():  # back to the integers the caller's model declares
            if values.get(t) is not None:
                values[t] = quantize_values(values[t], p)
        for t, x in zip(self.sg.inputs, inputs):
            if t in self.quant_in:
                values[t] = x  # (the caller's own integers)
        return values

    def profile_report(self) -> list[tuple[str, str, float]]:
        """(kernel, op name, microseconds) for the last run (needs GpuDelegate(profile=True))."""
        out = []
        for name, op, ev in self.last_events:
            out.append((name, op.name, (ev.profile.end - ev.profile.start) / 1e3))
        return out
