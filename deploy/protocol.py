"""openpi's msgpack-numpy wire format: numpy arrays and scalars inside msgpack maps, never pickle.

Arrays travel as `{b"__ndarray__": True, b"data": bytes, b"dtype": dtype.str, b"shape": [...]}` and
numpy scalars as `{b"__npgeneric__": True, b"data": item, b"dtype": dtype.str}`, byte-string keys
exactly as openpi_client.msgpack_numpy writes them, so openpi clients and servers interoperate.
Decoding also accepts str keys (some ports write them). Only numpy, msgpack and the standard library
are imported here: the robot-side client depends on this module.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

# bool, signed/unsigned int, float, bytes, unicode: object ("O"), void ("V", structured) and
# complex ("c") are refused, as in openpi; datetimes are refused too (no use on the wire).
ALLOWED_DTYPE_KINDS = "biufSU"


class ProtocolError(ValueError):
    """A message that is not valid msgpack-numpy (the peer sent something malformed)."""


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.kind not in ALLOWED_DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError(f"unsupported dtype {dtype.str!r}; use bool, int, uint, float or string arrays")


def _encode(obj: Any) -> Any:
    """msgpack `default` hook: numpy arrays and scalars to openpi's maps."""
    if isinstance(obj, np.ndarray):
        _check_dtype(obj.dtype)
        array = np.ascontiguousarray(obj)
        return {
            b"__ndarray__": True,
            b"data": array.tobytes(),
            b"dtype": array.dtype.str,
            b"shape": array.shape,
        }
    if isinstance(obj, np.generic):
        _check_dtype(obj.dtype)
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode {type(obj).__name__} as msgpack-numpy")


def _field(obj: dict, name: str) -> Any:
    if name.encode() in obj:
        return obj[name.encode()]
    if name in obj:
        return obj[name]
    raise ProtocolError(f"numpy payload lacks its {name!r} field")


def _parse_dtype(value: Any) -> np.dtype:
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    if not isinstance(value, str) or len(value) > 16:
        raise ProtocolError(f"invalid dtype field {value!r}")
    try:
        dtype = np.dtype(value)
    except TypeError as error:
        raise ProtocolError(f"invalid dtype field {value!r}") from error
    _check_dtype(dtype)
    return dtype


def _decode_array(obj: dict) -> np.ndarray:
    dtype = _parse_dtype(_field(obj, "dtype"))
    shape = _field(obj, "shape")
    data = _field(obj, "data")
    if not isinstance(shape, list | tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError(f"invalid array shape {shape!r}: expected a list of non-negative ints")
    if not isinstance(data, bytes):
        raise ProtocolError("array data must be msgpack bin bytes")
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise ProtocolError(
            f"array data holds {len(data)} bytes but shape {list(shape)} of {dtype.str} needs "
            f"{math.prod(shape) * dtype.itemsize}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)  # read-only view of the message


def _decode_scalar(obj: dict) -> np.generic:
    dtype = _parse_dtype(_field(obj, "dtype"))
    data = _field(obj, "data")
    if not isinstance(data, bool | int | float | str | bytes):
        raise ProtocolError(f"invalid numpy scalar payload {data!r}")
    try:
        return dtype.type(data)
    except (TypeError, ValueError, OverflowError) as error:
        raise ProtocolError(f"numpy scalar {data!r} does not fit {dtype.str}") from error


def _decode(obj: dict) -> Any:
    """msgpack `object_hook`: openpi's numpy maps back to arrays/scalars, other maps unchanged."""
    if obj.get(b"__ndarray__", obj.get("__ndarray__")) is True:
        return _decode_array(obj)
    if obj.get(b"__npgeneric__", obj.get("__npgeneric__")) is True:
        return _decode_scalar(obj)
    return obj


def packb(obj: Any) -> bytes:
    """Encode maps/lists/strings/numbers and numpy arrays/scalars as msgpack-numpy bytes."""
    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def unpackb(data: bytes) -> Any:
    """Decode msgpack-numpy bytes; anything malformed raises ProtocolError, never executes code."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"expected a binary msgpack message, got {type(data).__name__}")
    try:
        # strict_map_key=False: openpi's numpy maps use bytes keys. No ext types are registered,
        # so an ext payload stays an opaque msgpack.ExtType (rejected by the server's validation).
        return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=False)
    except ProtocolError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as error:
        raise ProtocolError(f"not a valid msgpack message: {error}") from error
