"""The exchange as one step a worker on a GPU: two workers on one GPU (a ONE-GPU host
does), CuPy chunks, the steps' pieces written straight into each other's outputs over
CUDA IPC, their buffers over the UCXX transport (CUDA IPC within the device) and over the
host transport, answers bit for bit against dask's task method on
the same cluster; a map_overlap's halos and an FFT's axis swap too. Marked gpu: skipped
where there is no GPU."""

from __future__ import annotations

import numpy as np
import pytest

from spillway.launch import open_cluster
from spillway.launch.plan import ucxx_installed
from spillway.options.settings import Options

pytestmark = pytest.mark.gpu

needs_ucxx = pytest.mark.skipif(not ucxx_installed(), reason="distributed-ucxx is not installed")


def _steps_ran(dask_worker):
    from spillway.run.measuring import step_phases

    phases = step_phases(dask_worker)
    return None if phases is None else {"rounds": phases["counts"].get("step_cut", 0),
                                        "received": phases["taken_bytes"], "over": phases["transports"]}


def _kinds(dask_worker):
    from spillway.datapath.step.state import state_of

    state = state_of(dask_worker)
    return sorted(state._transports) if state is not None else []


@needs_ucxx
@pytest.mark.parametrize("transport", ["ipc", "ucxx", "host"])
def test_two_workers_on_one_gpu_exchange_cupy_chunks_bit_for_bit(transport):
    import cupy
    import dask
    import dask.array as da

    options = Options.resolve(devices="0", workers_per_gpu=2, protocol="ucx", pinned_pool_size="2GB",
                              dashboard_address=None, exchange_transport=transport)
    with open_cluster(options) as session:
        client = session.client
        rng = cupy.random.default_rng(7)
        x = da.from_array(rng.standard_normal((4000, 3000)), chunks=(250, 3000), asarray=False).persist()
        y = x.rechunk((4000, 125))
        assert any(name.startswith("spillway-step-") for name in y.dask.layers)
        got = y.compute()
        with dask.config.set({"array.rechunk.method": "tasks"}):
            want = x.rechunk((4000, 125)).compute()
        assert isinstance(got, cupy.ndarray) and bool((got == want).all())
        ran = [r for r in client.run(_steps_ran).values() if r]
        assert len(ran) == 2 and all(r["received"] > 0 for r in ran)
        assert all(transport in kinds for kinds in client.run(_kinds).values())
        assert all(set(r["over"]) == {transport} for r in ran), ran

        # the halos of a map_overlap along both axes, and an FFT's axis swap
        z = x.rechunk((500, 500))
        halo = z.map_overlap(lambda b: b * 2, depth={0: 2, 1: 3}, boundary="reflect")
        with dask.config.set({"array.rechunk.method": "tasks"}):
            from spillway.datapath.collective.method import dask_halos

            with dask_halos():
                want_halo = z.map_overlap(lambda b: b * 2, depth={0: 2, 1: 3}, boundary="reflect").compute()
        assert bool((halo.compute() == want_halo).all())
        spectrum = da.fft.fft(x.rechunk({0: -1, 1: 100}), axis=0).compute()
        reference = np.fft.fft(cupy.asnumpy(x.compute()), axis=0)
        err = np.abs(cupy.asnumpy(spectrum) - reference).max() / np.abs(reference).max()
        assert err < 1e-12
