"""How fast a freshly started host hands memory to a process: the rate the pinned arena
grows at, which bounds a fresh host's first spills (the svd's first run spilled at 3.2
GB/s while its arena grew). Run FIRST on a new host, before anything else touches memory:

    python3 benchmarks/gpu-host/first-touch.py [GIB_EACH]      (default 4)

Each configuration touches its own GIB_EACH GiB, all kept until the end (freed pages would
be handed back already backed): 4 KiB pages and transparent huge pages (madvise), by 1, 4
and 8 threads; then how long pinning (cudaHostRegister) one touched region takes, and
the arena's own ``take_segment`` (what the worker does). Prints GiB/s per row.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

STEP = 256 << 20


def touch(nbytes: int, huge: bool, threads: int):
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        region.madvise(mmap.MADV_HUGEPAGE)
    array = np.frombuffer(region, dtype=np.uint8)
    ptr = array.ctypes.data
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda s: ctypes.memset(ptr + s, 0, min(STEP, nbytes - s)), range(0, nbytes, STEP)))
    return time.perf_counter() - start, region, array


def main() -> int:
    gib = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    nbytes = int(gib * 2**30)
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        print("transparent_hugepage:", f.read().strip())
    kept = []
    rows = []
    for huge in (False, True):
        for threads in (1, 4, 8):
            seconds, region, array = touch(nbytes, huge, threads)
            kept.append((region, array))
            rows.append((f"touch {'2 MiB' if huge else '4 KiB'} pages, {threads} thread(s)", seconds))
            print(f"{rows[-1][0]:<40} {gib / seconds:6.2f} GiB/s", flush=True)
    try:
        import cupy

        for (region, array), name in ((kept[0], "4 KiB"), (kept[3], "2 MiB")):
            start = time.perf_counter()
            cupy.cuda.runtime.hostRegister(array.ctypes.data, nbytes, 1)
            seconds = time.perf_counter() - start
            cupy.cuda.runtime.hostUnregister(array.ctypes.data)
            print(f"{'pin touched ' + name + ' pages':<40} {gib / seconds:6.2f} GiB/s", flush=True)
        from spillway.memory.worker import _TOUCH_THREADS, take_segment

        start = time.perf_counter()
        segment = take_segment(nbytes)
        seconds = time.perf_counter() - start
        print(f"{f'take_segment ({_TOUCH_THREADS} threads)':<40} {gib / seconds:6.2f} GiB/s", flush=True)
        del segment
    except ImportError as e:
        print(f"no pinning measured ({e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
