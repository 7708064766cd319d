"""Capacity for user code, with real workers on small tiers: the tiered store (NumPy in
the device tier's place) on a disk of a few megabytes (tests/helpers/small_disk.py), the
scheduler's capacity plugin, and a plain ``distributed.Client`` calling ``persist`` and
``dask.compute`` as users do.

* a persist past device + host tier + disk is refused before any of its tasks runs, with
  the numbers; the arrays held stay, with their values;
* a disk that fills anyway (the workers reported room they then did not have) stops the
  computation within seconds with the store's one line; held arrays stay, nothing of the
  stopped computation is left on the disk, and the cluster runs the next computation;
* two clients (two tenants of the service): the disk that the newer one's persist fills
  stops that persist alone; the older one's job, running beside it, finishes;
* what nominally fits completes: a rechunk of a held array, persisted beside it, whose
  values compress on the disk;
* the disk tier's rates, probed when the worker starts, reach the scheduler; a graph
  admitted past device + host tier prints one line at its own client with its bytes to
  disk, the disk's rates and the seconds, and nothing at another client.
"""

from __future__ import annotations

import contextlib
import os
import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster, get_task_stream, wait
from numpy_codec import NumpyCodec
from small_disk import SmallDisk

from spillway.memory import capacity
from spillway.memory.capacity import PLUGIN_NAME, TIERS, CapacityPlugin, format_seconds
from spillway.options.errors import AdmissionError, SpillDiskFull
from spillway.launch.session import _heartbeat
from spillway.memory import admission
from spillway.memory.store import TieredStore
from spillway.launch.plugins import WorkerSetup
from spillway.options.sizes import format_bytes

MB = 2**20


@contextlib.contextmanager
def small_cluster(tmp_path, *, device=4 * MB, host=4 * MB, disk=8 * MB, reports=None, threads=1, compress=True):
    """One worker whose store holds ``device`` + ``host`` bytes and a disk of ``disk``
    bytes (reporting ``reports`` bytes free where given), with spillway's plugins."""
    store = TieredStore(device_limit=device, host_limit=host, codec=NumpyCodec(),
                        below=[SmallDisk(str(tmp_path), disk, reports=reports, compress=compress)])
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=threads, dashboard_address=None,
                      data=store) as cluster, Client(cluster) as client:
        client.register_plugin(CapacityPlugin())
        client.register_plugin(WorkerSetup(prefetch=False))
        client.run(_heartbeat)
        yield client, store


@pytest.fixture(autouse=True)
def no_reserve(monkeypatch):
    # a disk of a few megabytes has no room for the gigabyte a real spill filesystem keeps
    monkeypatch.setattr(admission, "disk_reserve", lambda total: 0)


def _held(client, n: int = 1000, seed: int = 0, levels: int | None = None, panels: int = 4):
    """A persisted (n, n) float64 array of ``panels`` row panels, and its NumPy values."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, levels, (n, n)).astype(np.float64) if levels else rng.random((n, n))
    x = client.persist(da.from_array(values, chunks=(n // panels, n)))
    wait(x)
    return x, values


def _intact(x, values) -> None:
    """The held array's values, checked where the tiers have no room for a copy of any of
    its chunks (what ``compute`` of a chunk hands back is one): its row and column sums
    (exact for values of a few levels) and a strided sample."""
    rows, cols = dask.compute(x.sum(axis=1), x.sum(axis=0))
    np.testing.assert_allclose(rows, values.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(cols, values.sum(axis=0), rtol=1e-12)
    np.testing.assert_array_equal(x[::97, ::89].compute(), values[::97, ::89])


def _ran(stream, name: str) -> list:
    return [t for t in stream.data if name in str(t["key"])]


def test_a_persist_past_every_tier_is_refused_before_it_runs_with_the_numbers(tmp_path):
    with small_cluster(tmp_path) as (client, store):
        x, values = _held(client)  # 8 MiB held: on the device and the host tier
        y = da.ones((2000, 1000), chunks=(250, 1000))  # 16 MiB more: past the 16 MiB of tiers
        with get_task_stream(client) as stream:
            yp = y.persist()
            with pytest.raises(AdmissionError) as refused:
                yp.compute()
        line = str(refused.value)
        assert "\n" not in line and line.startswith("persist refused before it ran: its 8 new outputs (15.26 MiB")
        for part in ("beside the 7.63 MiB the cluster holds", "more than device + host tier + disk hold, 16.00 MiB",
                     "(device 4.00 MiB + host tier 4.00 MiB + disk 8.00 MiB", "1 worker",
                     "release held arrays", "larger local-directory", store.below[0].directory):
            assert part in line, (part, line)
        assert not _ran(stream, y.name)  # none of its tasks ran
        # what is built on the refused array fails with the same line
        with pytest.raises(AdmissionError, match="persist refused before it ran"):
            (yp + 1).sum().compute()
        # dask.compute of a collection past the tiers too, as a compute
        with pytest.raises(AdmissionError, match="^compute refused before it ran: its 1 new output"):
            dask.compute(da.ones((3000, 1000), chunks=(250, 1000)) + 1)
        # the held array is intact and the cluster runs what fits
        np.testing.assert_array_equal(x.compute(), values)
        assert float((x * 2).sum().compute()) == pytest.approx(2 * values.sum())
        assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins[PLUGIN_NAME].refused) == 2


def test_intermediates_count_at_their_most_in_dask_s_order(tmp_path):
    # 8 MiB held + 8 MiB of outputs fit 16 MiB, but a rechunk of x + 1 from row panels to
    # column panels holds every panel of x + 1 before its first column is assembled:
    # refused, naming them
    with small_cluster(tmp_path) as (client, _):
        x, values = _held(client)
        z = (x + 1).rechunk((1000, 250))
        zs = z.persist()
        with pytest.raises(AdmissionError, match="and its intermediates at their most") as refused:
            zs.compute()
        assert "beside the 7.63 MiB the cluster holds" in str(refused.value)
        np.testing.assert_array_equal(x.compute(), values)


def test_a_disk_that_fills_anyway_stops_the_computation_with_the_store_s_line(tmp_path):
    # the disk says it has 1 GiB free and takes 6 MiB: the persist is admitted and fills it
    with small_cluster(tmp_path, disk=6 * MB, reports=2**30) as (client, store):
        x, values = _held(client)
        y = da.random.default_rng(1).random((3000, 1000), chunks=(250, 1000))
        yp = y.persist()
        with pytest.raises(SpillDiskFull) as stopped:
            yp.compute()
        line = str(stopped.value)
        assert "\n" not in line and "the spill disk is full (No space left on device)" in line
        for part in (store.below[0].directory, "device", "host tier", "disk", "larger local-directory"):
            assert part in line
        assert store.below[0].full_errors >= 1

        def settled():
            states = client.run_on_scheduler(
                lambda dask_scheduler: {ts.state for k, ts in dask_scheduler.tasks.items() if y.name in str(k)})
            return states <= {"erred"}

        deadline = time.monotonic() + 10
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert settled()
        # nothing of the stopped persist is left: only the held array's chunks, on the
        # disk only what the tier knows of
        time.sleep(0.2)
        assert all(x.name in str(k) for k in store), sorted(map(str, store))
        assert len(store.below[0].files()) == len(store.below[0].meta) and store.below[0].on_disk() == store.below[0].nbytes
        # what is built on the stopped array says the same line
        with pytest.raises(SpillDiskFull, match="the spill disk is full"):
            yp.sum().compute()
        # the held array is intact, and the cluster runs the next computation
        np.testing.assert_array_equal(x.compute(), values)
        assert float((x + 1).sum().compute()) == pytest.approx(values.sum() + values.size)
        del x, yp
        deadline = time.monotonic() + 5
        while len(store) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(store) == 0 and store.below[0].files() == [] and store.below[0].nbytes == 0


@pytest.mark.filterwarnings("ignore:Sending large graph")
def test_a_rechunk_beside_its_held_input_completes_where_the_disk_holds_its_values_compressed(tmp_path):
    # 16 MiB held and 16 MiB of its rechunk: 32 MiB of values for 4 + 4 MiB of memory and a
    # disk of 10 MiB, which holds them compressed (values of four levels)
    with small_cluster(tmp_path, disk=10 * MB) as (client, store):
        x, values = _held(client, n=1448, levels=4)  # 16 MiB: half of it on the disk
        assert store.below[0].raw_nbytes > 4 * store.below[0].nbytes > 0
        client.run(_heartbeat)  # the scheduler reads the disk's ratio now, not in a second
        y = x.rechunk((1448, 181))  # row panels to column panels
        yp = y.persist()
        wait(yp)
        assert all(f.status == "finished" for f in yp.__dask_graph__().values() if hasattr(f, "status"))
        for j in range(8):
            np.testing.assert_array_equal(yp.blocks[0, j].compute(), values[:, j * 181:(j + 1) * 181])
        # the rechunk's pieces left the store as their output chunks were assembled
        assert {k[0] for k in store if isinstance(k, tuple)} == {x.name, y.name}
        assert store.below[0].raw_nbytes > 16 * MB > store.below[0].nbytes
        _intact(x, values)


@pytest.mark.filterwarnings("ignore:Sending large graph")
def test_the_same_rechunk_on_a_disk_that_does_not_compress_is_refused_up_front(tmp_path):
    with small_cluster(tmp_path, disk=11 * MB, compress=False) as (client, _):
        x, values = _held(client, n=1448, levels=4, panels=8)  # 2 MiB panels: 9 fit, 8 held
        client.run(_heartbeat)
        with get_task_stream(client) as stream:
            yp = x.rechunk((1448, 181)).persist()
            with pytest.raises(AdmissionError, match="persist refused before it ran: its 8 new outputs"):
                yp.compute()
        assert not [t for t in stream.data if "rechunk" in str(t["key"])]
        _intact(x, values)


def _slow_block(block, seconds: float = 0.1):
    time.sleep(seconds)
    return block + 1


@pytest.mark.filterwarnings("ignore:Sending large graph")
def test_a_full_disk_stops_the_tenant_that_filled_it_and_the_other_tenant_s_job_finishes(tmp_path):
    # two clients of one cluster, as two tenants of the shared service: the older runs a
    # light job of small chunks, the newer persists more than the 6 MiB disk holds (it
    # reports 1 GiB free, so both are admitted); the full disk stops the newer alone
    with small_cluster(tmp_path, disk=6 * MB, reports=2**30, threads=2) as (client, store), \
            Client(client.scheduler.address) as other:
        light = np.arange(64 * 1000, dtype=np.float64).reshape(64, 1000)
        job = other.compute(da.from_array(light, chunks=(2, 1000)).map_blocks(_slow_block, dtype=np.float64))
        time.sleep(0.3)  # the light job is admitted first: the older computation
        y = da.random.default_rng(1).random((3000, 1000), chunks=(250, 1000))
        yp = client.persist(y)
        with pytest.raises(SpillDiskFull, match="the spill disk is full"):
            client.compute(yp).result(timeout=30)
        assert not job.done()  # stopped while the other tenant's job ran
        np.testing.assert_array_equal(job.result(timeout=60), light + 1)
        stops = client.run_on_scheduler(lambda dask_scheduler: [
            e for _, e in dask_scheduler.get_events("spillway-capacity") if e.get("action") == "stopped"])
        assert [s["client"] for s in stops] == [client.id]
        # nothing of the stopped persist is left on the disk
        deadline = time.monotonic() + 5
        while any(y.name in str(k) for k in store) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(y.name in str(k) for k in store)


def test_a_graph_whose_keys_all_fit_at_once_is_admitted_without_running_it_in_dask_s_order(tmp_path,
                                                                                            monkeypatch):
    ran = []
    real = capacity.peak_bytes
    monkeypatch.setattr(capacity, "peak_bytes", lambda *a, **kw: ran.append(a[0]) or real(*a, **kw))
    with small_cluster(tmp_path) as (client, _):
        x, values = _held(client, n=700)  # 3.7 MiB of the 8 of device + host tier
        for _ in range(3):  # a user's compute, again and again: its keys are 1 MiB all told
            assert float((x[:175] * 2).sum().compute()) == pytest.approx(2 * values[:175].sum())
        assert ran == []
        # all its keys at once are past device + host (whether it goes to disk, and how
        # much, is what it holds at its most), and within the tiers: run in dask's order,
        # and admitted
        y = (x + x.T).sum()
        assert float(y.compute()) == pytest.approx(2 * values.sum())
        assert len(ran) == 1 and len(ran[0]) > 8


def test_a_graph_that_will_spill_tells_the_workers_to_grow_their_host_tier_first(tmp_path):
    """The arena of a fresh worker grows only while it is idle; a graph admitted past the
    devices says spills are coming, so it grows while the graph's first tasks run. A graph
    that fits the devices says nothing."""
    with small_cluster(tmp_path, device=8 * MB, host=8 * MB, disk=16 * MB) as (client, store):
        x, values = _held(client, n=700)  # 3.9 MB held, on the device
        assert float((x + 1).sum().compute()) == pytest.approx(values.sum() + 700 * 700)  # 7.8 MB at most
        time.sleep(0.2)  # a word sent would have arrived
        assert not store.host.wanted.is_set()
        # with its intermediates past the 8 MB device; its first tasks wait for the test's
        # word, so nothing has spilled (which says it too) when the word is looked for
        go = tmp_path / "go"
        y = x.map_blocks(_after, str(go), meta=np.empty((0, 0))).rechunk((700, 175)).persist()
        deadline = time.monotonic() + 5
        while not store.host.wanted.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        told = store.host.wanted.is_set()
        go.touch()
        wait(y)
        assert told
        np.testing.assert_array_equal(y.compute(), values + 1)


def _after(block, go: str):
    """``block + 1`` once the file ``go`` exists (the tasks' function reaches the worker
    pickled: a file is the word both sides see)."""
    import os

    deadline = time.monotonic() + 30
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
    return block + 1


def _probed(client, store) -> dict:
    """The worker's :data:`TIERS` report once its disk tier's probe is done and the
    scheduler has heard of it."""
    deadline = time.monotonic() + 20
    while store.below[0].probed is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.below[0].probed is not None, "the disk tier was not probed when the worker started"
    client.run(_heartbeat)
    reports = client.run_on_scheduler(
        lambda dask_scheduler: [ws.metrics.get(TIERS) for ws in dask_scheduler.workers.values()])
    assert len(reports) == 1
    return reports[0]


def test_the_worker_probes_its_spill_disk_at_start_and_reports_its_rates_leaving_no_file(tmp_path):
    with small_cluster(tmp_path) as (client, store):
        report = _probed(client, store)
        assert report["disk_write_rate"] > 0 and report["disk_read_rate"] > 0
        assert report["disk_write_from"] == report["disk_read_from"] == "probe"
        # the probe wrote beside the tier's directory, and took its file away
        assert os.listdir(tmp_path) == [os.path.basename(store.below[0].directory)]
        assert store.below[0].files() == [] and store.below[0].nbytes == 0


def _disk_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "go to the spill disk" in line]


def test_a_graph_past_device_and_host_tells_its_own_client_alone_its_disk_traffic_and_time(tmp_path, monkeypatch,
                                                                                       capsys):
    monkeypatch.setattr(capacity, "QUIET_S", 0.0)  # a few megabytes take milliseconds
    with small_cluster(tmp_path, disk=24 * MB) as (client, store), Client(client.scheduler.address) as other:
        report = _probed(client, store)
        heard = []  # every print at the other client (a tenant of the same scheduler)
        other.subscribe_topic("print", heard.append)
        x, values = _held(client)  # 8 MB of the 8 MiB of device + host tier: fits, no line
        assert float(other.compute(da.ones(100, chunks=50).sum()).result()) == 100  # fits too
        assert _disk_lines(capsys.readouterr().out) == []
        y = da.random.default_rng(1).random((1000, 1000), chunks=(250, 1000))
        yp = client.persist(y)  # 8 MB more: what passes 8 MiB goes to disk
        wait(yp)
        deadline = time.monotonic() + 5
        out = ""
        while not _disk_lines(out) and time.monotonic() < deadline:
            time.sleep(0.02)
            out += capsys.readouterr().out
        time.sleep(0.2)  # a second line, or one at the other client, would be in by now
        out += capsys.readouterr().out
        lines = _disk_lines(out)
        assert len(lines) == 1, out
        line = lines[0]
        to_disk = 2 * 8_000_000 - 8 * MB
        seconds = to_disk / report["disk_write_rate"] + to_disk / report["disk_read_rate"]
        assert line.startswith(f"persist past device + host tier: {format_bytes(to_disk)} of the 7.63 MiB it "
                               "holds at its most go to the spill disk, beside the 7.63 MiB the cluster holds")
        for part in ("written once and read back at least once", f"{format_bytes(2 * to_disk)} of disk traffic",
                     f"about {format_seconds(seconds)} at the disks' rates",
                     f"{format_bytes(int(report['disk_write_rate']))}/s write",
                     f"{format_bytes(int(report['disk_read_rate']))}/s read", "measured by its probe at start"):
            assert part in line, (part, line)
        assert heard == []
        events = client.run_on_scheduler(lambda dask_scheduler: [
            e for _, e in dask_scheduler.get_events("spillway-capacity") if e.get("action") == "to-disk"])
        assert [(e["client"], e["bytes"], e["message"]) for e in events] == [(client.id, to_disk, line)]
        # the one worker heard its share of the disk bytes, for its drain to write ahead,
        # and, the graph all in memory, that the write-ahead ended (the words go on the
        # worker's batched stream: in within moments)
        deadline = time.monotonic() + 5
        while (store.stats.ahead_said_bytes != to_disk or store.ahead_bytes) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.stats.ahead_said_bytes == to_disk and store.ahead_bytes == 0
        assert events[0]["seconds"] == pytest.approx(seconds)
        np.testing.assert_array_equal(yp.compute(), y.compute(scheduler="sync"))
        _intact(x, values)
