"""What crosses the data plane, with no UCXX in it: control messages (a length and
msgpack), the tags of a request's messages, and values as frames and back.

A request is one control message from the receiver, ``{"id", "keys", "slots"}``; the reply
is one control message from the sender (``status``, and per key its kind, head and frame
count, per frame whether it is on the device and its bytes), then each frame under its own
tag. A *slot* is a receive the receiver posted before it asked, for a key whose size it
knows (distributed's ``nbytes``), so that a chunk's bytes start moving as soon as the
sender has it, not a round trip later: a value that is one frame of that size and memory
goes into its slot, any other slot gets a one-byte filler and the value's frames come
after the slots.
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


#: the field of a request and of its reply that carries the cluster's secret
SECRET_FIELD = "auth"


def signed(message: dict, secret: str) -> dict:
    """``message`` carrying the plane's per-cluster ``secret`` (:func:`authentic` checks it)."""
    return {**message, SECRET_FIELD: secret}


def authentic(message, secret: str) -> bool:
    """Whether a control message (msgpack, never pickle) carries the per-cluster ``secret``:
    checked before a request is served and before a reply's frames are unpickled, so a
    process that reaches a plane's UCX port without the secret reads no array and has
    nothing of its own unpickled. The secret reaches the workers with the plugin, over the
    cluster's own comms (TLS where the cluster has it)."""
    import hmac

    given = message.get(SECRET_FIELD) if isinstance(message, dict) else None
    return isinstance(given, str) and bool(secret) and hmac.compare_digest(given.encode(), secret.encode())


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


#: the filler a slot gets when its key's value does not fit it
FILLER = np.zeros(1, dtype=np.uint8)


def slot_tag(request_id: int, slot: int) -> int:
    return tag(request_id, 1 + slot)


def frame_tag(request_id: int, slots: int, index: int) -> int:
    """Tag of frame ``index`` of those sent after a request's ``slots`` slots."""
    return tag(request_id, 1 + slots + index)


def describe_reply(values: dict, slots: list | None = None, keys: list | None = None) -> tuple[dict, list, dict]:
    """The reply's control message for ``values`` (key -> value), the frames sent after
    the slots, in order, and the frames that go into slots (slot index -> frame).
    ``slots`` (per requested key in ``keys``: ``[on_device, nbytes]`` or None) are the
    receiver's posted receives."""
    by_key = {k: i for i, k in enumerate(keys or ())}
    names, kinds, heads, counts, slotted, frames, into = [], [], [], [], [], [], {}
    for key, value in values.items():
        kind, head, own = to_frames(value)
        i = by_key.get(key)
        slot = (slots or [None] * len(by_key))[i] if i is not None else None
        fits = (slot is not None and len(own) == 1 and on_device(own[0]) == bool(slot[0])
                and frame_bytes(own[0]) == int(slot[1]))
        names.append(key_out(key))
        kinds.append(kind)
        heads.append(head)
        counts.append(len(own))
        slotted.append(i if fits else -1)
        if fits:
            into[i] = own[0]
        else:
            frames.extend(own)
    if len(frames) + len(by_key) >= FRAMES_PER_ID:
        raise TooLarge(f"{len(frames)} frames in one reply: at most {FRAMES_PER_ID - 1 - len(by_key)}")
    reply = {"status": "OK", "keys": names, "kind": kinds, "head": heads, "count": counts, "slot": slotted,
             "frames": [[on_device(f), frame_bytes(f)] for f in frames]}
    return reply, frames, into


def values_of(reply: dict, frames: list, slotted: list | None = None) -> dict:
    """The values a reply describes, from its received frames and the slots it filled."""
    data, at = {}, 0
    for key, kind, head, count, slot in zip(reply["keys"], reply["kind"], reply["head"], reply["count"],
                                            reply.get("slot") or [-1] * len(reply["keys"])):
        if slot >= 0:
            data[key_in(key)] = from_frames(kind, head, [slotted[slot]])
        else:
            data[key_in(key)] = from_frames(kind, head, frames[at: at + count])
            at += count
    return data
