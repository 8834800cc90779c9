"""msgpack-numpy: openpi's wire format, round trips, and refusal of unsafe or malformed payloads."""

import msgpack
import numpy as np
import pytest

from embodrl.deploy.protocol import ProtocolError, packb, unpackb

ROUND_TRIP = [
    1,
    1.0,
    "hello",
    np.bool_(True),
    np.array([1, 2, 3])[0],
    np.float32(2.5),
    [1, 2, 3],
    {"key": [1, 2, 3]},
    np.array(1.0),
    np.array([1, 2, 3], dtype=np.int32),
    np.array(["asdf", "qwer"]),
    np.array([True, False]),
    np.zeros((0, 3), dtype=np.float32),
    np.array([[[1, 2], [3, 4]]], dtype=np.int16),
    np.array([np.nan, np.inf, -np.inf]),
    {"arr": np.arange(6, dtype=np.uint8).reshape(2, 3), "nested": {"arr": np.array([4.0, 5.0])}},
]


def _same(expected, actual) -> None:
    if isinstance(expected, np.ndarray | np.generic):
        assert type(actual) is type(expected)
        assert np.asarray(actual).dtype == np.asarray(expected).dtype
        np.testing.assert_array_equal(actual, expected)
    elif isinstance(expected, dict):
        assert expected.keys() == actual.keys()
        for key in expected:
            _same(expected[key], actual[key])
    else:
        assert expected == actual


@pytest.mark.parametrize("value", ROUND_TRIP)
def test_round_trip(value):
    _same(value, unpackb(packb(value)))


def test_wire_format_is_openpis():
    """Byte-string keys, dtype.str and the shape as a list: what openpi_client.msgpack_numpy writes."""
    raw = msgpack.unpackb(packb({"a": np.arange(3, dtype=np.float32)}), raw=False, strict_map_key=False)
    payload = raw["a"]
    assert payload[b"__ndarray__"] is True
    assert payload[b"dtype"] == "<f4" and payload[b"shape"] == [3]
    assert payload[b"data"] == np.arange(3, dtype=np.float32).tobytes()
    scalar = msgpack.unpackb(packb(np.int64(7)), raw=False, strict_map_key=False)
    assert scalar == {b"__npgeneric__": True, b"data": 7, b"dtype": "<i8"}


def test_decodes_str_key_variant():
    message = msgpack.packb({"__ndarray__": True, "data": b"\x01\x02", "dtype": "|u1", "shape": [2]})
    np.testing.assert_array_equal(unpackb(message), np.array([1, 2], dtype=np.uint8))


@pytest.mark.parametrize(
    "value", [np.zeros(2, complex), np.array([object()]), np.zeros(2, "V4"), np.complex64(1)]
)
def test_refuses_to_encode_unsafe_dtypes(value):
    with pytest.raises(ProtocolError, match="unsupported dtype"):
        packb(value)


def _array_message(dtype: str, data: bytes, shape) -> bytes:
    return msgpack.packb(
        {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}, use_bin_type=True
    )


@pytest.mark.parametrize(
    "message",
    [
        _array_message("|O", b"\x00" * 8, [1]),  # object: would need pickle
        _array_message("<c8", b"\x00" * 8, [1]),  # complex
        _array_message("|V4", b"\x00" * 4, [1]),  # void / structured
        _array_message("(2,)<i2", b"\x00" * 4, [1]),  # sub-array dtype
        _array_message("<f4", b"\x00" * 3, [1]),  # data shorter than the shape
        _array_message("<f4", b"\x00" * 4, [-1]),  # negative dimension
        _array_message("<f4", b"\x00" * 4, "1"),  # shape not a list
        _array_message("not-a-dtype", b"\x00", [1]),
        msgpack.packb({b"__ndarray__": True, b"dtype": "<f4", b"shape": [1]}),  # no data
        msgpack.packb({b"__npgeneric__": True, b"data": 300, b"dtype": "|i1"}),  # does not fit int8
        packb({"a": np.ones(4, np.float32)})[:-3],  # truncated
        b"\xc1",  # reserved byte
        b"",
    ],
)
def test_refuses_malformed_messages(message):
    with pytest.raises(ProtocolError):
        unpackb(message)
