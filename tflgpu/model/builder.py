"""Write .tflite models: single-op and few-op graphs for tests, and the bundled default model.

    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 3))
    w = b.const("w", np.ones((4, 3, 3, 3), np.float32))
    y = b.tensor("y", (1, 8, 8, 4))
    b.op("CONV_2D", [x, w, -1], [y], padding="SAME", fused_activation_function="RELU")
    b.output(y)
    model_bytes = b.build()

Options are given by their schema field names in snake case (as the reader
reports them); ``padding`` and ``fused_activation_function`` also take names.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np
from tflite.ActivationFunctionType import ActivationFunctionType
from tflite.BuiltinOptions import BuiltinOptions
from tflite.BuiltinOptions2 import BuiltinOptions2

from . import schema
from .strings import encode_strings

_OPTION_TABLES = {k.lower(): (k, v) for k, v in vars(BuiltinOptions).items() if not k.startswith("_")}
_OPTION2_TABLES = {k.lower(): (k, v) for k, v in vars(BuiltinOptions2).items() if not k.startswith("_")}
_OPTIONS_FOR = {
    "MAX_POOL_2D": "Pool2DOptions", "AVERAGE_POOL_2D": "Pool2DOptions", "L2_POOL_2D": "Pool2DOptions",
    "MAXIMUM": "MaximumMinimumOptions", "MINIMUM": "MaximumMinimumOptions", "L2_NORMALIZATION": "L2NormOptions",
    "CONV_3D_TRANSPOSE": "Conv3DOptions", "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
    **{n: "RandomOptions" for n in ("RANDOM_UNIFORM", "RANDOM_STANDARD_NORMAL", "MULTINOMIAL")},
    **{n: "ReducerOptions" for n in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY",
                                     "REDUCE_ALL")},
}
_DTYPE_TO_TYPE = {
    np.dtype(np.float32): "FLOAT32", np.dtype(np.float16): "FLOAT16", np.dtype(np.float64): "FLOAT64",
    np.dtype(np.int8): "INT8", np.dtype(np.int16): "INT16", np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64", np.dtype(np.uint8): "UINT8", np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint16): "UINT16", np.dtype(np.uint32): "UINT32", np.dtype(np.uint64): "UINT64",
    np.dtype(np.complex64): "COMPLEX64",
}


def _options_table(op_name: str) -> tuple[str, int, bool] | None:
    """(table name, union type code, is BuiltinOptions2) for an op, or None if it has none."""
    name = _OPTIONS_FOR.get(op_name, op_name.replace("_", "") + "Options")
    key = name.lower()
    if key in _OPTION_TABLES:
        t, code = _OPTION_TABLES[key]
        return t, code, False
    if key in _OPTION2_TABLES:
        t, code = _OPTION2_TABLES[key]
        return t, code, True
    return None


def _enum_value(key: str, value: Any) -> Any:
    if isinstance(value, str):
        if key == "padding":
            return {"SAME": 0, "VALID": 1}[value]
        if key in ("fused_activation_function", "activation"):
            return getattr(ActivationFunctionType, value)
    return value


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    type_name: str
    buffer: int = 0
    quant: dict[str, Any] | None = None
    is_variable: bool = False
    shape_signature: tuple[int, ...] | None = None
    sparsity: dict[str, Any] | None = None


@dataclass
class _Op:
    name: str
    inputs: list[int]
    outputs: list[int]
    options: dict[str, Any]
    custom_options: bytes | None
    version: int
    intermediates: list[int] = field(default_factory=list)


@dataclass
class SubgraphBuilder:
    model: ModelBuilder
    name: str = ""
    tensors: list[_Tensor] = field(default_factory=list)
    ops: list[_Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def tensor(self, name: str, shape: Sequence[int], dtype: Any = np.float32, *, quant: dict | None = None,
               is_variable: bool = False, shape_signature: Sequence[int] | None = None,
               type_name: str | None = None) -> int:
        """Add a non-constant tensor; returns its index."""
        tn = type_name or _DTYPE_TO_TYPE[np.dtype(dtype)]
        sig = tuple(shape_signature) if shape_signature is not None else None
        self.tensors.append(_Tensor(name, tuple(int(d) for d in shape), tn, 0, quant, is_variable, sig))
        return len(self.tensors) - 1

    def input(self, name: str, shape: Sequence[int], dtype: Any = np.float32, **kw: Any) -> int:
        idx = self.tensor(name, shape, dtype, **kw)
        self.inputs.append(idx)
        return idx

    def const(self, name: str, value: Any, dtype: Any = None, *, quant: dict | None = None,
              sparsity: dict | None = None, shape: Sequence[int] | None = None) -> int:
        """Add a constant tensor holding ``value`` (for sparse tensors: the values, with ``shape``)."""
        if isinstance(value, list) and value and isinstance(value[0], bytes):
            buf = self.model.add_buffer(encode_strings(value))
            self.tensors.append(_Tensor(name, (len(value),), "STRING", buf))
            return len(self.tensors) - 1
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        if arr.dtype == np.int64 and dtype is None:
            arr = arr.astype(np.int32)
        buf = self.model.add_buffer(np.ascontiguousarray(arr).tobytes())
        shp = tuple(shape) if shape is not None else arr.shape
        self.tensors.append(_Tensor(name, shp, _DTYPE_TO_TYPE[arr.dtype], buf, quant, False, None, sparsity))
        return len(self.tensors) - 1

    def output(self, *idx: int) -> None:
        self.outputs.extend(idx)

    def op(self, name: str, inputs: Sequence[int], outputs: Sequence[int], *, version: int = 1,
           custom_options: bytes | None = None, intermediates: Sequence[int] = (), option_fields: dict | None = None,
           **options: Any) -> None:
        """Add an op; ``name`` is a builtin name or, for a custom op, its custom code; ``intermediates``: tensors
        whose quantization describes values inside the op (an integer LSTM's gates); ``option_fields``: options
        whose names are this method's own (a composite's ``name`` and ``version``)."""
        options = options | (option_fields or {})
        self.ops.append(_Op(name, list(inputs), list(outputs), options, custom_options, version, list(intermediates)))


class ModelBuilder:
    """Builds a TFLite flatbuffer; subgraph 0 is the main graph (its methods are forwarded)."""

    def __init__(self, description: str = "tflgpu test model"):
        self.description = description
        self.buffers: list[bytes] = [b""]  # buffer 0 is the empty sentinel
        self.subgraphs: list[SubgraphBuilder] = [SubgraphBuilder(self, "main")]
        self.signatures: list[tuple[str, int, dict[str, int], dict[str, int]]] = []
        self.metadata: dict[str, int] = {}  # name -> buffer index

    @property
    def main(self) -> SubgraphBuilder:
        return self.subgraphs[0]

    def __getattr__(self, item: str):  # tensor/input/const/op/output go to the main subgraph
        if item in ("tensor", "input", "const", "op", "output"):
            return getattr(self.main, item)
        raise AttributeError(item)

    def subgraph(self, name: str = "") -> tuple[int, SubgraphBuilder]:
        sg = SubgraphBuilder(self, name)
        self.subgraphs.append(sg)
        return len(self.subgraphs) - 1, sg

    def add_buffer(self, data: bytes) -> int:
        self.buffers.append(data)
        return len(self.buffers) - 1

    def add_metadata(self, name: str, data: bytes) -> None:
        self.metadata[name] = self.add_buffer(data)

    def signature(self, key: str, inputs: dict[str, int], outputs: dict[str, int], subgraph: int = 0) -> None:
        self.signatures.append((key, subgraph, inputs, outputs))

    # -- serialization --------------------------------------------------------

    def build(self, external_buffers: bool = False) -> bytes:
        """The model bytes. ``external_buffers`` stores weights after the flatbuffer (offset/size)."""
        if not external_buffers:
            return self._build(None)
        placeholder = self._build([1] * len(self.buffers))
        base = (len(placeholder) + 15) // 16 * 16
        offsets, pos = [], base
        for data in self.buffers:
            offsets.append(pos if data else 0)
            pos = (pos + len(data) + 15) // 16 * 16
        head = self._build(offsets)
        assert len(head) == len(placeholder), "buffer offsets changed the flatbuffer's size"
        out = bytearray(head) + bytearray(base - len(head))
        for data in self.buffers:
            if data:
                out += data + bytes((-len(data)) % 16)
        return bytes(out)

    def _build(self, offsets: list[int] | None) -> bytes:
        fb = flatbuffers.Builder(1024)
        if offsets is not None:
            fb.ForceDefaults(True)
        m = importlib.import_module
        T = {n: m(f"tflite.{n}") for n in ("Model", "SubGraph", "Tensor", "Operator", "OperatorCode", "Buffer",
                                           "QuantizationParameters", "SignatureDef", "TensorMap", "Metadata",
                                           "SparsityParameters", "DimensionMetadata", "Int32Vector")}
        codes: dict[tuple[str, int], int] = {}
        for sg in self.subgraphs:
            for op in sg.ops:
                codes.setdefault((op.name, op.version), len(codes))

        # buffers
        buf_offs = []
        for i, data in enumerate(self.buffers):
            vec = None
            if data and offsets is None:
                fb.StartVector(1, len(data), 16)
                fb.head = fb.head - len(data)
                fb.Bytes[fb.head : fb.head + len(data)] = data
                vec = fb.EndVector()
            T["Buffer"].Start(fb)
            if vec is not None:
                T["Buffer"].AddData(fb, vec)
            if offsets is not None and data:
                T["Buffer"].AddOffset(fb, offsets[i])
                T["Buffer"].AddSize(fb, len(data))
            buf_offs.append(T["Buffer"].End(fb))

        # operator codes
        oc_offs = []
        for (name, version), _ in sorted(codes.items(), key=lambda kv: kv[1]):
            code = schema.BUILTIN_CODES.get(name)
            custom = None
            if code is None:
                custom = fb.CreateString(name)
                code = schema.BUILTIN_CODES["CUSTOM"]
            T["OperatorCode"].Start(fb)
            T["OperatorCode"].AddDeprecatedBuiltinCode(fb, min(code, schema.PLACEHOLDER_FOR_GREATER_OP_CODES))
            T["OperatorCode"].AddBuiltinCode(fb, code)
            T["OperatorCode"].AddVersion(fb, version)
            if custom is not None:
                T["OperatorCode"].AddCustomCode(fb, custom)
            oc_offs.append(T["OperatorCode"].End(fb))

        sg_offs = [self._subgraph(fb, sg, codes, T) for sg in self.subgraphs]

        sig_offs = []
        for key, sgi, ins, outs in self.signatures:
            def tmaps(d):
                offs = []
                for n, idx in d.items():
                    s = fb.CreateString(n)
                    T["TensorMap"].Start(fb)
                    T["TensorMap"].AddName(fb, s)
                    T["TensorMap"].AddTensorIndex(fb, idx)
                    offs.append(T["TensorMap"].End(fb))
                return self._vector(fb, offs)

            iv, ov, k = tmaps(ins), tmaps(outs), fb.CreateString(key)
            T["SignatureDef"].Start(fb)
            T["SignatureDef"].AddInputs(fb, iv)
            T["SignatureDef"].AddOutputs(fb, ov)
            T["SignatureDef"].AddSignatureKey(fb, k)
            T["SignatureDef"].AddSubgraphIndex(fb, sgi)
            sig_offs.append(T["SignatureDef"].End(fb))

        md_offs = []
        for name, bidx in self.metadata.items():
            s = fb.CreateString(name)
            T["Metadata"].Start(fb)
            T["Metadata"].AddName(fb, s)
            T["Metadata"].AddBuffer(fb, bidx)
            md_offs.append(T["Metadata"].End(fb))
        md_vec = self._vector(fb, md_offs)
        desc = fb.CreateString(self.description)
        oc_vec, sg_vec = self._vector(fb, oc_offs), self._vector(fb, sg_offs)
        buf_vec, sig_vec = self._vector(fb, buf_offs), self._vector(fb, sig_offs)
        T["Model"].Start(fb)
        T["Model"].AddVersion(fb, 3)
        T["Model"].AddOperatorCodes(fb, oc_vec)
        T["Model"].AddSubgraphs(fb, sg_vec)
        T["Model"].AddDescription(fb, desc)
        T["Model"].AddBuffers(fb, buf_vec)
        if sig_offs:
            T["Model"].AddSignatureDefs(fb, sig_vec)
        if md_offs:
            T["Model"].AddMetadata(fb, md_vec)
        root = T["Model"].End(fb)
        fb.Finish(root, file_identifier=b"TFL3")
        return bytes(fb.Output())

    @staticmethod
    def _vector(fb, offs: list[int]) -> int:
        fb.StartVector(4, len(offs), 4)
        for o in reversed(offs):
            fb.PrependUOffsetTRelative(o)
        return fb.EndVector()

    def _subgraph(self, fb, sg: SubgraphBuilder, codes, T) -> int:
        t_offs = []
        for t in sg.tensors:
            name = fb.CreateString(t.name)
            shape = fb.CreateNumpyVector(np.array(t.shape, np.int32))
            sig = fb.CreateNumpyVector(np.array(t.shape_signature, np.int32)) if t.shape_signature else None
            q = self._quant(fb, t.quant, T) if t.quant else None
            sp = self._sparsity(fb, t.sparsity, T) if t.sparsity else None
            T["Tensor"].Start(fb)
            T["Tensor"].AddShape(fb, shape)
            T["Tensor"].AddType(fb, schema.TENSOR_TYPE_CODES[t.type_name])
            T["Tensor"].AddBuffer(fb, t.buffer)
            T["Tensor"].AddName(fb, name)
            if q is not None:
                T["Tensor"].AddQuantization(fb, q)
            if sp is not None:
                T["Tensor"].AddSparsity(fb, sp)
            if t.is_variable:
                T["Tensor"].AddIsVariable(fb, True)
            if sig is not None:
                T["Tensor"].AddShapeSignature(fb, sig)
            t_offs.append(T["Tensor"].End(fb))
        op_offs = []
        for op in sg.ops:
            ins = fb.CreateNumpyVector(np.array(op.inputs, np.int32))
            outs = fb.CreateNumpyVector(np.array(op.outputs, np.int32))
            mids = fb.CreateNumpyVector(np.array(op.intermediates, np.int32)) if op.intermediates else None
            opts = self._options(fb, op)
            custom = fb.CreateNumpyVector(np.frombuffer(op.custom_options, np.uint8)) if op.custom_options else None
            T["Operator"].Start(fb)
            T["Operator"].AddOpcodeIndex(fb, codes[(op.name, op.version)])
            T["Operator"].AddInputs(fb, ins)
            T["Operator"].AddOutputs(fb, outs)
            if mids is not None:
                T["Operator"].AddIntermediates(fb, mids)
            if opts is not None:
                code, off, second = opts
                if second:
                    T["Operator"].AddBuiltinOptions2Type(fb, code)
                    T["Operator"].AddBuiltinOptions2(fb, off)
                else:
                    T["Operator"].AddBuiltinOptionsType(fb, code)
                    T["Operator"].AddBuiltinOptions(fb, off)
            if custom is not None:
                T["Operator"].AddCustomOptions(fb, custom)
            op_offs.append(T["Operator"].End(fb))
        t_vec, op_vec = self._vector(fb, t_offs), self._vector(fb, op_offs)
        in_vec = fb.CreateNumpyVector(np.array(sg.inputs, np.int32))
        out_vec = fb.CreateNumpyVector(np.array(sg.outputs, np.int32))
        name = fb.CreateString(sg.name)
        T["SubGraph"].Start(fb)
        T["SubGraph"].AddTensors(fb, t_vec)
        T["SubGraph"].AddInputs(fb, in_vec)
        T["SubGraph"].AddOutputs(fb, out_vec)
        T["SubGraph"].AddOperators(fb, op_vec)
        T["SubGraph"].AddName(fb, name)
        return T["SubGraph"].End(fb)

    @staticmethod
    def _quant(fb, q: dict, T) -> int:
        scale = fb.CreateNumpyVector(np.atleast_1d(np.asarray(q["scale"], np.float32)))
        zp = fb.CreateNumpyVector(np.atleast_1d(np.asarray(q.get("zero_point", 0), np.int64)))
        Q = T["QuantizationParameters"]
        Q.Start(fb)
        Q.AddScale(fb, scale)
        Q.AddZeroPoint(fb, zp)
        Q.AddQuantizedDimension(fb, int(q.get("quantized_dimension", 0)))
        return Q.End(fb)

    @staticmethod
    def _sparsity(fb, sp: dict, T) -> int:
        dims = []
        for d in sp["dim_metadata"]:
            seg = idx = None
            if d["format"] == 1:
                vecs = []
                for key in ("array_segments", "array_indices"):
                    values = fb.CreateNumpyVector(np.asarray(d[key], np.int32))
                    T["Int32Vector"].Start(fb)
                    T["Int32Vector"].AddValues(fb, values)
                    vecs.append(T["Int32Vector"].End(fb))
                seg, idx = vecs
            D = T["DimensionMetadata"]
            D.Start(fb)
            D.AddFormat(fb, d["format"])
            if d["format"] == 0:
                D.AddDenseSize(fb, int(d["dense_size"]))
            else:
                D.AddArraySegmentsType(fb, 1)
                D.AddArraySegments(fb, seg)
                D.AddArrayIndicesType(fb, 1)
                D.AddArrayIndices(fb, idx)
            dims.append(D.End(fb))
        order = fb.CreateNumpyVector(np.asarray(sp["traversal_order"], np.int32))
        # (a block map only where the encoding names one, empty or not: a converter may leave the field out)
        bmap = fb.CreateNumpyVector(np.asarray(sp["block_map"], np.int32)) if "block_map" in sp else None
        dim_vec = ModelBuilder._vector(fb, dims)
        S = T["SparsityParameters"]
        S.Start(fb)
        S.AddTraversalOrder(fb, order)
        if bmap is not None:
            S.AddBlockMap(fb, bmap)
        S.AddDimMetadata(fb, dim_vec)
        return S.End(fb)

    @staticmethod
    def _options(fb, op: _Op) -> tuple[int, int, bool] | None:
        if not op.options:
            return None
        newer = schema.NEWER_OPTIONS2_FOR.get(op.name)
        if newer is not None:  # (a table the tflite package has no builder for: its int32 vectors by slot)
            fields = schema.NEWER_OPTIONS2[newer][1]
            unknown = sorted(set(op.options) - set(fields))
            if unknown:
                raise ValueError(f"{op.name}'s options have no field {unknown}; fields: {list(fields)}")
            vectors = {k: fb.CreateNumpyVector(np.asarray(op.options[k], np.int32)) for k in fields if k in op.options}
            fb.StartObject(len(fields))
            for slot, key in enumerate(fields):
                if key in vectors:
                    fb.PrependUOffsetTRelativeSlot(slot, vectors[key], 0)
            return newer, fb.EndObject(), True
        found = _options_table(op.name)
        if found is None:
            raise ValueError(f"op {op.name} takes no builtin options, got {sorted(op.options)}")
        table, code, second = found
        mod = importlib.import_module(f"tflite.{table}")
        fields = {snake: acc for snake, acc, _ in schema.option_fields(getattr(mod, table))}
        values = {}
        for key, value in op.options.items():
            if key not in fields:
                raise ValueError(f"{table} has no field {key!r}; fields: {sorted(fields)}")
            value = _enum_value(key, value)
            if isinstance(value, np.ndarray) and value.dtype == np.int64:  # (StableHLO's [long] vectors)
                value = fb.CreateNumpyVector(value)
            elif isinstance(value, (list, tuple, np.ndarray)):
                arr = np.asarray(value)  # (BUCKETIZE's boundaries are the one float vector)
                value = fb.CreateNumpyVector(arr.astype(np.float32 if arr.dtype.kind == "f" else np.int32))
            elif isinstance(value, str):
                value = fb.CreateString(value)
            elif isinstance(value, (bytes, bytearray)):  # (a composite's flexbuffer attributes)
                value = fb.CreateNumpyVector(np.frombuffer(value, np.uint8))
            values[fields[key]] = value
        mod.Start(fb)
        for acc, value in values.items():
            getattr(mod, f"Add{acc}")(fb, value)
        return code, mod.End(fb), second


def csr_encode(dense: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Encode an array as TFLite sparse the way converters write weights: every dimension dense but the
    last, which is CSR (per row of the leading dimensions, its nonzero columns). Returns (values, sparsity)."""
    rows = dense.reshape(-1, dense.shape[-1])
    segments, indices, values = [0], [], []
    for r in range(rows.shape[0]):
        nz = np.nonzero(rows[r])[0]
        indices.extend(int(c) for c in nz)
        values.extend(rows[r, nz])
        segments.append(len(indices))
    sparsity = {
        "traversal_order": list(range(dense.ndim)),
        "block_map": [],
        "dim_metadata": [{"format": 0, "dense_size": int(n)} for n in dense.shape[:-1]]
        + [{"format": 1, "array_segments": segments, "array_indices": indices}],
    }
    return np.array(values, dtype=dense.dtype), sparsity
