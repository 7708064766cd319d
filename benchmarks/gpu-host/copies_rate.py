"""How fast a cut and a join of W3 run on one GPU (issue 50): a 1000 x 80000 float64
row panel cut into the 80 pieces of the column panels (packed into two buffers, one a
worker), and a 80000 x 1000 column panel joined from 80 pieces, each made three ways:
spillway's batch (:mod:`spillway.datapath.collective.copies`, one launch), CuPy one
assignment a piece, and one contiguous copy of the same bytes (the ceiling). Host time
(the call) and device time (CUDA events) per operation, median of ``--runs``; one JSON
line.

  python benchmarks/gpu-host/copies_rate.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _timed(fn, runs: int) -> dict:
    import cupy

    fn()  # compile, allocate
    cupy.cuda.Device().synchronize()
    host, device = [], []
    for _ in range(runs):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        began = time.perf_counter()
        fn()
        host.append(time.perf_counter() - began)
        stop.record()
        stop.synchronize()
        device.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return {"host_ms": statistics.median(host) * 1e3, "device_ms": statistics.median(device) * 1e3}


def main() -> None:
    import cupy

    from spillway.datapath.collective.copies import Batch, Flat
    from spillway.datapath.collective.layout import packing, plan_of

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    n, w = 80000, 1000
    old = ((w,) * (n // w), (n,))
    new = ((n,), (w,) * (n // w))
    plan = plan_of(old, new)
    panel = cupy.random.random((w, n))
    packs = packing(old, new, (0, 0), 2)
    buffers = {d: cupy.empty(total) for d, (total, _) in packs.items()}

    def cut_batch():
        batch = Batch(8)
        for d, (_, pieces) in packs.items():
            for offset, shape, src in pieces.values():
                batch.add(panel, src, buffers[d], Flat(offset, shape))
        batch.run()

    def cut_cupy():
        for d, (_, pieces) in packs.items():
            for offset, shape, src in pieces.values():
                buffers[d][offset: offset + shape[0] * shape[1]].reshape(shape)[...] = panel[src]

    pieces = [cupy.random.random((w, w)) for _ in range(n // w)]
    places = [dst for _, dst in plan.parts_of((0, 0))]
    out = cupy.empty((n, w))

    def join_batch():
        batch = Batch(8)
        for piece, place in zip(pieces, places):
            batch.add(piece, (slice(0, w), slice(0, w)), out, place)
        batch.run()

    def join_cupy():
        for piece, place in zip(pieces, places):
            out[place] = piece

    flat_in, flat_out = cupy.random.random(n * w), cupy.empty(n * w)

    def ceiling():
        cupy.copyto(flat_out, flat_in)

    result = {"bytes": panel.nbytes}
    for name, fn in (("cut_batch", cut_batch), ("cut_cupy", cut_cupy), ("join_batch", join_batch),
                     ("join_cupy", join_cupy), ("contiguous_copy", ceiling)):
        found = _timed(fn, args.runs)
        found["device_gbps"] = 2 * panel.nbytes / (found["device_ms"] / 1e3) / 1e9  # read + write
        result[name] = found
    assert bool((out[:w] == pieces[0]).all()) and bool((buffers[0][: w * w].reshape(w, w) == panel[:, :w]).all())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
