"""Where a plan's tensors live on the device, and how values cross between the host and the device.

Device tensors are 4-channel slices in buffers the memory planner shares between tensors whose lifetimes do
not overlap. A tensor crossing the boundary (a graph input or output, a value a CPU step reads or makes, LSTM
state) has a dense NHWC float32 staging buffer and two layout-conversion kernels; ``bind`` lets a caller's own
buffer be that staging buffer (zero-copy I/O).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..cpu.executor import SubgraphRunner
from ..kernels.base import Target
from ..kernels.common import boundary_grid, boundary_kernels, boundary_loops_slices, fp32_region
from ..kernels.program import argument_positions, kernel_args, kernel_name, make_kernel
from ..model.ir import Subgraph
from ..ops.layout import Layout, bhwc
from .memory import plan_memory
from .selection import DENSE_OUTPUT_DTYPES, Step

log = logging.getLogger("tflgpu")


@dataclass
class Staging:
    """A tensor crossing the device boundary: its dense NHWC float32 buffer (the caller's, once bound) and the
    kernels converting it to the slice layout and back, on ``grid``; none where the plan's kernel reads or writes
    the dense buffer itself (``KernelSpec.dense``)."""

    dense: object  # a pyopencl Buffer
    to_device: object | None  # kernel: dense -> slice layout
    from_device: object | None  # kernel: slice layout -> dense
    grid: tuple[int, ...]
    # a graph output's: the host array its dense buffer is made on (CL_MEM_USE_HOST_PTR), which a read maps
    # instead of copying out (zero-copy on a CPU runtime); None once the caller binds a buffer of their own
    host: np.ndarray | None = None
    # a graph input's, where the device reads host memory in place (``shares_host_memory``): the host array its dense
    # buffer is made on, which an upload writes directly (no command); None once the caller binds a buffer
    host_in: np.ndarray | None = None
    # a graph input's or output's, where the device has memory of its own: a host array in pinned memory
    # (``_pinned_arena``) that an upload copies from or a read copies into, a DMA the host does not wait for (with
    # a pageable array the driver copies on the host as well); None once the caller binds a buffer
    pinned: np.ndarray | None = None

    @property
    def upload_from(self) -> np.ndarray | None:
        """A graph input's host array its upload reads: ``host_in`` or ``pinned`` (None: the caller's value)."""
        return self.host_in if self.host_in is not None else self.pinned


# host arrays a buffer is made on start at a page: where a CPU runtime uses them in place (Intel's needs 4 KiB)
HOST_ALIGN = 4096


def aligned_empty(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialized float32 array of ``shape`` whose data starts on a ``HOST_ALIGN`` boundary."""
    n = max(4 * int(np.prod(shape)), 16)
    raw = np.empty(n + HOST_ALIGN, np.uint8)
    at = -raw.ctypes.data % HOST_ALIGN
    return raw[at:at + n].view(np.float32)[:int(np.prod(shape))].reshape(shape)


def shares_host_memory(cl, ctx) -> bool:
    """Whether the context's device (a CPU: one memory with the host) reads and writes a CL_MEM_USE_HOST_PTR
    buffer's host array in place: a write to the array between commands is what the next command sees, and what a
    finished command wrote is in the array, with no map. The OpenCL spec lets an implementation cache such a
    buffer on the device (a discrete GPU does; then only a map makes either side's writes visible), so this is
    checked, not assumed: the buffer copied once (where a cache would fill), the array written without a map and
    the buffer copied out, then the buffer written by a copy and the array read."""
    device = ctx.devices[0]
    if not device.type & cl.device_type.CPU:
        return False
    try:
        host = aligned_empty((16,))
        host[:] = 1.0
        mf = cl.mem_flags
        shared = cl.Buffer(ctx, mf.READ_WRITE | mf.USE_HOST_PTR, hostbuf=host)
        other = cl.Buffer(ctx, mf.READ_WRITE, host.nbytes)
        queue = cl.CommandQueue(ctx)
        cl.enqueue_copy(queue, other, shared)
        queue.finish()
        written = np.arange(16, dtype=np.float32) + 7
        host[:] = written
        cl.enqueue_copy(queue, other, shared)
        seen = np.empty(16, np.float32)
        cl.enqueue_copy(queue, seen, other, is_blocking=True)
        cl.enqueue_copy(queue, other, -written, is_blocking=True)
        cl.enqueue_copy(queue, shared, other)
        queue.finish()
        return bool(np.array_equal(seen, written) and np.array_equal(host, -written))
    except cl.Error:
        return False


def _dense_order(lay: Layout) -> bool:
    """Whether the slice layout of ``lay`` holds its values in dense NHWC order: no padded lanes, and either one
    pixel per image or one slice."""
    return lay.c % 4 == 0 and (lay.h * lay.w == 1 or lay.s == 1)


def _as_type(host: np.ndarray, dtype) -> np.ndarray:
    """A dense float32 read of a tensor as its own dtype (a device holds integers and bools as float values)."""
    if dtype == np.float32:
        return host
    return (host != 0) if dtype == np.bool_ else host.astype(dtype)


class DeviceTensors:
    """The buffers of one plan, bound to its compiled kernels, and the host/device transfers."""

    def __init__(self, cl, ctx, steps: list[Step], sg: Subgraph, runner: SubgraphRunner, program, fp16: bool,
                 build: Callable, target: Target):
        self.cl, self.ctx, self.sg, self.fp16, self.steps = cl, ctx, sg, fp16, steps
        mf = cl.mem_flags
        n = len(steps)
        on_gpu: dict[int, tuple[int, int]] = {}  # tensor -> (first, last) step touching it on the device
        self.uploads_after: dict[int, list[int]] = {}  # step -> tensors produced on CPU, then read on GPU
        self.downloads_before: dict[int, list[int]] = {}  # step -> tensors produced on GPU, read on CPU
        producer = {}
        for i, s in enumerate(steps):
            for op, _ in s.members:
                for t in op.outputs:
                    producer[t] = i
        graph_in, graph_out = set(self.sg.inputs), set(self.sg.outputs)

        def touch(t, i):
            a, b = on_gpu.get(t, (i, i))
            on_gpu[t] = (min(a, i), max(b, i))

        # each device tensor's storage (True: half), as its kernels declare it (graph.precision keeps every
        # kernel touching a tensor in one precision; a storage cast reads one and writes the other)
        self.half: dict[int, bool] = {}
        # a link's regions (selection: a linked concatenation's inputs in its output, a linked split's outputs and a
        # linked reshape's output in its input) share their whole's buffer: the whole is planned over all their
        # lifetimes, each region a sub-buffer at its offset
        self.regions: dict[int, tuple[int, int]] = {}  # region tensor -> (whole tensor, first element)

        def read(t, i):
            """Device step i reads t: alive from its making (an upload after a CPU step, or the invoke's start)."""
            touch(t, i)
            p = producer.get(t)
            if t in graph_in:
                touch(t, -1)
            elif p is not None and steps[p].device == "cpu":
                touch(t, p)
                ups = self.uploads_after.setdefault(p, [])
                if t not in ups:  # (once, however many device steps read it)
                    ups.append(t)

        for i, s in enumerate(steps):
            if s.device != "gpu":
                continue
            if s.link is not None:  # (a concatenation's input a CPU step makes is uploaded into its region)
                touch(s.link.whole, i)
                for t in (s.link.whole, *s.link.offsets):
                    self.half.setdefault(t, s.link.fp16)
                for t in s.link.reads:
                    read(t, i)
                for t in s.link.writes:
                    touch(t, i)
                self.regions.update({t: (s.link.whole, at) for t, at in s.link.offsets.items()})
            for spec in s.specs:
                for t in spec.inputs + spec.outputs:
                    if self.half.setdefault(t, spec.tensor_fp16(t)) != spec.tensor_fp16(t):
                        raise AssertionError(f"tensor {t} is stored in two precisions ({spec.name})")
                for t in spec.inputs:
                    read(t, i)
                for t in spec.outputs:
                    touch(t, i)
        for i, s in enumerate(steps):
            if s.device == "cpu":
                for t in {t for op, _ in s.members for t in op.inputs}:
                    p = producer.get(t)
                    if t >= 0 and p is not None and p != i and steps[p].device == "gpu":
                        self.downloads_before.setdefault(i, []).append(t)
                        touch(t, i)
        for t in graph_out:
            if t in on_gpu:
                touch(t, n)
        self.state_tensors = sorted({t for s in steps if s.device == "gpu" for spec in s.specs
                                     for t in spec.state})
        for t in self.state_tensors:
            touch(t, -1)
            touch(t, n)
        # state no CPU step reads or writes stays on the device between invokes: uploaded when the host's value
        # changed (GpuPlan.state_written), read when the host asks for it (GpuPlan.sync_state); else every invoke
        cpu_touched = {t for s in steps if s.device == "cpu" for op, _ in s.members for t in op.inputs + op.outputs}
        self.state_resident = not cpu_touched & set(self.state_tensors)
        self.input_uploads = [t for t in self.sg.inputs if t in on_gpu] + self.state_tensors
        self.output_downloads = [t for t in self.sg.outputs
                                 if t in producer and steps[producer[t]].device == "gpu"]
        for t in self.state_tensors:
            self.half.setdefault(t, fp16)
        # the share of intermediate bytes (float device tensors but the graph's inputs and outputs, and the copies
        # storage casts make) stored as half: 1.0 in an FP16 plan that keeps no op in FP32
        copies = {t for s in steps if s.device == "gpu" for spec in s.specs if spec.input_fp16 is not None
                  for t in spec.outputs}
        stored = {t: self._layout(t).elements * (2 if self.half[t] else 4) for t in on_gpu
                  if t not in graph_in and t not in graph_out and t not in copies
                  and self.sg.tensors[t].dtype == np.float32}
        self.fp16_share = (sum(n for t, n in stored.items() if self.half[t]) / sum(stored.values())
                           if stored else float(fp16))
        for t, (whole, _) in self.regions.items():
            a, b = on_gpu.pop(t)
            touch(whole, a)
            touch(whole, b)
        # graph inputs / outputs a kernel reads / writes as their dense boundary buffer: no slice-layout copy
        self.dense_steps: dict[int, list[int]] = {}  # tensor -> the steps whose kernels take its dense buffer
        for i, s in enumerate(steps):
            for t in (t for spec in s.specs for t in spec.dense) if s.device == "gpu" else ():
                self.dense_steps.setdefault(t, []).append(i)
        # a float32-stored graph input / output whose slice layout orders its values as dense NHWC does (whole slices
        # of one pixel, or one whole slice: a [1, 8] vector) needs no conversion either: its buffer is the dense one
        wholes = {w for w, _ in self.regions.values()}
        for t in sorted((graph_in | graph_out) & on_gpu.keys()):
            if t in self.dense_steps or t in self.regions or t in wholes or t in self.state_tensors \
                    or self.half.get(t, True) or self.sg.tensors[t].dtype != np.float32 \
                    or not _dense_order(self._layout(t)):
                continue
            self.dense_steps[t] = [i for i, s in enumerate(steps) if s.device == "gpu"
                                   and any(t in spec.inputs or t in spec.outputs for spec in s.specs)]
        sizes = {t: self._layout(t).elements * (2 if self.half[t] else 4) for t in on_gpu if t not in self.dense_steps}
        assignment, buf_sizes = plan_memory({t: (sizes[t],) + on_gpu[t] for t in sizes})
        self.planned_bytes = sum(buf_sizes)
        self.naive_bytes = sum(sizes.values())
        self.buffers = [cl.Buffer(ctx, mf.READ_WRITE, max(sz, 16)) for sz in buf_sizes]
        self.tensor_buffer = {t: self.buffers[b] for t, b in assignment.items()}
        self.shared_memory = shares_host_memory(cl, ctx)
        # graph outputs the host reads after the run (not a CPU step's input meanwhile): copied into pinned host
        # arrays where the device has memory of its own, else (a device reading host memory in place, or no pinned
        # memory) their dense buffers made on host arrays (an integer or bool output too: its dense buffer holds
        # the values as floats, converted after the read)
        self.arenas: dict[str, object] = {}  # "output" / "input" -> the buffer made on that host arena
        self.arena_at: dict[int, tuple[str, int]] = {}  # tensor -> (its arena, its byte offset there)
        read = [t for t in self.output_downloads if t not in self.state_tensors
                and self.sg.tensors[t].dtype in DENSE_OUTPUT_DTYPES
                and not any(t in ts for ts in self.downloads_before.values())]
        # graph inputs the host writes before the run: on host arrays the device reads in place, or pinned ones
        written = [t for t in self.sg.inputs if t in on_gpu and t not in graph_out and t not in self.state_tensors]
        self.pinned = {} if self.shared_memory else self._pinned_arena(read + written)
        self.host_out = self._host_arena("output", [t for t in read if t not in self.pinned])
        self.host_in = self._host_arena("input", written) if self.shared_memory else {}
        self.tensor_buffer.update({t: self._dense_buffer(t) for t in self.dense_steps})
        for t, (whole, at) in self.regions.items():
            size = 2 if self.half[t] else 4
            self.tensor_buffer[t] = self.tensor_buffer[whole].get_sub_region(at * size, self._layout(t).elements * size)
        self.args: dict[int, list[list]] = {}  # step index -> each spec's argument values (constants uploaded)
        self.const_buffers: dict[int, list] = {}  # step index -> its constant buffers
        for i, s in enumerate(steps):
            if s.device == "gpu":
                self.args[i], self.const_buffers[i] = self.upload_args(s.specs)
                s.kernels[:] = self.kernels(program, i, s.specs)
                s.specs[:] = [spec.uploaded() for spec in s.specs]  # (the device holds the constants now)
        self.const_bytes = sum(b.size for bufs in self.const_buffers.values() for b in bufs)
        consts = runner.consts
        # Every tensor a CPU step reads that no step produces and the caller does not set: a constant, or
        # (like the CPU runner's own loop) None for one that has no dense value, e.g. a sparse tensor
        ready = set(producer) | set(self.sg.inputs) | set(runner.variables)
        self.host_consts = {t: consts.get(t) for s in steps if s.device == "cpu"
                            for op, _ in s.members for t in op.inputs if t >= 0 and t not in ready}
        # graph outputs that folded to constants (e.g. an unrolled loop's counter)
        self.host_consts.update({t: consts[t] for t in self.sg.outputs if t in consts})
        self._boundary(build, target)

    def upload_args(self, specs: list, scratch: dict | None = None) -> tuple[list[list], list]:
        """Each spec's argument values on this plan's buffers (its constants uploaded), and the constant buffers.
        ``scratch``: buffers of tensors the memory plan does not hold (``scratch_buffers``)."""
        args, consts, uploaded = [], [], {}
        buffers = {**self.tensor_buffer, **scratch} if scratch else self.tensor_buffer
        for spec in specs:
            a, c = kernel_args(self.cl, self.ctx, spec, buffers, uploaded)
            args.append(a)
            consts.extend(c)
        return args, consts

    def scratch_buffers(self, specs: list) -> dict:
        """Buffers for the tensors a step's regenerated specs make that the memory plan holds none of: a form the
        plan did not start with may store a value its first form kept inside one kernel (a tuned ``fused=False``
        separable conv's depthwise output), made and read by this step alone. Installed with the step's kernels
        (``install_scratch``), between invokes."""
        made = {}
        for spec in specs:
            for t in spec.outputs:
                if t not in self.tensor_buffer and t not in made:
                    made[t] = self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE,
                                             max(self._layout(t).elements * (2 if spec.tensor_fp16(t) else 4), 16))
        return made

    def install_scratch(self, scratch: dict) -> None:
        self.tensor_buffer.update(scratch)

    def kernels(self, program, step: int, specs: list) -> list:
        """New kernel instances of ``program`` for a step's specs, on the arguments already uploaded for it."""
        return [make_kernel(self.cl, program, kernel_name(spec), a) for spec, a in zip(specs, self.args[step])]

    def _host_arena(self, kind: str, tensors: list[int]) -> dict[int, np.ndarray]:
        """Host arrays for ``tensors``' dense buffers: views of one page-aligned host arena, which one buffer is made
        on (CL_MEM_USE_HOST_PTR), each tensor's dense buffer a sub-buffer of it (``_dense_buffer``) starting on the
        device's base address alignment. The "output" arena: the graph outputs the host reads after the run, read
        with one map instead of one copy each (each command costs several microseconds on a CPU runtime:
        fallback_ops reads three). The "input" arena (a device reading host memory in place): the graph inputs,
        written by the upload itself, no command (a 2 KiB input's copy cost ~10 us of a 67 us LSTM invoke)."""
        if not tensors:
            return {}
        offsets, size = self._arena_layout(tensors, max(self.ctx.devices[0].mem_base_addr_align // 8, 128))
        self.arena_at.update({t: (kind, at) for t, at in offsets.items()})
        host = aligned_empty((size // 4,))
        mf = self.cl.mem_flags
        self.arenas[kind] = self.cl.Buffer(self.ctx, mf.READ_WRITE | mf.USE_HOST_PTR, hostbuf=host)
        return self._arena_views(host, offsets)

    def _pinned_arena(self, tensors: list[int]) -> dict[int, np.ndarray]:
        """Host arrays in pinned memory for ``tensors``' copies to or from the device (a device with its own
        memory): views of one CL_MEM_ALLOC_HOST_PTR buffer mapped once, for as long as any view is held (an
        array's base is the map, which unmaps itself when the last view goes). A copy from or into such memory is
        a DMA the host does not wait for; with a pageable array the driver copies it on the host as well
        (NVIDIA's OpenCL guide: pinned memory by mapping an ALLOC_HOST_PTR buffer); and an output's read is one
        copy, not a map and an unmap of a buffer made on host memory. The buffer itself is never a command's
        argument: only its mapped memory is, as the host pointer of a copy."""
        if not tensors:
            return {}
        offsets, size = self._arena_layout(tensors, HOST_ALIGN)
        mf = self.cl.mem_flags
        try:
            buf = self.cl.Buffer(self.ctx, mf.READ_WRITE | mf.ALLOC_HOST_PTR, size)
            flags = self.cl.map_flags.READ | self.cl.map_flags.WRITE
            host, _ = self.cl.enqueue_map_buffer(self.cl.CommandQueue(self.ctx), buf, flags, 0, (size // 4,),
                                                 np.float32, is_blocking=True)
        except self.cl.Error as e:  # (copies with pageable arrays still work)
            log.info("no pinned host memory for the graph's inputs and outputs (%s): their copies use pageable "
                     "arrays", e)
            return {}
        return self._arena_views(host, offsets)

    def _arena_layout(self, tensors: list[int], align: int) -> tuple[dict[int, int], int]:
        """Each tensor's byte offset in an arena of their dense buffers one after another, each starting on
        ``align``; and the arena's size."""
        at, offsets = 0, {}
        for t in tensors:
            offsets[t] = at
            at += -(-self._dense_bytes(t) // align) * align
        return offsets, at

    def _arena_views(self, host: np.ndarray, offsets: dict[int, int]) -> dict[int, np.ndarray]:
        """Each tensor's array in an arena's float32 host memory, at its byte offset, in its shape."""
        shapes = {t: self.sg.tensors[t].shape for t in offsets}
        return {t: host[at // 4:][:int(np.prod(shapes[t]))].reshape(shapes[t]) for t, at in offsets.items()}

    def input_arrays(self) -> dict[int, np.ndarray]:
        """The host arrays an invoke's uploads read the float32 graph inputs from (in the host arena a CPU device
        reads in place, or pinned memory): an Interpreter's own input buffers, where these are, spare the upload
        its copy (``set_tensor`` writes there already)."""
        found = {}
        for t, st in self.staging.items():
            if st.upload_from is not None and t in self.input_uploads and self.sg.tensors[t].dtype == np.float32:
                found[t] = st.upload_from
        return found

    def _dense_buffer(self, t: int):
        """Tensor t's dense NHWC float32 buffer: its region of a host arena where it has a host array
        (``host_out`` / ``host_in``)."""
        if t in self.arena_at:
            kind, at = self.arena_at[t]
            return self.arenas[kind].get_sub_region(at, self._dense_bytes(t))
        return self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, self._dense_bytes(t))

    def _dense_bytes(self, t: int) -> int:
        """The size of tensor t's dense NHWC float32 buffer (at least 16 bytes: no empty buffer)."""
        return max(4 * int(np.prod(self.sg.tensors[t].shape)), 16)

    def _layout(self, idx: int) -> Layout:
        return bhwc(self.sg.tensors[idx].shape)

    def _boundary(self, build: Callable, target: Target) -> None:
        """A dense NHWC float32 staging buffer and conversion kernels for each tensor crossing the boundary."""
        cl = self.cl
        crossing = set(self.input_uploads) | set(self.output_downloads) | set(self.state_tensors)
        for ts in list(self.uploads_after.values()) + list(self.downloads_before.values()):
            crossing.update(ts)
        self.staging: dict[int, Staging] = {}
        self.bound: set[int] = set()
        if not crossing:
            return
        for t in self.dense_steps.keys() & crossing:  # (its kernels convert it themselves)
            self.staging[t] = Staging(self.tensor_buffer[t], None, None, (), self.host_out.get(t), self.host_in.get(t),
                                      self.pinned.get(t))
        converted = sorted(crossing - self.dense_steps.keys())
        loops = {t: boundary_loops_slices(self._layout(t), target.gpu) for t in converted}
        sources = [boundary_kernels(f"io_{t}", self._layout(t), loops[t]) if self.half[t] == self.fp16
                   else fp32_region(boundary_kernels(f"io_{t}", self._layout(t), loops[t])) for t in converted]
        prog = build(sources) if sources else None
        for t in converted:
            lay = self._layout(t)
            dense = self._dense_buffer(t)
            self.staging[t] = Staging(dense, make_kernel(cl, prog, f"io_{t}_in", [dense, self.tensor_buffer[t]]),
                                      make_kernel(cl, prog, f"io_{t}_out", [self.tensor_buffer[t], dense]),
                                      boundary_grid(lay, loops[t]), self.host_out.get(t), self.host_in.get(t),
                                      self.pinned.get(t))

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
        st = self.staging[t]
        st.dense, st.host, st.host_in, st.pinned = buf, None, None, None
        self.bound.add(t)
        if t in self.dense_steps:  # (the kernels reading / writing it take the caller's buffer instead)
            self.tensor_buffer[t] = buf
            for i in self.dense_steps[t]:
                self.rebind(i)
            return
        st.to_device.set_arg(0, buf)
        st.from_device.set_arg(1, buf)

    def rebind(self, step: int) -> None:
        """Give a step's kernels the caller's buffers for the dense boundary tensors it reads or writes that were
        bound (``bind``): after a bind, and after background work installed new kernel instances."""
        s = self.steps[step]
        for spec, k, args in zip(s.specs, s.kernels, self.args[step]):
            for a, pos in zip(spec.args, argument_positions(spec)):  # (a tensor is never packed: pos is an int)
                if a.kind == "tensor" and a.value in self.dense_steps and a.value in self.bound:
                    args[pos] = self.tensor_buffer[a.value]
                    k.set_arg(pos, args[pos])

    def read_bound(self, queue, t: int) -> np.ndarray:
        """The current value of a bound output, copied from its device buffer."""
        dense = self.staging[t].dense
        host = np.empty(self.sg.tensors[t].shape, np.float32)
        self.cl.enqueue_copy(queue, host, dense, is_blocking=True)
        return host

    def upload(self, queue, t: int, value: np.ndarray, keep: list) -> None:
        """Tensor t's host value to its dense buffer (then its slice layout), without waiting: written into the
        buffer's host array where the device reads it in place (the previous invoke's commands are done), else
        copied by a command, from pinned memory where there is some (``keep`` holds a pageable host array until
        the queue is finished). No host copy where ``value`` is that array (``input_arrays``)."""
        st = self.staging[t]
        host = st.upload_from
        if host is not None:
            if value is not host:  # (an Interpreter's buffer is this array: ``input_arrays``)
                np.copyto(host, np.reshape(value, host.shape), casting="unsafe")
            if st.pinned is not None:
                self.cl.enqueue_copy(queue, st.dense, st.pinned, is_blocking=False)
        else:
            data = np.ascontiguousarray(value, dtype=np.float32)
            self.cl.enqueue_copy(queue, st.dense, data, is_blocking=False)
            keep.append(data)  # (until the queue is finished)
        if st.to_device is not None:
            self.cl.enqueue_nd_range_kernel(queue, st.to_device, st.grid, None)

    def fetch_outputs(self, queue, ts: list[int]) -> dict[int, Callable[[], np.ndarray]]:
        """``fetch`` for several tensors, those on the output arena's host arrays read with one map of the arena (or
        none, where the device shares the host's memory): each returned function gives its value once the queue is
        finished."""
        mapped = [t for t in ts if self.staging[t].host is not None]
        if len(mapped) < 2 or self.shared_memory:  # (shared: ``fetch`` maps nothing)
            return {t: self.fetch(queue, t) for t in ts}
        getters = {t: self.fetch(queue, t) for t in ts if t not in mapped}
        for t in mapped:
            st = self.staging[t]
            if st.from_device is not None:
                self.cl.enqueue_nd_range_kernel(queue, st.from_device, st.grid, None)
        arena = self.arenas["output"]
        view, _ = self.cl.enqueue_map_buffer(queue, arena, self.cl.map_flags.READ, 0, (arena.size // 4,), np.float32,
                                             is_blocking=False)
        held = [view]

        def value(t: int) -> np.ndarray:
            if held:  # (the first read after the wait unmaps: the host arrays hold every output by then)
                held.pop().base.release(queue)
            return _as_type(self.staging[t].host, self.sg.tensors[t].dtype)

        getters.update({t: (lambda t=t: value(t)) for t in mapped})
        return getters

    def fetch(self, queue, t: int) -> Callable[[], np.ndarray]:
        """Enqueue reading tensor t to the host, without waiting: the returned function gives its value once the
        queue is finished (an invoke's outputs and state are read with one wait, not one each)."""
        st = self.staging[t]
        if st.from_device is not None:
            self.cl.enqueue_nd_range_kernel(queue, st.from_device, st.grid, None)
        tensor = self.sg.tensors[t]
        if st.pinned is not None:
            self.cl.enqueue_copy(queue, st.pinned, st.dense, is_blocking=False)
            return lambda: _as_type(st.pinned, tensor.dtype)
        if st.host is not None and self.shared_memory:  # (the finished kernels' values are in its host array)
            return lambda: _as_type(st.host, tensor.dtype)
        if st.host is not None:  # (the buffer's own memory: mapped for the kernels' values to be there, unmapped)
            mapped, _ = self.cl.enqueue_map_buffer(queue, st.dense, self.cl.map_flags.READ, 0, st.host.shape,
                                                   np.float32, is_blocking=False)

            def mapped_value() -> np.ndarray:
                mapped.base.release(queue)
                return _as_type(st.host, tensor.dtype)

            return mapped_value
        host = np.empty(tensor.shape, np.float32)
        self.cl.enqueue_copy(queue, host, st.dense, is_blocking=False)
        return lambda: _as_type(host, tensor.dtype)

    def download(self, queue, t: int) -> np.ndarray:
        """Tensor t's value on the host, now."""
        value = self.fetch(queue, t)
        queue.finish()
        return value()
