"""Names and numbers of the TFLite schema, taken from the generated accessors."""

from __future__ import annotations

import importlib
import re
from functools import cache

import numpy as np
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions
from tflite.BuiltinOptions2 import BuiltinOptions2
from tflite.TensorType import TensorType

BUILTIN_NAMES: dict[int, str] = {
    v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_")
}
# Ops newer than the tflite package's schema (its 2.18, the newest, ends at STABLEHLO_CBRT, 208): their codes, and
# their BuiltinOptions2 tables by union code, as (table name, its int32-vector fields in slot order), read and written
# by hand (``newer_options``, ``model.builder``)
NEWER_BUILTINS: dict[int, str] = {209: "STABLEHLO_CASE"}
NEWER_OPTIONS2: dict[int, tuple[str, tuple[str, ...]]] = {23: ("StablehloCaseOptions", ("branch_subgraph_indices",))}
NEWER_OPTIONS2_FOR: dict[str, int] = {"STABLEHLO_CASE": 23}
BUILTIN_NAMES.update((code, name) for code, name in NEWER_BUILTINS.items() if code not in BUILTIN_NAMES)
BUILTIN_CODES: dict[str, int] = {v: k for k, v in BUILTIN_NAMES.items()}
# Codes below this are stored in the one-byte deprecated_builtin_code field.
PLACEHOLDER_FOR_GREATER_OP_CODES = 127

TENSOR_TYPE_NAMES: dict[int, str] = {
    v: k for k, v in vars(TensorType).items() if not k.startswith("_")
}
TENSOR_TYPE_CODES: dict[str, int] = {v: k for k, v in TENSOR_TYPE_NAMES.items()}

# numpy dtype per TFLite type; STRING/RESOURCE/VARIANT hold no plain numbers.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "FLOAT32": np.dtype(np.float32),
    "FLOAT16": np.dtype(np.float16),
    "FLOAT64": np.dtype(np.float64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "BOOL": np.dtype(np.bool_),
    "COMPLEX64": np.dtype(np.complex64),
    "COMPLEX128": np.dtype(np.complex128),
    "STRING": np.dtype(np.object_),
    "RESOURCE": np.dtype(np.int32),
    "VARIANT": np.dtype(np.int32),
    "INT4": np.dtype(np.int8),
}


_OPTION_TABLES: dict[int, str] = {
    v: k for k, v in vars(BuiltinOptions).items() if not k.startswith("_")
}
_OPTION2_TABLES: dict[int, str] = {
    v: k for k, v in vars(BuiltinOptions2).items() if not k.startswith("_")
}


def snake(name: str) -> str:
    """``FusedActivationFunction`` -> ``fused_activation_function``, ``DilationWFactor`` -> ``dilation_w_factor``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def newer_options(type_code: int, table) -> dict[str, tuple[int, ...]] | None:
    """The fields of a BuiltinOptions2 table the tflite package has no accessor for (``NEWER_OPTIONS2``), read from
    its flatbuffers ``table``; None for another union code."""
    import flatbuffers

    known = NEWER_OPTIONS2.get(type_code)
    if known is None or table is None:
        return None
    out = {}
    for slot, field in enumerate(known[1]):
        at = table.Offset(4 + 2 * slot)
        start = table.Vector(at) if at else 0
        out[field] = tuple(table.Get(flatbuffers.number_types.Int32Flags, start + 4 * i)
                           for i in range(table.VectorLen(at) if at else 0))
    return out


def options_class(type_code: int, second: bool = False):
    """The generated accessor class for a BuiltinOptions(2) union member, or None."""
    table = (_OPTION2_TABLES if second else _OPTION_TABLES).get(type_code)
    if not table or table == "NONE":
        return None
    module = importlib.import_module(f"tflite.{table}")
    return getattr(module, table)


@cache
def option_fields(cls) -> tuple[tuple[str, str, bool], ...]:
    """(snake name, accessor name, is_vector) for every field of an options table."""
    skip = {"Init", "GetRootAs"}
    names = [n for n in vars(cls) if not n.startswith("_") and n not in skip]
    fields = []
    for name in names:
        if name.startswith("GetRootAs") or name.endswith(("BufferHasIdentifier", "IsNone", "Length")):
            continue
        if name.endswith("AsNumpy"):
            continue
        is_vector = f"{name}AsNumpy" in names
        fields.append((snake(name), name, is_vector))
    return tuple(fields)
