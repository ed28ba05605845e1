"""Read a .tflite flatbuffer into the graph IR, validating as we go.

Every malformed input ends in a ``ValueError`` that names what is wrong
(and the subgraph/op/tensor involved), never an IndexError or struct.error
from inside the flatbuffer accessors.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import time
import weakref
from dataclasses import replace
from typing import Any

import numpy as np
from tflite.Model import Model as FbModel

from . import schema
from .ir import Model, Operator, Quantization, SignatureDef, Subgraph, Tensor
from .sparse import read_sparsity

FILE_IDENTIFIER = b"TFL3"
# A single tensor may not claim more than this many bytes (TFLGPU_MAX_TENSOR_BYTES
# overrides): a corrupt or hostile model must not make us allocate absurd amounts.
# 2 GiB is far above any real activation (a 4K RGB float image is 100 MB).
DEFAULT_MAX_TENSOR_BYTES = int(os.environ.get("TFLGPU_MAX_TENSOR_BYTES", str(1 << 31)))
# All non-constant tensors of a subgraph together may claim at most max(floor, factor x file size):
# a few-KB file asking for gigabytes of activations is hostile, a real model asks for a small
# multiple of its weights (MobileNetV2: 14 MB of weights, ~30 MB of activations).
ACTIVATION_FLOOR_BYTES = int(os.environ.get("TFLGPU_ACTIVATION_FLOOR_BYTES", str(1 << 30)))
ACTIVATION_PER_FILE_BYTE = int(os.environ.get("TFLGPU_ACTIVATION_PER_FILE_BYTE", "1000"))


def _file_kind(mode: int) -> str:
    """What a path that is no regular file or directory is, for an error message."""
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a file"


class ModelBytes:
    """The bytes of a model: an mmap of a file, or caller-given bytes."""

    CHECK_EVERY_S = 0.05  # (how often ``changed_on_disk`` looks at the file: an fstat costs ~1.5 us)

    def __init__(self, data: bytes | bytearray | memoryview | mmap.mmap, path: str | None = None):
        self.data = data
        self.path = path
        self._file: int | None = None  # the mapped file's own descriptor (a path may come to name another file)
        self._stamp: tuple[int, int] = (0, 0)  # its size and modification time when mapped
        self._checked = 0.0
        self._changed = False  # a change was seen: every later call looks again (no CHECK_EVERY_S wait)

    @classmethod
    def from_path(cls, path: str | os.PathLike) -> ModelBytes:
        path = os.fspath(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a named pipe's blocking open waits for a writer)
        except OSError as e:
            raise ValueError(f"Could not open '{path}': {e.strerror or e}") from e
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise ValueError(f"Could not open '{path}': Is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"Could not read model '{path}': it is {_file_kind(st.st_mode)}, not a regular file")
            if st.st_size == 0:
                raise ValueError(f"Could not read model '{path}': the file is empty")
            data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except OSError as e:
            os.close(fd)
            raise ValueError(f"Could not open '{path}': {e.strerror or e}") from e
        except BaseException:
            os.close(fd)
            raise
        out = cls(data, path)
        out._file, out._stamp = fd, (st.st_size, st.st_mtime_ns)
        weakref.finalize(out, os.close, fd)
        return out

    def changed_on_disk(self, now: bool = False) -> str | None:
        """What happened to the mapped file since it was mapped (truncated, rewritten), or None. Its weights are
        read from the map, so a truncated file ends the process (SIGBUS) on the next read, and one rewritten in
        place changes them under the kernels. Looks at most every CHECK_EVERY_S seconds, unless ``now`` or a
        change was seen before."""
        if self._file is None:
            return None
        t = time.monotonic()
        if not (now or self._changed) and t - self._checked < self.CHECK_EVERY_S:
            return None
        self._checked = t
        try:
            st = os.fstat(self._file)
        except OSError as e:
            verdict = f"it cannot be read ({e.strerror or e})"
        else:
            verdict = (f"it was truncated to {st.st_size} bytes" if st.st_size < self._stamp[0] else
                       "it was rewritten" if (st.st_size, st.st_mtime_ns) != self._stamp else None)
        self._changed = self._changed or verdict is not None
        return verdict

    @classmethod
    def from_content(cls, content: Any) -> ModelBytes:
        if isinstance(content, memoryview):
            content = content.cast("B") if content.format != "B" else content
            return cls(bytes(content) if not content.readonly else content)
        if isinstance(content, (bytes, bytearray)):
            return cls(bytes(content))
        raise TypeError(f"model content must be bytes, bytearray or memoryview, got {type(content).__name__}")

    def __len__(self) -> int:
        return len(self.data)

    def release_pages(self) -> None:
        """Drop the file's pages from this process's resident memory (an mmap only): after a device plan has
        uploaded its weights, the host reads few of them again, and those that a CPU kernel does read come back
        from the file (the page cache) on first touch. Caller-given bytes are left as they are."""
        if isinstance(self.data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            try:
                self.data.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # (a closed map, or a platform refusing the advice: only memory is at stake)
                pass


def read_model(
    source: ModelBytes | bytes | str | os.PathLike,
    max_tensor_bytes: int | None = None,
) -> Model:
    """Parse and validate a TFLite model. Raises ValueError on any malformed input."""
    if not isinstance(source, ModelBytes):
        if isinstance(source, (str, os.PathLike)):
            source = ModelBytes.from_path(source)
        else:
            source = ModelBytes.from_content(source)
    return _Reader(source, DEFAULT_MAX_TENSOR_BYTES if max_tensor_bytes is None else max_tensor_bytes).read()


class _Reader:
    def __init__(self, mb: ModelBytes, max_tensor_bytes: int):
        self.mb = mb
        self.buf = mb.data
        self.size = len(mb.data)
        self.max_tensor_bytes = max_tensor_bytes
        self.where = "model"

    def fail(self, msg: str) -> ValueError:
        return ValueError(f"Invalid TFLite model ({self.where}): {msg}")

    def read(self) -> Model:
        if self.size < 8:
            raise ValueError(
                f"The model is not a valid Flatbuffer buffer: only {self.size} bytes"
            )
        ident = bytes(self.buf[4:8])
        if ident != FILE_IDENTIFIER:
            raise ValueError(
                f"The model is not a valid Flatbuffer buffer: file identifier {ident!r}, "
                f"expected {FILE_IDENTIFIER!r} (is this a .tflite file?)"
            )
        root = struct.unpack_from("<I", self.buf, 0)[0]
        if root + 4 > self.size:
            raise ValueError("The model is not a valid Flatbuffer buffer: root offset past the end (truncated file?)")
        try:
            return self._read()
        except ValueError:
            raise
        except (IndexError, struct.error, TypeError, OverflowError, UnicodeDecodeError, AttributeError, MemoryError) as e:
            raise self.fail(f"corrupt or truncated flatbuffer ({type(e).__name__}: {e})") from e

    def _read(self) -> Model:
        fb = FbModel.GetRootAs(self.buf, 0)
        self.opcodes = [self._opcode(fb.OperatorCodes(i), i) for i in range(fb.OperatorCodesLength())]
        self.buffers = [fb.Buffers(i) for i in range(fb.BuffersLength())]
        metadata: dict[str, bytes] = {}
        for i in range(fb.MetadataLength()):
            md = fb.Metadata(i)
            name = (md.Name() or b"").decode("utf-8", "replace")
            bidx = md.Buffer()
            if 0 <= bidx < len(self.buffers):
                metadata[name] = bytes(self._buffer_bytes(bidx))
        subgraphs = [self._subgraph(fb.Subgraphs(i), i) for i in range(fb.SubgraphsLength())]
        if not subgraphs:
            raise self.fail("the model has no subgraphs")
        sigs = []
        for i in range(fb.SignatureDefsLength()):
            sigs.append(self._signature(fb.SignatureDefs(i), subgraphs))
        for sg in subgraphs:
            for op in sg.operators:
                for key in ("cond_subgraph_index", "body_subgraph_index", "then_subgraph_index",
                            "else_subgraph_index", "init_subgraph_index", "subgraph"):
                    v = op.options.get(key)
                    if v is not None and key != "subgraph" and not 0 <= v < len(subgraphs):
                        raise ValueError(
                            f"Invalid TFLite model (subgraph {sg.index}, op {op.index} {op.name}): "
                            f"{key} {v} out of range (model has {len(subgraphs)} subgraphs)"
                        )
        return Model(
            version=fb.Version(),
            description=(fb.Description() or b"").decode("utf-8", "replace"),
            subgraphs=subgraphs,
            signature_defs=sigs,
            metadata=metadata,
            size_bytes=self.size,
        )

    # -- pieces -------------------------------------------------------------

    def _opcode(self, oc, i: int) -> tuple[str, int, int]:
        deprecated = oc.DeprecatedBuiltinCode()
        code = max(int(oc.BuiltinCode()), int(deprecated))
        version = oc.Version()
        if code == schema.BUILTIN_CODES["CUSTOM"]:
            custom = oc.CustomCode()
            if not custom:
                raise ValueError(f"Invalid TFLite model (operator code {i}): custom op without a custom_code")
            return custom.decode("utf-8", "replace"), -1, version
        name = schema.BUILTIN_NAMES.get(code, f"UNKNOWN_OP_{code}")
        return name, code, version

    def _buffer_bytes(self, bidx: int) -> memoryview:
        b = self.buffers[bidx]
        off, size = b.Offset(), b.Size()
        if off > 1:  # large models keep data after the flatbuffer, at an absolute offset
            if off + size > self.size:
                raise self.fail(f"buffer {bidx} at offset {off} size {size} lies past the end of the file ({self.size} bytes)")
            return memoryview(self.buf)[off : off + size]
        o = b._tab.Offset(4)
        if o == 0:
            return memoryview(b"")
        start = b._tab.Vector(o)
        length = b._tab.VectorLen(o)
        if start + length > self.size:
            raise self.fail(f"buffer {bidx} ({length} bytes) runs past the end of the file (truncated?)")
        return memoryview(self.buf)[start : start + length]

    def _tensor(self, t, i: int) -> Tensor:
        self.where = f"subgraph {self.sg_index}, tensor {i}"
        name = (t.Name() or b"").decode("utf-8", "replace")
        self.where = f"subgraph {self.sg_index}, tensor {i} '{name}'"
        type_name = schema.TENSOR_TYPE_NAMES.get(t.Type())
        if type_name is None:
            raise self.fail(f"unknown tensor type {t.Type()}")
        dtype = schema.NUMPY_DTYPES.get(type_name)
        if dtype is None:
            raise self.fail(f"unsupported tensor type {type_name}")
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        sig = tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else shape
        if any(d < 0 for d in shape):
            raise self.fail(f"negative dimension in shape {list(shape)}")
        if len(shape) > 16:
            raise self.fail(f"rank {len(shape)} exceeds the supported maximum 16")
        nbytes = int(np.prod(shape, dtype=object)) * max(dtype.itemsize, 1)
        if nbytes > self.max_tensor_bytes:
            raise self.fail(f"shape {list(shape)} needs {nbytes} bytes, over the limit of {self.max_tensor_bytes}")
        quant = self._quantization(t.Quantization())
        if quant is not None:
            self._check_quantization(quant, shape)
        sparsity = read_sparsity(t.Sparsity()) if t.Sparsity() is not None else None
        bidx = t.Buffer()
        if not 0 <= bidx < max(len(self.buffers), 1):
            raise self.fail(f"buffer index {bidx} out of range (model has {len(self.buffers)} buffers)")
        data = None
        if bidx > 0 and bidx < len(self.buffers):
            raw = self._buffer_bytes(bidx)
            if len(raw):
                data = self._constant(raw, shape, dtype, type_name, sparsity)
        return Tensor(i, name, shape, sig, dtype, type_name, data, quant, sparsity, bool(t.IsVariable()),
                      bool(t.ShapeSignatureLength()))

    def _constant(self, raw: memoryview, shape, dtype, type_name, sparsity) -> np.ndarray:
        if type_name == "STRING":
            from .strings import decode_strings

            return np.array(decode_strings(bytes(raw)), dtype=object).reshape(shape)
        count = len(raw) // dtype.itemsize
        if sparsity is not None:  # values only; DENSIFY rebuilds the dense tensor
            return np.frombuffer(raw, dtype=dtype, count=count)
        if type_name == "INT4":
            need = (int(np.prod(shape)) + 1) // 2
            if len(raw) < need:
                raise self.fail(f"buffer holds {len(raw)} bytes, INT4 shape {list(shape)} needs {need}")
            packed = np.frombuffer(raw, np.uint8, count=need)
            lo = (packed.astype(np.int8) << 4) >> 4
            hi = packed.astype(np.int8) >> 4
            return np.stack([lo, hi], -1).reshape(-1)[: int(np.prod(shape))].reshape(shape)
        need = int(np.prod(shape)) * dtype.itemsize
        if len(raw) < need:
            raise self.fail(f"buffer holds {len(raw)} bytes but shape {list(shape)} of {type_name} needs {need}")
        return np.frombuffer(raw, dtype=dtype, count=need // dtype.itemsize).reshape(shape)

    def _quantization(self, q) -> Quantization | None:
        if q is None or q.ScaleLength() == 0:
            return None
        scales = q.ScaleAsNumpy().astype(np.float32)
        zps = q.ZeroPointAsNumpy().astype(np.int64) if q.ZeroPointLength() else np.zeros(len(scales), np.int64)
        mins = q.MinAsNumpy().astype(np.float32) if q.MinLength() else None
        maxs = q.MaxAsNumpy().astype(np.float32) if q.MaxLength() else None
        return Quantization(scales, zps, int(q.QuantizedDimension()), 0, mins, maxs)

    def _check_quantization(self, q: Quantization, shape: tuple[int, ...]) -> None:
        """As TFLite's InterpreterBuilder: one zero point per scale, and per-channel scales along a dimension
        of the tensor that has that many entries."""
        n = len(q.scales)
        if len(q.zero_points) != n:
            raise self.fail(f"quantization has {len(q.zero_points)} zero points and {n} scales; must have the same number")
        if n > 1 and not 0 <= q.quantized_dimension < len(shape):
            raise self.fail(f"per-channel quantization along dimension {q.quantized_dimension} of a rank-{len(shape)} tensor")
        if n > 1 and shape[q.quantized_dimension] != n:
            raise self.fail(f"quantization has {n} scales (only 1 or {shape[q.quantized_dimension]} are supported)")

    def _subgraph(self, sg, s: int) -> Subgraph:
        self.sg_index = s
        self.where = f"subgraph {s}"
        if sg is None:
            raise self.fail("missing subgraph table")
        tensors = [self._tensor(sg.Tensors(i), i) for i in range(sg.TensorsLength())]
        n = len(tensors)
        self.where = f"subgraph {s}"
        claimed = sum(int(np.prod(t.shape, dtype=object)) * max(t.dtype.itemsize, 1) for t in tensors if t.data is None)
        allowed = max(ACTIVATION_FLOOR_BYTES, ACTIVATION_PER_FILE_BYTE * self.size)
        if claimed > allowed:
            raise self.fail(f"its tensors claim {claimed} bytes, over the limit of {allowed} for a "
                            f"{self.size}-byte file (TFLGPU_ACTIVATION_FLOOR_BYTES / TFLGPU_ACTIVATION_PER_FILE_BYTE)")

        def indices(arr, what: str, allow_omitted: bool) -> tuple[int, ...]:
            out = tuple(int(v) for v in arr) if arr is not None and not isinstance(arr, int) else ()
            for v in out:
                if not (0 <= v < n or (allow_omitted and v == -1)):
                    raise self.fail(f"{what} refers to tensor {v}, out of range (subgraph has {n} tensors)")
            return out

        inputs = indices(sg.InputsAsNumpy(), "input list", False)
        outputs = indices(sg.OutputsAsNumpy(), "output list", False)
        ops = []
        for i in range(sg.OperatorsLength()):
            fop = sg.Operators(i)
            self.where = f"subgraph {s}, op {i}"
            idx = fop.OpcodeIndex()
            if not 0 <= idx < len(self.opcodes):
                raise self.fail(f"opcode index {idx} out of range (model has {len(self.opcodes)} operator codes)")
            name, code, version = self.opcodes[idx]
            self.where = f"subgraph {s}, op {i} {name}"
            op_in = indices(fop.InputsAsNumpy(), "input", True)
            op_out = indices(fop.OutputsAsNumpy(), "output", True)
            inter = indices(fop.IntermediatesAsNumpy(), "intermediate", True)
            options = self._options(fop)
            custom = b""
            if fop.CustomOptionsLength():
                custom = fop.CustomOptionsAsNumpy().tobytes()
            elif fop.LargeCustomOptionsSize():
                off, size = fop.LargeCustomOptionsOffset(), fop.LargeCustomOptionsSize()
                if off + size > self.size:
                    raise self.fail("large custom options lie past the end of the file")
                custom = bytes(self.buf[off : off + size])
            ops.append(Operator(i, name, code, version, op_in, op_out, inter, options, custom))
        tensors = _empty_constants(tensors, inputs, ops)
        self._check_dataflow(tensors, inputs, ops, s)
        name = (sg.Name() or b"").decode("utf-8", "replace")
        return Subgraph(s, name, tensors, ops, inputs, outputs)

    def _check_dataflow(self, tensors, inputs, ops, s: int) -> None:
        """Every op input must be a constant, a variable, a graph input, or produced earlier."""
        ready = set(inputs)
        ready.update(t.index for t in tensors if t.is_constant or t.is_variable)
        produced_by: dict[int, int] = {}
        for op in ops:
            for v in op.inputs:
                if v >= 0 and v not in ready:
                    raise ValueError(
                        f"Invalid TFLite model (subgraph {s}, op {op.index} {op.name}): input tensor {v} "
                        f"'{tensors[v].name}' is used before any op produces it (cycle or wrong op order)"
                    )
            for v in op.outputs:
                if v < 0:
                    continue
                if v in produced_by:
                    raise ValueError(
                        f"Invalid TFLite model (subgraph {s}, op {op.index} {op.name}): output tensor {v} "
                        f"'{tensors[v].name}' is already produced by op {produced_by[v]}"
                    )
                produced_by[v] = op.index
                ready.add(v)

    def _options(self, fop) -> dict[str, Any]:
        out: dict[str, Any] = dict(schema.newer_options(fop.BuiltinOptions2Type(), fop.BuiltinOptions2()) or {})
        for second in (False, True):
            type_code = fop.BuiltinOptions2Type() if second else fop.BuiltinOptionsType()
            cls = schema.options_class(type_code, second)
            if cls is None:
                continue
            table = fop.BuiltinOptions2() if second else fop.BuiltinOptions()
            if table is None:
                continue
            obj = cls()
            obj.Init(table.Bytes, table.Pos)
            for key, accessor, is_vector in schema.option_fields(cls):
                if is_vector:
                    arr = getattr(obj, accessor + "AsNumpy")()
                    kind = float if not isinstance(arr, int) and arr.dtype.kind == "f" else int  # (boundaries)
                    out[key] = tuple(kind(v) for v in arr) if not isinstance(arr, int) else ()
                else:
                    try:
                        val = getattr(obj, accessor)()
                    except TypeError:  # nested tables with arguments: not used by any kernel
                        continue
                    if isinstance(val, bytes):
                        val = val.decode("utf-8", "replace")
                    if isinstance(val, (int, float, bool, str)) or val is None:
                        out[key] = val
        return out

    def _signature(self, sd, subgraphs) -> SignatureDef:
        key = (sd.SignatureKey() or b"").decode("utf-8", "replace")
        s = sd.SubgraphIndex()
        self.where = f"signature '{key}'"
        if not 0 <= s < len(subgraphs):
            raise self.fail(f"subgraph index {s} out of range")
        n = len(subgraphs[s].tensors)

        def tmap(getter, count) -> dict[str, int]:
            m = {}
            for i in range(count):
                tm = getter(i)
                idx = tm.TensorIndex()
                if not 0 <= idx < n:
                    raise self.fail(f"tensor index {idx} out of range")
                m[(tm.Name() or b"").decode("utf-8", "replace")] = int(idx)
            return dict(sorted(m.items()))  # by name, as LiteRT keeps them (a std::map)

        return SignatureDef(key, s, tmap(sd.Inputs, sd.InputsLength()), tmap(sd.Outputs, sd.OutputsLength()))


def _empty_constants(tensors: list[Tensor], inputs, ops) -> list[Tensor]:
    """A tensor of no elements that no op makes and that is no input holds an empty array, as in TFLite (an arena
    tensor of zero bytes, never written): the converter writes a RESHAPE to a scalar's shape so, as a [0] tensor
    with an empty buffer (BirdNET 2.4's spectrogram framing)."""
    made = set(inputs) | {t for op in ops for t in op.outputs}
    return [replace(t, data=np.zeros(t.shape, t.dtype)) if t.data is None and not t.is_variable and t.index not in made
            and 0 in t.shape and t.type_name != "STRING" else t for t in tensors]
