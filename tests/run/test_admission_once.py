"""Admission asks the scheduler once a run, never the workers (issue 76)."""

from __future__ import annotations


def test_a_run_asks_the_scheduler_for_capacity_once_and_no_worker(monkeypatch):
    """A run's admission reads the tiers the scheduler's capacity plugin holds from the
    workers' heartbeats: one call to the scheduler for the run, no ``client.run`` on the
    workers for capacity (counted on a real spillway cluster of CPU workers)."""
    import distributed

    from spillway.launch import open_cluster
    from spillway.memory import admission
    from spillway.memory.capacity import PLUGIN_NAME
    from spillway.options.settings import Options
    from spillway.run.compute import run_workflow

    ran = []
    real_run = distributed.Client.run

    def counted(self, function, *args, **kwargs):
        ran.append(getattr(function, "__name__", repr(function)))
        return real_run(self, function, *args, **kwargs)

    monkeypatch.setattr(distributed.Client, "run", counted)
    options = Options.resolve(cpu=True, n_workers=2, threads_per_worker=1, host="127.0.0.1",
                              dashboard_address=None, memory_limit="3GB", protocol="tcp")
    with open_cluster(options) as session:
        client = session.client

        def asked(dask_scheduler):
            return dask_scheduler.plugins[PLUGIN_NAME].asked

        before = client.run_on_scheduler(asked)
        capacity = admission.cluster_capacity(client)
        assert capacity.n_workers == 2 and capacity.host_bytes > 0 and capacity.disk_bytes > 0
        assert client.run_on_scheduler(asked) == before + 1
        ran.clear()
        report = run_workflow(session, "transpose-sum", {"size": "600x600", "chunks": "200x200"}, verify=True)
        assert report["verify"]["ok"]
        assert client.run_on_scheduler(asked) == before + 2
        assert "worker_capacity" not in ran, ran
