"""``cluster.open(...)`` on a plain install: the Zarr reader needs no HTTP client (httpx
is in the service extras, not a base dependency)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dask.array as da
import numpy as np

SCRIPT = textwrap.dedent("""
    import sys

    sys.modules["httpx"] = None  # as on an install without the service extras: importing it fails
    import numpy as np

    from spillway.clusters.local import Local

    # Local.open reads no cluster state: no cluster is started for it here
    array = Local.open(Local.__new__(Local), sys.argv[1], backend="numpy")
    x = array.compute(scheduler="threads")
    expected = np.arange(12_000, dtype=np.float64).reshape(120, 100)
    print(type(array).__module__, float(np.abs(x - expected).max() / np.abs(expected).max()))
    print("httpx" in sys.modules and sys.modules["httpx"] is not None)
""")


def test_local_open_reads_a_store_without_httpx(tmp_path):
    x = np.arange(12_000, dtype=np.float64).reshape(120, 100)
    da.to_zarr(da.from_array(x, chunks=(40, 50)), str(tmp_path / "x.zarr"), zarr_format=3)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "x.zarr")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    kind, error, httpx_loaded = done.stdout.split()
    assert kind.startswith("dask.array") and float(error) <= 1e-15
    assert httpx_loaded == "False"
