"""What crosses the data plane, with no UCXX in it: control messages (a length and
msgpack), the tags of a request's messages, and values as frames and back.

A request is one control message from the receiver, ``{"id", "keys"}``; the reply is one
control message from the sender (``status``, and per key its kind, head and frame count,
per frame whether it is on the device and its bytes), then each frame under its own tag.
A C-contiguous NumPy or CuPy array, the chunks of array workflows, is its own single frame
(no copy, no pickle); anything else is serialized as distributed serializes it between
workers (``cuda``, ``dask``, ``pickle``), frames and all, without the offload thread.
"""

from __future__ import annotations

import struct

import msgpack
import numpy as np

#: bytes of a control message buffer; a request naming more keys than fit falls back to
#: distributed's comm (the fetch says so by raising :class:`TooLarge`)
CONTROL_BYTES = 64 * 1024
#: frames one request may carry: tags are ``id * FRAMES_PER_ID + i``, so ids never collide
FRAMES_PER_ID = 1 << 20
_LENGTH = struct.Struct("<I")
_SERIALIZERS = ("cuda", "dask", "pickle", "error")


class TooLarge(ValueError):
    """A control message past :data:`CONTROL_BYTES`, or more frames than a request's tags."""


def tag(request_id: int, index: int) -> int:
    """Tag of message ``index`` of a request: 0 its reply, ``i + 1`` its frame ``i``.
    Integers only: ucxx combines a tag with the endpoint's own random tag (UCX matches tags
    per UCX worker, not per endpoint), and Python's hash of a string differs between
    processes."""
    if not 0 <= index < FRAMES_PER_ID:
        raise TooLarge(f"frame {index} of a request: at most {FRAMES_PER_ID - 1} frames")
    return request_id * FRAMES_PER_ID + index


def pack(message) -> np.ndarray:
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) + _LENGTH.size > CONTROL_BYTES:
        raise TooLarge(f"control message of {len(body)} bytes, more than {CONTROL_BYTES - _LENGTH.size}")
    buffer = np.empty(len(body) + _LENGTH.size, dtype=np.uint8)
    buffer[: _LENGTH.size] = np.frombuffer(_LENGTH.pack(len(body)), dtype=np.uint8)
    buffer[_LENGTH.size:] = np.frombuffer(body, dtype=np.uint8)
    return buffer


def unpack(buffer: np.ndarray):
    (n,) = _LENGTH.unpack(buffer[: _LENGTH.size].tobytes())
    return msgpack.unpackb(buffer[_LENGTH.size: _LENGTH.size + n].tobytes(), raw=False, strict_map_key=False,
                           use_list=True)


def control_buffer() -> np.ndarray:
    return np.empty(CONTROL_BYTES, dtype=np.uint8)


def key_out(key):
    """A key as msgpack carries it (tuples become lists) ..."""
    return list(key) if isinstance(key, tuple) else key


def key_in(key):
    """... and back: dask's keys are strings, ints, floats or tuples of them."""
    return tuple(key_in(k) for k in key) if isinstance(key, list) else key


def on_device(frame) -> bool:
    return hasattr(frame, "__cuda_array_interface__")


def frame_bytes(frame) -> int:
    if on_device(frame):
        cai = frame.__cuda_array_interface__
        n = np.dtype(cai["typestr"]).itemsize
        for s in cai["shape"]:
            n *= int(s)
        return int(n)
    return memoryview(frame).nbytes


def to_frames(value) -> tuple[str, list | None, list]:
    """(kind, head, frames) of one value."""
    cls = type(value)
    module = cls.__module__.split(".", 1)[0]
    if cls.__name__ == "ndarray" and module in ("numpy", "cupy") and value.flags.c_contiguous:
        return "array", [module, value.dtype.str, list(value.shape)], [value]
    from distributed.protocol import dumps, to_serialize

    return "dumps", None, list(dumps({"v": to_serialize(value)}, serializers=_SERIALIZERS))


def from_frames(kind: str, head, frames: list):
    if kind == "array":
        module, dtype, shape = head
        if module == "cupy":
            import cupy

            return cupy.asarray(frames[0]).view(dtype).reshape(shape)
        return np.asarray(frames[0]).view(dtype).reshape(shape)
    from distributed.protocol import loads

    return loads(frames, deserializers=_SERIALIZERS)["v"]


def describe_reply(values: dict) -> tuple[dict, list]:
    """The reply's control message for ``values`` (key -> value) and its frames, in order."""
    keys, kinds, heads, counts, frames = [], [], [], [], []
    for key, value in values.items():
        kind, head, own = to_frames(value)
        keys.append(key_out(key))
        kinds.append(kind)
        heads.append(head)
        counts.append(len(own))
        frames.extend(own)
    if len(frames) >= FRAMES_PER_ID:
        raise TooLarge(f"{len(frames)} frames in one reply: at most {FRAMES_PER_ID - 1}")
    reply = {"status": "OK", "keys": keys, "kind": kinds, "head": heads, "count": counts,
             "frames": [[on_device(f), frame_bytes(f)] for f in frames]}
    return reply, frames


def values_of(reply: dict, frames: list) -> dict:
    """The values a reply describes, from its received frames."""
    data, at = {}, 0
    for key, kind, head, count in zip(reply["keys"], reply["kind"], reply["head"], reply["count"]):
        data[key_in(key)] = from_frames(kind, head, frames[at: at + count])
        at += count
    return data
