"""zstd frame headers, checked on the host before nvCOMP sees the frames: nvCOMP trusts
its input, and a malformed frame can fail the worker's CUDA context (RFC 8878)."""

from __future__ import annotations

from .fallback import Fallback

#: enough bytes of a zstd frame to hold its header (magic, descriptor, window, dictionary
#: id, content size)
HEAD_BYTES = 18
#: the first four bytes of every zstd frame (little-endian)
MAGIC = 0xFD2FB528


def zstd_content_size(header: bytes) -> int | None:
    """The decoded size a zstd frame's header states (None where it states none); raises
    :class:`Fallback` for bytes that do not start a zstd frame (RFC 8878, 3.1.1)."""
    if len(header) < 5 or int.from_bytes(header[:4], "little") != MAGIC:
        raise Fallback("not a zstd frame")
    descriptor = header[4]
    size_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if width == 0:
        return None
    if len(header) < start + width:
        raise Fallback("a truncated zstd frame header")
    value = int.from_bytes(header[start:start + width], "little")
    return value + 256 if width == 2 else value


def check_zstd_headers(heads: list[bytes], sizes: list[int]) -> None:
    """Every frame starts a zstd frame whose stated size, where stated, is the size its
    output holds (zarr's zstd codec states it)."""
    for head, size in zip(heads, sizes):
        stated = zstd_content_size(head)
        if stated is not None and stated != size:
            raise Fallback(f"a zstd frame states {stated} bytes, expected {size}")

