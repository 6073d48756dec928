"""The values of an LMDB database, told apart and parsed without any library: Caffe ``Datum``
records (a small protobuf, read by hand), encoded images, and pickles (recognized, refused).
"""

import numpy as np

from tfgpu.convert.manifest import BadImage

_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"BM", b"GIF87a", b"GIF89a", b"II*\0")


def value_kind(value: bytes) -> str:
    """What a value looks like: pickle, image, datum-raw, datum-encoded or unknown."""
    if is_pickle(value):
        return "pickle"
    if value.startswith(_IMAGE_MAGIC) or value[:4] == b"RIFF" and value[8:12] == b"WEBP":
        return "image"
    try:
        datum = parse_datum(value)
    except ValueError:
        return "unknown"
    if datum["encoded"] and len(datum["data"]):
        return "datum-encoded"
    size = datum["channels"] * datum["height"] * datum["width"]
    return "datum-raw" if size and len(datum["data"]) in (0, size) else "unknown"


def parse_datum(value, header_only: bool = False) -> dict:
    """The fields of a serialized Caffe ``Datum`` (caffe.proto: channels 1, height 2, width 3,
    data 4, label 5, float_data 6, encoded 7), as ints, bools and ``data`` (a memoryview of
    ``value``). Raises ValueError for bytes that are not one. ``header_only`` stops after the
    label: writers put fields in number order, and unpacked float_data has a tag per float."""
    view = memoryview(value)
    datum = {"channels": 0, "height": 0, "width": 0, "data": view[:0], "label": 0}
    datum.update(float_data=False, encoded=0)
    names = {1: "channels", 2: "height", 3: "width", 5: "label", 7: "encoded"}
    pos, end = 0, len(view)
    while pos < end:
        tag, pos = _varint(view, pos)
        number, wire = tag >> 3, tag & 7
        if header_only and number > 5:
            break
        if number in names and wire == 0:
            datum[names[number]], pos = _varint(view, pos)
        elif number in (4, 6) and wire == 2:  # data, or packed float_data
            length, pos = _varint(view, pos)
            if pos + length > end:
                raise ValueError(f"field {number} runs {pos + length - end} bytes past the end")
            if number == 4:
                datum["data"] = view[pos : pos + length]
            datum["float_data"] |= number == 6 and length > 0
            pos += length
        elif number == 6 and wire == 5:  # one unpacked float
            pos += 4
            datum["float_data"] = True
        else:
            raise ValueError(f"field {number} (wire type {wire}) is not a Datum's")
    if pos > end:
        raise ValueError("truncated")
    datum["encoded"] = bool(datum["encoded"])
    if datum["label"] >= 1 << 63:  # a negative int32 is sent sign-extended to 64 bits
        datum["label"] -= 1 << 64
    return datum


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    """(value, position after it) of the base-128 varint at ``pos``."""
    value = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise ValueError("truncated" if pos >= len(view) else "varint too long")
        byte = view[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def datum_image(value, bgr: bool):
    """What the worker encodes for a Datum: its encoded bytes, or its raw CHW pixels as an
    HWC uint8 array (BGR turned to RGB when ``bgr``); raises BadImage with the reason."""
    try:
        datum = parse_datum(value)
    except ValueError as err:
        raise BadImage(f"corrupt value: not a Caffe Datum ({err})") from None
    data, shape = datum["data"], (datum["channels"], datum["height"], datum["width"])
    if len(data) and datum["encoded"]:
        return bytes(data)
    if not len(data):
        what = "float_data only (float pixels, not uint8)" if datum["float_data"] else "no pixels"
        raise BadImage(f"Caffe Datum with {what}")
    if shape[0] * shape[1] * shape[2] != len(data):  # Python ints: varints reach 2**64
        raise BadImage(
            f"corrupt value: Datum data holds {len(data)} bytes, not channels x height x width "
            f"= {shape[0]}x{shape[1]}x{shape[2]}"
        )
    array = np.frombuffer(data, np.uint8).reshape(shape).transpose(1, 2, 0)
    if bgr and shape[0] in (3, 4):
        array = array[..., [2, 1, 0, 3][: shape[0]]]  # Caffe's tools write OpenCV's BGR
    return np.ascontiguousarray(array)


def is_pickle(value) -> bool:
    """True for what pickle.dumps writes with protocol 2..5 (the PROTO opcode, then the
    protocol): every pickle Python 3 writes by default. A Datum or an image never starts so."""
    return len(value) > 1 and value[0] == 0x80 and 2 <= value[1] <= 5


def datum_label(value) -> tuple:
    """(label, None), or (None, why it has none)."""
    if not len(value):
        return None, "empty value"
    if is_pickle(value):
        return None, "pickled value (Python pickle): never unpickled"
    try:
        label = parse_datum(value, header_only=True)["label"]
    except ValueError as err:
        return None, f"corrupt value: not a Caffe Datum ({err})"
    return (label, None) if label >= 0 else (None, f"negative label {label}")
