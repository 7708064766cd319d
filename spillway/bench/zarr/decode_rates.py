"""Per-thread zstd decode rates of one default-store chunk (one frame, zarr's level 0):
numcodecs' one-shot decode into a chunk-sized buffer (fresh, and reused) against the
streamed decode of :mod:`spillway.workflows.zarr.stream_decode` into two reused staging
pieces of 4-64 MiB, the file read in pieces from the page cache. One thread, so on a
shared machine the figures are per core; the smooth field with noise and random data of
the Zarr bench's generators (:mod:`.defaults`).

    python -m spillway.bench.zarr.decode_rates [--days 365] [--grid 721x1440] [--runs 3]
        [--pieces 4,8,16,32,64] [--out FILE]"""

from __future__ import annotations

import argparse
import json
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
    if cold:  # the file from the disk: the whole-chunk path adds the read to the decode
        from spillway.bench.ceilings import _sync_and_drop

        def drop():
            _sync_and_drop(path)

        def read_whole():
            with open(path, "rb", buffering=0) as f:
                f.readinto(file_buffer)

        io = HostIO(BufferSet(8 * stream_decode.PIECE_BYTES))

        def streamed_default():
            try:
                stream_decode.decode_file(path, size, nbytes, io, _NullSink())
            finally:
                io.give_back()

        variants.update({"cold disk read": (drop, read_whole),
                         "cold read_whole_then_decode_gbps": (drop, read_whole_then_decode),
                         "cold streamed_gbps": (drop, streamed_default)})
    best = _best_interleaved(variants, runs)
    out.update({k: round(gb / v, 3) for k, v in best.items() if not k.startswith(("streamed", "cold"))})
    out["streamed_gbps"] = {k.split(" ", 1)[1]: round(gb / v, 3) for k, v in best.items() if k.startswith("streamed")}
    if cold:
        streamed = f"streamed_{stream_decode.PIECE_BYTES >> 20}_mib_gbps"
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


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
