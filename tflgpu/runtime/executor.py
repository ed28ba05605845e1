"""The delegated plan: which ops run on the OpenCL device, their compiled kernels, buffers, and invoke().

Built once per (model, plan options, input shapes, device): ``selection`` places the ops and runs the graph
passes, ``tuning`` decides the kernels' parameters, this module compiles them into one program, and
``transfers`` allocates the buffers. ``run`` then uploads the inputs, enqueues every launch, copies across
partition boundaries only where a CPU op needs a value, and reads the outputs.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace

import numpy as np

from ..autotune.exchange import NearestRecords
from ..autotune.measure import KernelBench
from ..cache.plans import StepRecord
from ..cpu.executor import SubgraphRunner
from ..graph.sizes import DataSizes
from ..kernels import Target
from ..kernels.common import CONST_KINDS, KernelSpec, relayout_cache
from ..kernels.program import ProgramMemo, build_program, compiled_sources, program_key, stored_bytes
from ..ops.layout import bhwc
from ..ops.quantization import dequantize_values, quantize_values
from . import DeviceError, EmptyTensorError
from .background import Activity, Background, BackgroundStatus, SwapQueue
from .cadence import CANDIDATES, DIRECT, NEVER, Cadence, CadenceTrial
from .config import PlanConfig
from .device import DeviceInfo, check_process, forked_child
from .enqueue import Launcher
from .precision import (
    PrecisionChoice,
    check_calibration,
    choose_precision,
    default_calibration,
    output_steps,
    with_casts,
)
from .programs import PlanProgram
from .selection import (
    KernelMaker,
    dense_boundary,
    fold_shapes,
    hand_over,
    limit_partitions,
    link_concatenations,
    link_reshapes,
    link_splits,
    propagate_shapes,
    report_placement,
    restore,
    select,
)
from .startup import StartupClock
from .transfers import DeviceCommand, DeviceTensors
from .tuning import PartRecords, TunedKernel, apply_tuning, background_jobs
from .upgrades import store_tuned_plan, tier_up

log = logging.getLogger("tflgpu")


@dataclass
class KernelLaunch:
    """One kernel launch of a profiled run: its layer, op, OpenCL event and the host clock at its enqueue."""

    layer: str  # named after its op's layer (``conv_2d_17``), not the shared function it runs
    op: str
    event: object  # a pyopencl Event with profiling info
    enqueued_ns: int  # time.perf_counter_ns() when it was enqueued
    spec: KernelSpec | None = None  # what was launched (its flop count; GpuPlan.spec_bytes gives its bytes)

    @property
    def us(self) -> float:
        return (self.event.profile.end - self.event.profile.start) / 1e3


@dataclass
class HostSpan:
    """Host-side work of a profiled run: a CPU op, or a copy between host and device."""

    kind: str  # "cpu op" | "upload" | "download"
    label: str
    start_ns: int  # time.perf_counter_ns()
    end_ns: int


@dataclass
class RunTimeline:
    """What one profiled run did, in order: kernel launches (device clock, in their events) and host spans."""

    launches: list[KernelLaunch] = field(default_factory=list)
    host: list[HostSpan] = field(default_factory=list)
    transfers: list[DeviceCommand] = field(default_factory=list)  # the boundary tensors' copies, maps, conversions

    @contextmanager
    def span(self, kind: str, template: str, *args):
        """Time the block as a host span labelled ``template.format(*args)``."""
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            self.host.append(HostSpan(kind, template.format(*args), t0, time.perf_counter_ns()))


_NO_SPAN = nullcontext()  # an unprofiled run: no clock read, no label made


def _layer_name(kernel: str, op) -> str:
    rest = kernel.split("_", 1)[1:]  # (after the shared function's name: a spec's own suffix)
    return "_".join([f"{op.name.lower()}_{op.index}", *rest])


class GpuPlan:
    def __init__(self, runner: SubgraphRunner, device: DeviceInfo, config: PlanConfig | None = None, *,
                 profile: bool = False, params: dict | None = None, input_shapes: list | None = None, tuning=None,
                 cache=None, quant_io=None, device_outputs: bool = False, earlier_passes: dict | None = None,
                 tiered: bool = False, clock: StartupClock | None = None, calibration=None, context=None):
        """``params``: explicit generator parameters by op index (not tuned). ``tuning``: a TuningConfig.
        ``cache``: a ``tflgpu.cache.PlanCache`` — a stored plan for these options and shapes is used as is
        (no shape propagation, graph-pass search, tuning or compilation), and a plan built here is stored.
        ``quant_io``: for a quantized model's float view (``runner.sg``), the quantization of tensors the
        caller sees as integers: dequantized on the way in, quantized on the way out. ``device_outputs``:
        bound outputs stay on the device. ``earlier_passes``: counts of transforms made before this plan.
        ``tiered``: a program not in the cache starts from a quick build, and the optimized one is built in
        the background (runtime.background), as is a "background" tuning search. ``clock``: where the
        start-up phases are timed (the caller's, continued). ``calibration``: the caller's inputs for an FP16
        plan's precision choice (runtime.precision; None: random ones in each input's range). ``context``: the
        context and queue of ``device`` to work in (``device.SharedContext``; None: new ones), as an interpreter's
        plans share them, so that buffers its caller bound stay usable after a resize and what it enqueues is
        ordered with the invokes."""
        import pyopencl as cl

        config = config or PlanConfig()
        sizes = DataSizes.of(runner.sg)  # (what the input values size stays on the CPU)
        explicit = set(params or {})  # (the caller's; a stored plan's parameters are decisions tuning may revisit)
        self.cl, self.runner, self.device, self.config = cl, runner, device, config
        self.fp16, self.profile, self.device_outputs = config.fp16, profile, device_outputs
        quant_io = quant_io or {}
        self.quant_in = {t: p for t, p in quant_io.items() if t in runner.sg.inputs}  # dequantized per run
        self.quant_out = {t: p for t, p in quant_io.items() if t not in self.quant_in}  # quantized per run
        self.input_shapes = [tuple(s) for s in (input_shapes or [runner.sg.tensors[i].shape for i in runner.sg.inputs])]
        self.store = cache.store if cache is not None else None
        self.cache, self.activity, self.swaps = cache, Activity(), SwapQueue()
        self.background: Background | None = None
        self.clock = clock = clock or StartupClock()
        self.build_stats = {"source_builds": 0, "binary_loads": 0, "plan": "built", "tier": "optimized"}
        dev = device.identity.key()
        clock.phase("stored plan", "looking for a plan of these options and shapes")
        record = cache.load(self.input_shapes, dev, len(runner.sg.tensors)) if cache else None
        context = context if context is not None else device.shared_context(profile)
        self.ctx = context.ctx
        # programs a kernel search built in this context lately, which a swap of its winner into the plan builds again
        self.built = ProgramMemo()
        self.programs = PlanProgram(cl, self.ctx, device, self.fp16, self.store, self.build_stats, tiered,
                                    record.program_key if record is not None else None)
        if record is not None:
            self.sg = replace(runner.sg, tensors=[replace(t, shape=tuple(shape))
                                                  for t, shape in zip(runner.sg.tensors, record.tensor_shapes)])
            params = {s.op_index: s.params for s in record.steps if s.on_device and s.params}
        else:
            clock.phase("shapes", "every tensor's shape for these inputs (ops.shapes; a CPU run on zeros where values "
                                  "may decide one)")
            self.sg = propagate_shapes(runner, self.input_shapes)
        empty = next((t for t in self.sg.tensors if t.empty_values(t.shape) and t.index not in sizes.sized), None)
        if empty is not None:
            raise EmptyTensorError(f"tensor {empty.index} ({empty.name!r}) has no elements at the input shapes "
                                   f"{self.input_shapes}: {list(empty.shape)}")
        runner = fold_shapes(runner, self.sg, sizes)  # (the shapes this plan knows: its reshapes' shapes constant)
        self.base_tensors = len(self.sg.tensors)  # (a stored plan holds these; storage casts add their copies)
        self.precision, fp32_ops = PrecisionChoice(), frozenset()
        if self.fp16:
            if record is not None:
                self.precision = record.precision
            else:
                clock.phase("precision", "which ops FP16 storage would cost accuracy (calibrated on the CPU kernels)")
                samples = (check_calibration(calibration, self.sg, self.input_shapes, self.quant_in)
                           if calibration is not None else
                           default_calibration(self.sg, self.input_shapes, self.quant_in))
                self.precision = choose_precision(runner, samples, config.fp16_error_budget,
                                                  output_steps(runner.sg, self.quant_out), self.sg)
            runner, self.sg, fp32_ops = with_casts(runner, self.sg, self.precision)
            self.runner = runner
            sizes = DataSizes.of(runner.sg) if sizes else sizes  # (the storage casts of a sized tensor too)
        clock.phase("passes and kernels", "placement, graph passes, kernel generation")
        # the fallback chain of records (autotune.exchange), for the steps' kernels and a composite op's unfused parts
        # (no database, GpuDelegate(tuning_db=False): the heuristics alone, the shipped records too left out)
        reuse = tuning is not None and tuning.db is not None and tuning.reuse_records
        nearest = NearestRecords(tuning.db, device.identity.as_dict()) if reuse else None
        parts = PartRecords(tuning.db, dev, nearest) if reuse else None
        self.make = make = KernelMaker(self.sg, runner.consts, self.fp16, frozenset(runner.variables), fp32_ops,
                                      Target.of(device.cl_device, device.identity.device_type), part_params=parts)
        with relayout_cache():  # (weights re-laid out once, however often their op is generated)
            self.steps, passes = select(runner, make, params or {}, config.fuse_regions, config.fuse_expansions,
                                        sizes)
            if record is not None and not restore(self.steps, record):
                cache.reject(record, dev, "its steps no longer match what the graph passes produce")
                record, params = None, None
                self.steps, passes = select(runner, make, {}, config.fuse_regions, config.fuse_expansions, sizes)
            self.pass_counts = {**(earlier_passes or {}), **passes}
            if config.dense_boundary:
                make, self.pass_counts["dense_boundary"] = dense_boundary(self.steps, make)
                self.make = make
            self.queue = context.queue
            # (a profiled plan launches through pyopencl: its timeline is the events)
            self.launch = None if profile else Launcher.make(cl, self.queue)
            self.tuning_results: list[TunedKernel] = []  # one per tunable kernel identity
            self.tuning_seconds = 0.0
            ctx, fp16 = self.ctx, self.fp16  # (the bench must not hold the plan: background work outlives no plan)
            built = self.built
            bench = lambda task: KernelBench(cl, ctx, device, fp16, task.layouts, seed=tuning.seed, programs=built)
            untuned = []
            if tuning is None or tuning.mode in ("none", "background"):
                clock.phase("tuning records", "records of this device")
            else:
                clock.phase("tuning", f"searching kernels without a record ({tuning.mode})")
            if tuning is not None:  # (a stored plan's too: records since, and kernels it holds no decision for)
                self.tuning_results, self.tuning_seconds, untuned = apply_tuning(
                    self.steps, make, tuning, dev, explicit=explicit, bench=bench, nearest=nearest, parts=parts,
                    restored=record is not None)
        align = max(device.cl_device.mem_base_addr_align // 8, 1)  # (bits)
        if config.link_concat:
            self.pass_counts["link_concat"] = link_concatenations(self.steps, make, align)
        if config.link_split:
            self.pass_counts["link_split"] = link_splits(self.steps, make, align)
        if config.link_reshape:
            self.pass_counts["link_reshape"] = link_reshapes(self.steps, make)
        if config.hand_over:
            with relayout_cache():
                make, self.pass_counts["hand_over"] = hand_over(self.steps, make)
            self.make = make
        self.program = self.programs.compile(self.steps, clock)
        clock.phase("buffers", "device buffers, constants, kernel arguments")
        self.partitions = limit_partitions(self.steps, config.max_partitions)
        if record is not None:
            self.build_stats["plan"] = "cache"
        self.gpu_op_count, self.cpu_op_count = report_placement(self.steps, self.partitions)
        self.io = DeviceTensors(cl, self.ctx, self.steps, self.sg, runner, self.program, self.fp16,
                                lambda sources: build_program(cl, self.ctx, sources, self.fp16, self.store, device,
                                                              self.build_stats, options=[]),
                                make.target)
        if cache is not None and (record is None or self.program_key() != record.program_key):
            self.save_record()  # (a stored plan that records or a search changed since: stored as it is now)
        clock.stop()
        self.last_run = RunTimeline()  # (profiled runs)
        self._state_at = "host"
        # when an invoke flushes its queue (runtime.cadence): measured on a GPU, never on a CPU device
        self.cadences = (CANDIDATES + (DIRECT if self.launch is not None else ())) if make.target.gpu else (NEVER,)
        self.cadence = self.cadence_trial()
        jobs = ([tier_up] if self.build_stats["tier"] == "quick" else []) + \
            (background_jobs(untuned, tuning, dev, bench) + [store_tuned_plan] if untuned else [])
        if jobs:  # (the last job: the search is over, nothing builds its programs again)
            self.background = Background(self, [*jobs, lambda bg: bg.plan().built.clear()], len(untuned),
                                         self.build_stats["tier"])
        else:
            self.built.clear()

    def save_record(self, tuned: dict[int, tuple[list, dict]] | None = None) -> list[str]:
        """Store this plan (its steps' placement and parameters, shapes, program) for a later warm start;
        ``tuned``: (specs, parameters) by step index, for kernels not installed yet. Returns the program's sources.
        """
        tuned = tuned or {}
        steps = [StepRecord(s.op.index, s.device == "gpu", tuned[i][1] if i in tuned else s.params, s.reason)
                 for i, s in enumerate(self.steps)]
        sources = self._sources(tuned)
        self.cache.save(steps, self.input_shapes, [t.shape for t in self.sg.tensors[:self.base_tensors]],
                        program_key(sources, self.fp16), self.device.identity.key(), self.precision)
        return sources

    def _sources(self, tuned: dict[int, tuple[list, dict]]) -> list[str]:
        return compiled_sources([spec for i, s in enumerate(self.steps) if s.device == "gpu"
                                 for spec in (tuned[i][0] if i in tuned else s.specs)])

    def program_key(self) -> str:
        """The key of the program of the device steps' kernels as they are now (what a stored plan names)."""
        return program_key(self._sources({}), self.fp16)

    # -- background work: tier-up and tuning results (runtime.upgrades), installed between invokes ------

    def background_status(self) -> BackgroundStatus | None:
        return self.background.current() if self.background is not None else None

    def close(self) -> None:
        """Stop background work (after the compile or launch it is in). A launch of this plan's kernels in flight
        (a timing round) ends before this returns: the next plan enqueues on the same queue, and the round's
        kernels may write the caller's bound buffers. In a forked child it does nothing: the parent's threads
        are not there, and a lock one of them held stays held."""
        if forked_child():
            return
        self.activity.stop()
        self.activity.wait_launches()


    planned_bytes = property(lambda self: self.io.planned_bytes)
    naive_bytes = property(lambda self: self.io.naive_bytes)
    const_bytes = property(lambda self: self.io.const_bytes)
    buffers = property(lambda self: self.io.buffers)
    bound = property(lambda self: self.io.bound)

    def bind(self, t: int, buffer) -> None:
        """Use ``buffer`` (dense NHWC float32, in this plan's context) as tensor t's host-side data."""
        check_process()
        self.io.bind(t, buffer)

    def input_arrays(self) -> dict[int, np.ndarray]:
        """Graph input -> the host array its upload reads (``DeviceTensors.input_arrays``)."""
        return self.io.input_arrays()

    def read_bound(self, t: int) -> np.ndarray:
        """The current value of a bound output, copied from its device buffer."""
        check_process()
        return self.io.read_bound(self.queue, t)

    # -- run -----------------------------------------------------------------

    def run(self, inputs: list[np.ndarray]) -> dict[int, np.ndarray]:
        """Run once; returns host values of the graph outputs and of every CPU-side tensor.
        Kernels the background work has ready are installed first. An OpenCL error on the way is a
        DeviceError (a RuntimeError); in a child forked after OpenCL was opened, a ForkedProcessError."""
        check_process()  # (first: a lock the parent's background thread held at the fork stays held here)
        with self.activity.invoke():
            try:
                if self.swaps.install(self):  # (other kernels: their best cadence is measured again)
                    self.cadence = self.cadence_trial()
                    if self.launch is not None:
                        self.launch.forget()  # (the kernels swapped out)
                trial = self.cadence
                cadence = trial.next()
                if trial.chosen is not None:  # (decided: nothing to time)
                    return self._run(inputs, trial.flushes(cadence), cadence)
                t0 = time.perf_counter()
                values = self._run(inputs, trial.flushes(cadence), cadence)
                trial.record(cadence, time.perf_counter() - t0)
                return values
            except self.cl.Error as e:
                raise DeviceError(f"OpenCL device error during invoke ({e})") from e

    def flush(self) -> None:
        """Hand the queued commands to the device (clFlush), not waiting for them."""
        self.queue.flush()

    def cadence_trial(self) -> CadenceTrial:
        """A new trial of this plan's flush cadences over its current launches (runtime.cadence)."""
        return CadenceTrial(self.launch_count(), self.cadences)

    def launch_count(self) -> int:
        """The kernels an invoke launches for its steps."""
        return sum(len(s.specs) for s in self.steps if s.device == "gpu")

    def _run(self, inputs: list[np.ndarray], flush_after: frozenset[int] = frozenset(),
             cadence: Cadence = NEVER) -> dict[int, np.ndarray]:
        """``flush_after``: the counts of step launches after which the queue is flushed, ``cadence.direct``: the
        launches ask no event each (runtime.cadence)."""
        cl, q, io = self.cl, self.queue, self.io
        tp = io.tensors
        launched = 0
        values: dict[int, np.ndarray] = dict(io.host_consts)  # only what CPU-side ops read
        values.update(self.runner.variables)
        keep: list = []  # host arrays of non-blocking uploads, alive until the queue finishes
        timeline = RunTimeline() if self.profile else None
        record = timeline.transfers if timeline is not None else None

        def span(kind: str, template: str, *args):
            return timeline.span(kind, template, *args) if timeline is not None else _NO_SPAN

        for t, x in zip(self.sg.inputs, inputs):
            p = self.quant_in.get(t)
            values[t] = x if p is None else dequantize_values(x, p)
        for t in tp.input_uploads:
            if t in self.runner.variables and tp.state_resident and self._state_at != "host":
                continue  # (the device has the state's latest value)
            if t in io.bound:  # zero-copy: the data is already on the device, just convert the layout
                io.to_slices(q, t, record)
            else:
                with span("upload", "input tensor {}", t):
                    io.upload(q, t, values[t], keep, record)
        launch = self.launch if cadence.direct and self.launch is not None else (
            lambda kernel, gsize, lsize: cl.enqueue_nd_range_kernel(q, kernel, gsize, lsize))
        for i, s in enumerate(self.steps):
            if s.device == "gpu":
                for spec, k in zip(s.specs, s.kernels):
                    if timeline is None:
                        launch(k, spec.global_size, spec.local_size)
                    else:
                        at = time.perf_counter_ns()
                        ev = cl.enqueue_nd_range_kernel(q, k, spec.global_size, spec.local_size)
                        timeline.launches.append(KernelLaunch(_layer_name(spec.name, s.op), s.op.name, ev, at, spec))
                    launched += 1
                    if launched in flush_after:
                        self.flush()
                continue
            for t in tp.downloads_before.get(i, ()):
                if t not in values:
                    with span("download", "tensor {} for the CPU", t):
                        values[t] = io.download(q, t, record)
            for op, fn in s.members:
                with span("cpu op", "{} (node {})", op.name, op.index):
                    self.runner.run_op(op, fn, values)
            for t in tp.uploads_after.get(i, ()):
                with span("upload", "tensor {} from the CPU", t):
                    io.upload(q, t, values[t], keep, record)
        # the variables (LSTM state, carried over to the next invoke; where it is not kept on the device) and the
        # outputs, read with one wait
        state = {} if tp.state_resident else {t: io.fetch(q, t, record) for t in tp.state_tensors}
        if tp.state_resident and tp.state_tensors:
            self._state_at = "device"
        read = []
        for t in tp.output_downloads:
            if t in io.bound and self.device_outputs:
                io.to_dense(q, t, record)
                values[t] = None  # stays on the device; Interpreter.get_tensor reads it on demand
            else:
                read.append(t)
        outputs = io.fetch_outputs(q, read, record)
        with span("download", "{} outputs and {} state tensors", len(outputs), len(state)):
            q.finish()
            for t, value in state.items():
                np.copyto(self.runner.variables[t], value().reshape(self.runner.variables[t].shape))
            values.update({t: value() for t, value in outputs.items()})
        if timeline is not None:
            self.last_run = timeline
        for t, p in self.quant_out.items():  # back to the integers the caller's model declares
            if values.get(t) is not None:
                values[t] = quantize_values(values[t], p)
        for t, x in zip(self.sg.inputs, inputs):
            if t in self.quant_in:
                values[t] = x  # (the caller's own integers)
        return values

    # -- variables (LSTM state) kept on the device between invokes --------------------------------------------
    # _state_at: where the state's latest value is: "host" (the runner's arrays: uploaded by the next invoke),
    # "device" (read into the runner's arrays when the host asks, sync_state) or "both"

    def sync_state(self) -> None:
        """Bring the runner's variable arrays up to the device's values (after invokes that kept them there)."""
        if self._state_at != "device":
            return
        try:
            state = {t: self.io.fetch(self.queue, t) for t in self.io.tensors.state_tensors}
            self.queue.finish()
        except self.cl.Error as e:
            raise DeviceError(f"OpenCL device error reading the model's state ({e})") from e
        for t, value in state.items():
            np.copyto(self.runner.variables[t], value().reshape(self.runner.variables[t].shape))
        self._state_at = "both"

    def state_written(self, reset: bool = False) -> None:
        """The host is about to change (or, ``reset``, has reset) the runner's variable arrays: the next invoke
        uploads them. Without ``reset``, those not written keep the device's values (read first)."""
        if not reset:
            self.sync_state()
        self._state_at = "host"

    def spec_bytes(self, spec: KernelSpec) -> int:
        """The bytes a kernel's tensors (slice layout, storage precision) and constant arguments take: what it
        moves at least once (for a report's GB/s; computed when asked, never during an invoke)."""
        n = 0
        for t in spec.inputs + spec.outputs:
            lay = bhwc(self.sg.tensors[t].shape)
            elements = int(np.prod(self.sg.tensors[t].shape)) if lay is None or t in spec.dense else lay.elements
            n += elements * (2 if spec.tensor_fp16(t) else 4)
        for a in spec.args:
            if a.kind in CONST_KINDS:
                n += a.value.size * stored_bytes(spec, a)  # (an array, or Uploaded)
        return n

    def profile_report(self) -> list[tuple[str, str, float]]:
        """(kernel, op name, microseconds) for the last run (needs GpuDelegate(profile=True)); a kernel is named
        after its layer (``conv_2d_17``), not the shared function it runs."""
        return [(k.layer, k.op, k.us) for k in self.last_run.launches]
