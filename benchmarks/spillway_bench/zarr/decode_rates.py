"""Per-thread zstd decode rates of one default-store chunk (one frame, zarr's level 0):
numcodecs' one-shot decode into a chunk-sized buffer (fresh, and reused) against the
streamed decode of :mod:`spillway.workflows.zarr.stream_decode` into two reused staging
pieces of 4-64 MiB, the file read in pieces from the page cache. One thread, so on a
shared machine the figures are per core; the smooth field with noise and random data of
the Zarr bench's generators (:mod:`.defaults`).

Beside them, ways with fewer memory passes (issue 29: is the streamed decode bound by the
copies around libzstd or by libzstd itself?), each checked bit for bit against numcodecs,
the piece of :func:`~spillway.workflows.zarr.stream_decode.piece_bytes`, the file mapped
(``mmap``: the decoder reads the page cache's pages, no ``pread`` copy):

* ``stream_mmap``: python-zstandard's streaming decoder (as the product's) into two reused
  staging pieces; libzstd still decodes into its window and copies out of it;
* ``ring_mmap``: libzstd's buffer-less API (``ZSTD_decompressContinue``, through
  python-zstandard's cffi backend) decoding straight into the two staging pieces used as
  a ring: no window copy, no file buffer; ``ring_mmap_numcodecs`` and
  ``ring_mmap_libzstd`` the same through ctypes on numcodecs' libzstd (built with the
  x86-64 assembly Huffman decoder, which python-zstandard's build leaves out) and on the
  system's libzstd, where each exports the calls;
* ``oneshot_mmap``: numcodecs' one-shot decode into the reused chunk-sized buffer;
* ``memcpy_whole`` / ``memcpy_pieces``: the chunk's bytes copied on one thread, into the
  chunk-sized buffer / into the two staging pieces in turn (the ceilings);
* ``pread_pieces``: the cached file read alone, as the streamed path reads it (stored
  bytes per second).

    python -m spillway_bench.zarr.decode_rates [--days 365] [--grid 721x1440] [--runs 3]
        [--pieces 4,8,16,32,64] [--out FILE]"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import tempfile
import time

import numpy as np

PIECES_MIB = (4, 8, 16, 32, 64)


class _NullSink:
    """Stands for the device: the piece is handed off (its copy runs on the GPU's engine)."""

    def wait(self, slot):
        pass

    def put(self, slot, offset, piece):
        pass

    def finish(self):
        return None

    def abandon(self):
        pass


def _best_interleaved(variants: dict, runs: int) -> dict:
    """The best seconds of each variant over ``runs`` rounds, each round running every
    variant once (a shared machine's load then weighs on all of them alike)."""
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(runs):
        for name, f in variants.items():
            prepare, f = f if isinstance(f, tuple) else (None, f)
            if prepare is not None:  # untimed: the file out of the page cache
                prepare()
            start = time.perf_counter()
            f()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _mapped(path: str):
    """The file mapped read-only, read front to back (fault-around maps its pages in runs)."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
        mapped.madvise(mmap.MADV_SEQUENTIAL)
    return mapped


class _Cffi:
    """libzstd's buffer-less decode calls through python-zstandard's cffi backend (its own
    libzstd; needs the ``cffi`` package)."""

    def __init__(self):
        from zstandard.backend_cffi import ffi, lib

        self.ffi, self.lib = ffi, lib

    def pointer(self, buffer):
        return self.ffi.from_buffer(buffer)

    def error(self, code) -> str:
        return self.ffi.string(self.lib.ZSTD_getErrorName(code)).decode()


class _Ctypes:
    """The same calls through ctypes into a shared object that exports libzstd's symbols
    (numcodecs' extension links its libzstd in and exports them; or the system's libzstd)."""

    def __init__(self, path: str):
        import ctypes

        lib = ctypes.CDLL(path)  # CDLL: the GIL is released during each call
        size_t, p = ctypes.c_size_t, ctypes.c_void_p
        for name, res, args in (("ZSTD_createDCtx", p, []), ("ZSTD_freeDCtx", size_t, [p]),
                                ("ZSTD_decompressBegin", size_t, [p]), ("ZSTD_nextSrcSizeToDecompress", size_t, [p]),
                                ("ZSTD_decompressContinue", size_t, [p, p, size_t, p, size_t]),
                                ("ZSTD_isError", ctypes.c_uint, [size_t]), ("ZSTD_getErrorName", ctypes.c_char_p, [size_t]),
                                ("ZSTD_versionNumber", ctypes.c_uint, [])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        lib.ZSTD_BLOCKSIZE_MAX = 1 << 17
        self.lib = lib

    def pointer(self, buffer) -> int:
        return np.frombuffer(buffer, np.uint8).ctypes.data  # the caller keeps the buffer alive

    def error(self, code) -> str:
        return self.lib.ZSTD_getErrorName(code).decode()


def _ring_backends() -> dict:
    """The libzstd builds this machine offers for the buffer-less decode: ``variant -> backend``."""
    import ctypes.util

    found = {}
    try:
        found["ring_mmap"] = _Cffi()
    except ImportError:  # python-zstandard without cffi
        pass
    try:
        import numcodecs.zstd

        found["ring_mmap_numcodecs"] = _Ctypes(numcodecs.zstd.__file__)
    except (ImportError, OSError, AttributeError):  # its symbols not exported
        pass
    system = ctypes.util.find_library("zstd")
    if system:
        try:
            found["ring_mmap_libzstd"] = _Ctypes(system)
        except (OSError, AttributeError):
            pass
    return found


def _ring_decode(frame, staging, put, zstd) -> int:
    """One zstd frame (a buffer) decoded by libzstd's buffer-less API (``zstd``: a
    :class:`_Cffi` or :class:`_Ctypes`) straight into the two ``staging`` pieces used as a
    ring: blocks are decoded into one piece until fewer than a block's 128 KiB are left,
    then that piece is handed to ``put(slot, offset, view)`` and the next block goes to the
    other piece (libzstd reads the window back across the two; each piece must be at least
    the window plus a block). No window copy, no file buffer. Returns the bytes decoded."""
    lib = zstd.lib
    dctx = lib.ZSTD_createDCtx()
    try:
        lib.ZSTD_decompressBegin(dctx)
        src = zstd.pointer(frame)
        dst = [zstd.pointer(piece) for piece in staging]
        capacity, block_max = len(staging[0]), lib.ZSTD_BLOCKSIZE_MAX
        pos = fill = slot = offset = 0
        n = lib.ZSTD_nextSrcSizeToDecompress(dctx)
        while n:
            if capacity - fill < block_max:
                put(slot, offset, memoryview(staging[slot])[:fill])
                offset, slot, fill = offset + fill, slot ^ 1, 0
            got = lib.ZSTD_decompressContinue(dctx, dst[slot] + fill, capacity - fill, src + pos, n)
            if lib.ZSTD_isError(got):
                raise ValueError(zstd.error(got))
            pos, fill = pos + n, fill + got
            n = lib.ZSTD_nextSrcSizeToDecompress(dctx)
        if fill:
            put(slot, offset, memoryview(staging[slot])[:fill])
        return offset + fill
    finally:
        lib.ZSTD_freeDCtx(dctx)


def _stream_into(frame, staging, put) -> int:
    """python-zstandard's streaming decoder over ``frame`` (a buffer) into the two staging
    pieces in turn."""
    import zstandard

    from spillway.workflows.zarr.stream_decode import read_into

    reader = zstandard.ZstdDecompressor().stream_reader(frame, read_across_frames=False, closefd=False)
    offset = slot = 0
    while True:
        view = memoryview(staging[slot])
        got = read_into(reader, view)
        if not got:
            return offset
        put(slot, offset, view[:got])
        offset, slot = offset + got, slot ^ 1


def passes(data: np.ndarray, path: str, frame: bytes, reused: np.ndarray, piece: int) -> tuple[dict, dict, dict]:
    """The variants with fewer memory passes (the module's docstring): ``name -> (bytes,
    f)`` to time, ``name -> bool``, each checked once against numcodecs' decode (untimed),
    and ``name -> host bytes`` each holds beyond the page cache's pages."""
    expected = data.view(np.uint8).reshape(-1)
    nbytes, size = data.nbytes, len(frame)
    staging = [np.ones(piece, np.uint8) for _ in range(2)]  # touched, as the pool's reused ones

    def ignore(slot, offset, view):
        pass

    def checked(decode) -> bool:
        out = np.zeros(nbytes, np.uint8)

        def put(slot, offset, view):
            out[offset:offset + len(view)] = view

        return decode(put) == nbytes and np.array_equal(out, expected)

    def on_mapped(decode, put):
        mapped = _mapped(path)
        try:
            with memoryview(mapped) as view:
                return decode(view, staging, put)
        finally:
            mapped.close()

    def oneshot_mmap():
        import numcodecs

        mapped = _mapped(path)
        try:
            with memoryview(mapped) as view:
                numcodecs.Zstd().decode(view, out=reused)
        finally:
            mapped.close()

    source = np.ones(nbytes, np.uint8)

    def memcpy_pieces():
        for slot, offset in enumerate(range(0, nbytes, piece)):
            chunk = source[offset:offset + piece]
            staging[slot & 1][:len(chunk)] = chunk

    file_piece = np.ones(min(piece, size), np.uint8)

    def pread_pieces():
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset in range(0, size, piece):
                os.preadv(fd, [memoryview(file_piece)[:size - offset]], offset)
        finally:
            os.close(fd)

    variants = {"stream_mmap": (nbytes, lambda: on_mapped(_stream_into, ignore))}
    exact = {"stream_mmap": checked(lambda put: on_mapped(_stream_into, put))}
    for name, zstd in _ring_backends().items():
        def ring(frame, staging, put, zstd=zstd):
            return _ring_decode(frame, staging, put, zstd)

        variants[name] = (nbytes, lambda ring=ring: on_mapped(ring, ignore))
        exact[name] = checked(lambda put, ring=ring: on_mapped(ring, put))
    variants.update({"oneshot_mmap": (nbytes, oneshot_mmap),
                     "memcpy_whole": (nbytes, lambda: np.copyto(reused, source)),
                     "memcpy_pieces": (nbytes, memcpy_pieces),
                     "pread_pieces_stored": (size, pread_pieces)})
    reused[:] = 0
    oneshot_mmap()
    exact["oneshot_mmap"] = bool(np.array_equal(reused, expected))
    import zstandard

    from spillway.workflows.zarr import stream_decode

    window = min(zstandard.get_frame_parameters(frame).window_size or nbytes, nbytes)  # libzstd's streaming decoder's
    held = {"stream_mmap": 2 * piece + window, **{k: 2 * piece for k in exact if k.startswith("ring")},
            "oneshot_mmap": nbytes,
            "streamed (product)": stream_decode.need(size, nbytes, window, piece)}
    return variants, exact, held


def rates(data: np.ndarray, directory: str, runs: int = 3, pieces_mib=PIECES_MIB, cold: bool = False) -> dict:
    import numcodecs

    from spillway.workflows.zarr import stream_decode
    from spillway.workflows.zarr.host_decode import BufferSet
    from spillway.workflows.zarr.host_io import HostIO

    frame = numcodecs.Zstd(level=0).encode(data)  # zarr's zstd codec: level 0, no checksum
    path = os.path.join(directory, "chunk.zst")
    with open(path, "wb") as f:
        f.write(frame)
    nbytes, size = data.nbytes, len(frame)
    codec = numcodecs.Zstd()
    gb = nbytes / 1e9
    out = {"array_bytes": nbytes, "stored_bytes": size, "ratio": round(nbytes / size, 3)}

    def fresh():
        codec.decode(frame, out=np.empty(nbytes, np.uint8))

    reused = np.ones(nbytes, np.uint8)  # touched: no page faults in the decode

    def into_reused():
        codec.decode(frame, out=reused)

    file_buffer = np.ones(size, np.uint8)

    def read_whole_then_decode():  # the whole-chunk path's host part (file cached)
        with open(path, "rb", buffering=0) as f:
            f.readinto(file_buffer)
        codec.decode(file_buffer, out=reused)

    variants = {"numcodecs_fresh_gbps": fresh, "numcodecs_reused_gbps": into_reused,
                "read_whole_then_decode_gbps": read_whole_then_decode}
    for mib in pieces_mib:
        piece = mib * 2**20
        io = HostIO(BufferSet(8 * piece))  # buffers reused between runs, as in the pool

        def streamed(io=io, piece=piece):
            try:
                stream_decode.decode_file(path, size, nbytes, io, _NullSink(), piece)
            finally:
                io.give_back()

        variants[f"streamed {mib} MiB"] = streamed
    fewer, exact, held = passes(data, path, frame, reused, stream_decode.piece_bytes())
    variants.update({f"passes {k}": f for k, (_, f) in fewer.items()})
    if cold:  # the file from the disk: the whole-chunk path adds the read to the decode
        from spillway_bench.ceilings import _sync_and_drop

        def drop():
            _sync_and_drop(path)

        def read_whole():
            with open(path, "rb", buffering=0) as f:
                f.readinto(file_buffer)

        io = HostIO(BufferSet(8 * stream_decode.piece_bytes()))

        def streamed_default():
            try:
                stream_decode.decode_file(path, size, nbytes, io, _NullSink())
            finally:
                io.give_back()

        variants.update({"cold disk read": (drop, read_whole),
                         "cold read_whole_then_decode_gbps": (drop, read_whole_then_decode),
                         "cold streamed_gbps": (drop, streamed_default)})
    best = _best_interleaved(variants, runs)
    out.update({k: round(gb / v, 3) for k, v in best.items() if not k.startswith(("streamed", "cold", "passes"))})
    out["streamed_gbps"] = {k.split(" ", 1)[1]: round(gb / v, 3) for k, v in best.items() if k.startswith("streamed")}
    out["passes_gbps"] = {k: round(n / best[f"passes {k}"] / 1e9, 3) for k, (n, _) in fewer.items()}
    out["passes_bit_exact"] = exact
    out["passes_host_bytes"] = held
    if cold:
        streamed = f"streamed_{stream_decode.piece_bytes() >> 20}_mib_gbps"
        out["cold"] = {"disk_read_stored_gbps": round(size / best["cold disk read"] / 1e9, 3),
                       "read_whole_then_decode_gbps": round(gb / best["cold read_whole_then_decode_gbps"], 3),
                       streamed: round(gb / best["cold streamed_gbps"], 3)}
    os.unlink(path)
    return out


def main(argv=None) -> int:
    from .defaults import field_block, random_block

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--grid", default="721x1440")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--pieces", default=",".join(map(str, PIECES_MIB)), help="piece sizes in MiB")
    p.add_argument("--cold", action="store_true", help="also from the disk (the file dropped from the page cache)")
    p.add_argument("--directory", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    nlat, nlon = (int(x) for x in a.grid.split("x"))
    import zstandard

    result = {"machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
                          "zstandard": zstandard.__version__, "libzstd": ".".join(map(str, zstandard.ZSTD_VERSION)),
                          "ring_libzstd": {k: _version(z.lib.ZSTD_versionNumber()) for k, z in _ring_backends().items()},
                          "load_before": os.getloadavg()},
              "days": a.days, "grid": [nlat, nlon], "runs": a.runs}
    with tempfile.TemporaryDirectory(dir=a.directory) as d:
        for name, make in (("field", field_block), ("random", random_block)):
            result[name] = rates(make(0, a.days, nlat, nlon), d, a.runs, [int(x) for x in a.pieces.split(",")],
                                 a.cold)
            print(name, json.dumps(result[name]), flush=True)
    result["machine"]["load_after"] = os.getloadavg()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    from spillway.workflows.zarr.stream_decode import piece_bytes

    piece = piece_bytes() >> 20
    print(f"fewer memory passes, the file mapped, {piece} MiB pieces: GB/s per thread, best of {a.runs} "
          f"(pread: stored bytes)")
    names = list(result["field"]["passes_gbps"])
    width = max(map(len, names)) + 1
    print(f"{'data':<8}" + "".join(f"{k.removesuffix('_stored'):>{width}}" for k in names) + "  bit-exact")
    for name in ("field", "random"):
        r = result[name]
        exact = "all" if all(r["passes_bit_exact"].values()) else \
            "NOT " + ", ".join(k for k, v in r["passes_bit_exact"].items() if not v)
        print(f"{name:<8}" + "".join(f"{r['passes_gbps'][k]:>{width}.2f}" for k in names) + f"  {exact}")
    print(f"zstd decode of one {a.days}-day chunk ({a.days * nlat * nlon * 4 / 1e9:.2f} GB), GB/s of array bytes "
          f"per thread, best of {a.runs}")
    print(f"{'data':<8}{'ratio':>6}{'fresh':>8}{'reused':>8}{'read+dec':>9}" +
          "".join(f"{k:>9}" for k in result["field"]["streamed_gbps"]))
    for name in ("field", "random"):
        r = result[name]
        print(f"{name:<8}{r['ratio']:>6.2f}{r['numcodecs_fresh_gbps']:>8.2f}{r['numcodecs_reused_gbps']:>8.2f}"
              f"{r['read_whole_then_decode_gbps']:>9.2f}" + "".join(f"{v:>9.2f}" for v in r["streamed_gbps"].values()))
    if a.cold:
        for name in ("field", "random"):
            print(f"{name} cold (dropped from the page cache first): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in result[name]["cold"].items()))
    return 0


def _version(number: int) -> str:
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
