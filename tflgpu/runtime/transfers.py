"""Where a plan's tensors live on the device, and how values cross between the host and the device.

``tensor_plan`` says which tensors the device holds over which steps, and which cross the boundary, when. Device
tensors are 4-channel slices in buffers the memory planner shares between tensors whose spans do not overlap. A
tensor crossing the boundary (a graph input or output, a value a CPU step reads or makes, LSTM state) has a dense
NHWC float32 staging buffer and two layout-conversion kernels; ``bind`` lets a caller's own buffer be that staging
buffer (zero-copy I/O).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..cpu.executor import SubgraphRunner
from ..kernels.base import Target
from ..kernels.common import BoundaryForm, boundary_args, boundary_grid, boundary_loops_slices
from ..kernels.program import argument_positions, kernel_args, kernel_name, make_kernel
from ..model.ir import Subgraph
from ..ops.layout import Layout, bhwc
from .memory import plan_memory
from .selection import DENSE_OUTPUT_DTYPES, Step
from .tensor_plan import plan_tensors

log = logging.getLogger("tflgpu")


@dataclass
class DeviceCommand:
    """A command of a profiled run that moves a boundary tensor rather than computing a layer: a copy between host
    and device memory, a map of a buffer made on host memory, or a layout conversion kernel. Device work all the
    same: what an invoke's wall time holds besides the layers' kernels (``benchmark.LaunchStats``)."""

    kind: str  # "copy in" | "copy out" | "map" | "convert"
    label: str
    event: object  # a pyopencl Event with profiling info

    @property
    def us(self) -> float:
        return (self.event.profile.end - self.event.profile.start) / 1e3

    @property
    def name(self) -> str:
        return f"{self.kind}: {self.label}"


def _recorded(record: list[DeviceCommand] | None, kind: str, label: str, event) -> None:
    """Note a boundary command in a profiled run's ``record`` (None: an unprofiled run, nothing noted)."""
    if record is not None and event is not None:
        record.append(DeviceCommand(kind, label, event))


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


def _as_type(host: np.ndarray, dtype) -> np.ndarray:
    """A dense float32 read of a tensor as its own dtype (a device holds integers and bools as float values)."""
    if dtype == np.float32:
        return host
    return (host != 0) if dtype == np.bool_ else host.astype(dtype)


def dense_bytes(sg: Subgraph, t: int) -> int:
    """The size of tensor t's dense NHWC float32 buffer (at least 16 bytes: no empty buffer)."""
    return max(4 * int(np.prod(sg.tensors[t].shape)), 16)


class HostArenas:
    """The host memory a plan's graph inputs and outputs cross in: per kind, the host arrays of several tensors as
    views of one allocation (``mapped``: one a buffer is made on; ``pinned``: pinned memory)."""

    def __init__(self, cl, ctx, sg: Subgraph):
        self.cl, self.ctx, self.sg = cl, ctx, sg
        self.buffers: dict[str, object] = {}  # "output" / "input" -> the buffer made on that host arena
        self.at: dict[int, tuple[str, int]] = {}  # tensor -> (its arena, its byte offset there)

    def mapped(self, kind: str, tensors: list[int]) -> dict[int, np.ndarray]:
        """Host arrays for ``tensors``' dense buffers: views of one page-aligned host arena, which one buffer is made
        on (CL_MEM_USE_HOST_PTR), each tensor's dense buffer a sub-buffer of it (``region``) starting on the
        device's base address alignment. The "output" arena: the graph outputs the host reads after the run, read
        with one map instead of one copy each (each command costs several microseconds on a CPU runtime:
        fallback_ops reads three). The "input" arena (a device reading host memory in place): the graph inputs,
        written by the upload itself, no command (a 2 KiB input's copy cost ~10 us of a 67 us LSTM invoke)."""
        if not tensors:
            return {}
        offsets, size = self._layout(tensors, max(self.ctx.devices[0].mem_base_addr_align // 8, 128))
        self.at.update({t: (kind, at) for t, at in offsets.items()})
        host = aligned_empty((size // 4,))
        mf = self.cl.mem_flags
        self.buffers[kind] = self.cl.Buffer(self.ctx, mf.READ_WRITE | mf.USE_HOST_PTR, hostbuf=host)
        return self._views(host, offsets)

    def pinned(self, tensors: list[int]) -> dict[int, np.ndarray]:
        """Host arrays in pinned memory for ``tensors``' copies to or from the device (a device with its own
        memory): views of one CL_MEM_ALLOC_HOST_PTR buffer mapped once, for as long as any view is held (an
        array's base is the map, which unmaps itself when the last view goes). A copy from or into such memory is
        a DMA the host does not wait for; with a pageable array the driver copies it on the host as well
        (NVIDIA's OpenCL guide: pinned memory by mapping an ALLOC_HOST_PTR buffer); and an output's read is one
        copy, not a map and an unmap of a buffer made on host memory. The buffer itself is never a command's
        argument: only its mapped memory is, as the host pointer of a copy."""
        if not tensors:
            return {}
        offsets, size = self._layout(tensors, HOST_ALIGN)
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
        return self._views(host, offsets)

    def region(self, t: int):
        """Tensor t's dense buffer as a sub-buffer of the ``mapped`` arena that holds it; None where none does."""
        if t not in self.at:
            return None
        kind, at = self.at[t]
        return self.buffers[kind].get_sub_region(at, dense_bytes(self.sg, t))

    def _layout(self, tensors: list[int], align: int) -> tuple[dict[int, int], int]:
        """Each tensor's byte offset in an arena of their dense buffers one after another, each starting on
        ``align``; and the arena's size."""
        at, offsets = 0, {}
        for t in tensors:
            offsets[t] = at
            at += -(-dense_bytes(self.sg, t) // align) * align
        return offsets, at

    def _views(self, host: np.ndarray, offsets: dict[int, int]) -> dict[int, np.ndarray]:
        """Each tensor's array in an arena's float32 host memory, at its byte offset, in its shape."""
        shapes = {t: self.sg.tensors[t].shape for t in offsets}
        return {t: host[at // 4:][:int(np.prod(shapes[t]))].reshape(shapes[t]) for t, at in offsets.items()}


class DeviceTensors:
    """The buffers of one plan, bound to its compiled kernels, and the host/device transfers."""

    def __init__(self, cl, ctx, steps: list[Step], sg: Subgraph, runner: SubgraphRunner, program, fp16: bool,
                 build: Callable, target: Target):
        self.cl, self.ctx, self.sg, self.fp16, self.steps = cl, ctx, sg, fp16, steps
        mf = cl.mem_flags
        self.tensors = tp = plan_tensors(steps, sg, fp16)
        sizes = {t: self._layout(t).elements * (2 if tp.half[t] else 4) for t in tp.spans if t not in tp.dense_steps}
        assignment, buf_sizes = plan_memory({t: (sizes[t],) + tp.spans[t] for t in sizes})
        self.planned_bytes = sum(buf_sizes)
        self.naive_bytes = sum(sizes.values())
        self.buffers = [cl.Buffer(ctx, mf.READ_WRITE, max(sz, 16)) for sz in buf_sizes]
        self.tensor_buffer = {t: self.buffers[b] for t, b in assignment.items()}
        self.shared_memory = shares_host_memory(cl, ctx)
        # graph outputs the host reads after the run (not a CPU step's input meanwhile): copied into pinned host
        # arrays where the device has memory of its own, else (a device reading host memory in place, or no pinned
        # memory) their dense buffers made on host arrays (an integer or bool output too: its dense buffer holds
        # the values as floats, converted after the read)
        self.host = HostArenas(cl, ctx, sg)
        read = [t for t in tp.output_downloads if t not in tp.state_tensors
                and self.sg.tensors[t].dtype in DENSE_OUTPUT_DTYPES
                and not any(t in ts for ts in tp.downloads_before.values())]
        # graph inputs the host writes before the run: on host arrays the device reads in place, or pinned ones
        written = [t for t in self.sg.inputs if t in tp.spans and t not in self.sg.outputs
                   and t not in tp.state_tensors]
        self.pinned = {} if self.shared_memory else self.host.pinned(read + written)
        self.host_out = self.host.mapped("output", [t for t in read if t not in self.pinned])
        self.host_in = self.host.mapped("input", written) if self.shared_memory else {}
        self.tensor_buffer.update({t: self._dense_buffer(t) for t in tp.dense_steps})
        for t, (whole, at) in tp.regions.items():
            size = 2 if tp.half[t] else 4
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
        made = {t for s in steps for op, _ in s.members for t in op.outputs}
        ready = made | set(self.sg.inputs) | set(runner.variables)
        self.host_consts = {t: consts.get(t) for s in steps if s.device == "cpu"
                            for op, _ in s.members for t in op.inputs if t >= 0 and t not in ready}
        # graph outputs that folded to constants (e.g. an unrolled loop's counter)
        self.host_consts.update({t: consts[t] for t in self.sg.outputs if t in consts})
        self._boundary(build, target)

    @property
    def fp16_share(self) -> float:
        """The share of intermediate bytes stored as half (``TensorPlan.fp16_share``)."""
        return self.tensors.fp16_share

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

    def input_arrays(self) -> dict[int, np.ndarray]:
        """The host arrays an invoke's uploads read the float32 graph inputs from (in the host arena a CPU device
        reads in place, or pinned memory): an Interpreter's own input buffers, where these are, spare the upload
        its copy (``set_tensor`` writes there already)."""
        found = {}
        for t, st in self.staging.items():
            if st.upload_from is not None and t in self.tensors.input_uploads \
                    and self.sg.tensors[t].dtype == np.float32:
                found[t] = st.upload_from
        return found

    def _dense_buffer(self, t: int):
        """Tensor t's dense NHWC float32 buffer: its region of a host arena where it has a host array
        (``host_out`` / ``host_in``)."""
        region = self.host.region(t)
        return region if region is not None else self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE,
                                                                dense_bytes(self.sg, t))

    def _layout(self, idx: int) -> Layout:
        return bhwc(self.sg.tensors[idx].shape)

    def _boundary(self, build: Callable, target: Target) -> None:
        """A dense NHWC float32 staging buffer and conversion kernels for each tensor crossing the boundary."""
        cl = self.cl
        tp = self.tensors
        crossing = tp.crossing
        self.staging: dict[int, Staging] = {}
        self.bound: set[int] = set()
        if not crossing:
            return
        for t in tp.dense_steps.keys() & crossing:  # (its kernels convert it themselves)
            self.staging[t] = Staging(self.tensor_buffer[t], None, None, (), self.host_out.get(t), self.host_in.get(t),
                                      self.pinned.get(t))
        layouts = {t: self._layout(t) for t in sorted(crossing - tp.dense_steps.keys())}
        forms = {t: BoundaryForm(lay.c, boundary_loops_slices(lay, target.gpu), tp.half[t] != self.fp16)
                 for t, lay in layouts.items()}
        # (a program each: a form's is the same for any model, so it is in the cache after its first build)
        programs = {form: build([form.source()]) for form in set(forms.values())}
        for t, lay in layouts.items():
            form, dense, slices = forms[t], self._dense_buffer(t), self.tensor_buffer[t]
            args = boundary_args(lay)
            self.staging[t] = Staging(dense, make_kernel(cl, programs[form], f"{form.name}_in", [dense, slices, *args]),
                                      make_kernel(cl, programs[form], f"{form.name}_out", [slices, dense, *args]),
                                      boundary_grid(lay, form.loop_slices), self.host_out.get(t), self.host_in.get(t),
                                      self.pinned.get(t))

    def bind(self, t: int, buffer) -> None:
        """Use ``buffer`` (dense NHWC float32, in this plan's context) as tensor t's host-side data."""
        cl = self.cl
        if t not in self.staging:
            raise ValueError(f"tensor {t} has no device buffer in this plan: the CPU kernels make or read it (an op "
                             "without an OpenCL kernel, or one whose output size its input values set); "
                             "set_tensor() / get_tensor() move its values")
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
        if t in self.tensors.dense_steps:  # (the kernels reading / writing it take the caller's buffer instead)
            self.tensor_buffer[t] = buf
            for i in self.tensors.dense_steps[t]:
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
                if a.kind == "tensor" and a.value in self.tensors.dense_steps and a.value in self.bound:
                    args[pos] = self.tensor_buffer[a.value]
                    k.set_arg(pos, args[pos])

    def read_bound(self, queue, t: int) -> np.ndarray:
        """The current value of a bound output, copied from its device buffer."""
        dense = self.staging[t].dense
        host = np.empty(self.sg.tensors[t].shape, np.float32)
        self.cl.enqueue_copy(queue, host, dense, is_blocking=True)
        return host

    def upload(self, queue, t: int, value: np.ndarray, keep: list, record: list[DeviceCommand] | None = None) -> None:
        """Tensor t's host value to its dense buffer (then its slice layout), without waiting: written into the
        buffer's host array where the device reads it in place (the previous invoke's commands are done), else
        copied by a command, from pinned memory where there is some (``keep`` holds a pageable host array until
        the queue is finished). No host copy where ``value`` is that array (``input_arrays``). ``record``: a
        profiled run's list of its commands."""
        st = self.staging[t]
        host = st.upload_from
        copied = None
        if host is not None:
            if value is not host:  # (an Interpreter's buffer is this array: ``input_arrays``)
                np.copyto(host, np.reshape(value, host.shape), casting="unsafe")
            if st.pinned is not None:
                copied = self.cl.enqueue_copy(queue, st.dense, st.pinned, is_blocking=False)
        else:
            data = np.ascontiguousarray(value, dtype=np.float32)
            copied = self.cl.enqueue_copy(queue, st.dense, data, is_blocking=False)
            keep.append(data)  # (until the queue is finished)
        _recorded(record, "copy in", f"tensor {t}", copied)
        self.to_slices(queue, t, record)

    def to_slices(self, queue, t: int, record: list[DeviceCommand] | None = None) -> None:
        """Tensor t's dense buffer to its slice layout, where a conversion kernel does that (none where the plan's
        kernel reads the dense buffer itself)."""
        st = self.staging[t]
        if st.to_device is not None:
            _recorded(record, "convert", f"tensor {t} to the slice layout",
                      self.cl.enqueue_nd_range_kernel(queue, st.to_device, st.grid, None))

    def to_dense(self, queue, t: int, record: list[DeviceCommand] | None = None) -> None:
        """Tensor t's slice layout to its dense buffer, where a conversion kernel does that (none where the plan's
        kernel writes the dense buffer itself)."""
        st = self.staging[t]
        if st.from_device is not None:
            _recorded(record, "convert", f"tensor {t} to dense NHWC",
                      self.cl.enqueue_nd_range_kernel(queue, st.from_device, st.grid, None))

    def fetch_outputs(self, queue, ts: list[int], record: list[DeviceCommand] | None = None,
                      ) -> dict[int, Callable[[], np.ndarray]]:
        """``fetch`` for several tensors, those on the output arena's host arrays read with one map of the arena (or
        none, where the device shares the host's memory): each returned function gives its value once the queue is
        finished."""
        mapped = [t for t in ts if self.staging[t].host is not None]
        if len(mapped) < 2 or self.shared_memory:  # (shared: ``fetch`` maps nothing)
            return {t: self.fetch(queue, t, record) for t in ts}
        getters = {t: self.fetch(queue, t, record) for t in ts if t not in mapped}
        for t in mapped:
            self.to_dense(queue, t, record)
        arena = self.host.buffers["output"]
        view, ev = self.cl.enqueue_map_buffer(queue, arena, self.cl.map_flags.READ, 0, (arena.size // 4,),
                                              np.float32, is_blocking=False)
        _recorded(record, "map", f"{len(mapped)} outputs' host arena", ev)
        held = [view]

        def value(t: int) -> np.ndarray:
            if held:  # (the first read after the wait unmaps: the host arrays hold every output by then)
                held.pop().base.release(queue)
            return _as_type(self.staging[t].host, self.sg.tensors[t].dtype)

        getters.update({t: (lambda t=t: value(t)) for t in mapped})
        return getters

    def fetch(self, queue, t: int, record: list[DeviceCommand] | None = None) -> Callable[[], np.ndarray]:
        """Enqueue reading tensor t to the host, without waiting: the returned function gives its value once the
        queue is finished (an invoke's outputs and state are read with one wait, not one each). ``record``: a
        profiled run's list of its commands."""
        st = self.staging[t]
        self.to_dense(queue, t, record)
        tensor = self.sg.tensors[t]
        label = f"tensor {t}"
        if st.pinned is not None:
            _recorded(record, "copy out", label, self.cl.enqueue_copy(queue, st.pinned, st.dense, is_blocking=False))
            return lambda: _as_type(st.pinned, tensor.dtype)
        if st.host is not None and self.shared_memory:  # (the finished kernels' values are in its host array)
            return lambda: _as_type(st.host, tensor.dtype)
        if st.host is not None:  # (the buffer's own memory: mapped for the kernels' values to be there, unmapped)
            mapped, ev = self.cl.enqueue_map_buffer(queue, st.dense, self.cl.map_flags.READ, 0, st.host.shape,
                                                    np.float32, is_blocking=False)
            _recorded(record, "map", label, ev)

            def mapped_value() -> np.ndarray:
                mapped.base.release(queue)
                return _as_type(st.host, tensor.dtype)

            return mapped_value
        host = np.empty(tensor.shape, np.float32)
        _recorded(record, "copy out", label, self.cl.enqueue_copy(queue, host, st.dense, is_blocking=False))
        return lambda: _as_type(host, tensor.dtype)

    def download(self, queue, t: int, record: list[DeviceCommand] | None = None) -> np.ndarray:
        """Tensor t's value on the host, now."""
        value = self.fetch(queue, t, record)
        queue.finish()
        return value()
