"""Progress of a run, counted on the scheduler and drawn on the client.

A scheduler plugin adopts the tasks of the next graph a client submits after it announced
a run, and counts them as they finish (and the bytes they produce). The client polls that
count and draws a bar with tasks, bytes, elapsed time and ETA.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from distributed.diagnostics.plugin import SchedulerPlugin

from spillway import upstream

PLUGIN_NAME = "spillway-progress"


class RunProgress(SchedulerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.runs: dict[str, dict] = {}
        self.expecting: dict[str, str] = {}  # client id -> run id
        self.owner: dict = {}  # task key -> run id

    def update_graph(self, scheduler, *, client, keys, tasks, **kwargs):
        run_id = self.expecting.pop(client, None)
        if run_id is None or run_id not in self.runs:
            return
        run = self.runs[run_id]
        for key in tasks:
            if key not in self.owner:
                self.owner[key] = run_id
                run["total"] += 1
                if upstream.key_state(scheduler, key) == "memory":
                    run["done"] += 1

    def transition(self, key, start, finish, *args, **kwargs):
        run_id = self.owner.get(key)
        if run_id is None:
            return
        run = self.runs[run_id]
        if finish == "memory":
            run["done"] += 1
            run["bytes"] += upstream.key_nbytes(self.scheduler, key) if self.scheduler else 0
        elif finish == "erred":
            run["erred"] += 1
        elif finish == "forgotten":
            self.owner.pop(key, None)

    async def start(self, scheduler):
        self.scheduler = scheduler

    scheduler = None


def _announce(run_id: str, client_id: str, dask_scheduler=None):
    plugin = dask_scheduler.plugins[PLUGIN_NAME]
    plugin.runs[run_id] = {"total": 0, "done": 0, "erred": 0, "bytes": 0}
    plugin.expecting[client_id] = run_id


def _read(run_id: str, dask_scheduler=None):
    return dict(dask_scheduler.plugins[PLUGIN_NAME].runs.get(run_id, {}))


def client_progress(client_id: str, dask_scheduler=None):
    """Counts of the run whose results ``client_id`` waits for (run on the scheduler:
    ``client.run_on_scheduler(client_progress, client.id)``), or None."""
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    wanted = upstream.client_wanted_keys(dask_scheduler, client_id)
    if plugin is None or wanted is None:
        return None
    for key in wanted:
        run = plugin.runs.get(plugin.owner.get(key))
        if run is not None:
            return dict(run)
    return None


def _finish(run_id: str, dask_scheduler=None):
    plugin = dask_scheduler.plugins[PLUGIN_NAME]
    run = plugin.runs.pop(run_id, None)
    for key in [k for k, r in plugin.owner.items() if r == run_id]:
        del plugin.owner[key]
    return run


class Tracker:
    """Client side of one run's progress."""

    def __init__(self, client, run_id: str):
        self.client = client
        self.run_id = run_id

    def read(self) -> dict:
        return self.client.run_on_scheduler(_read, self.run_id)


@contextmanager
def track(client, run_id: str):
    """Announce a run; the next graph this client submits is counted as its tasks."""
    client.register_plugin(RunProgress())
    client.run_on_scheduler(_announce, run_id, client.id)
    try:
        yield Tracker(client, run_id)
    finally:
        try:
            client.run_on_scheduler(_finish, run_id)
        except Exception:
            pass


#: seconds between two looks at a run's futures
POLL_S = 0.02


def _all_done(future) -> bool:
    futures = future if isinstance(future, (list, tuple)) else [future]
    return all(f.done() for f in futures)


def wait_with_bar(future, tracker: Tracker, *, label: str, stream=None, interval: float = 0.25) -> dict:
    """Wait for ``future`` drawing a bar on ``stream`` (None: no bar). Returns the last count."""
    from spillway.options.sizes import format_bytes

    bar = None
    if stream is not None:
        from tqdm import tqdm

        from .bars import terminal_shape

        bar = tqdm(total=0, desc=label, unit="task", file=stream, leave=True, **terminal_shape(stream),
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} tasks "
                              "[{elapsed}<{remaining}{postfix}]")
    last = {"total": 0, "done": 0, "bytes": 0, "erred": 0}
    start = time.perf_counter()
    try:
        while True:
            # polled, not distributed.wait(timeout=): each of its timeouts is an exception
            # whose traceback holds this frame, and with it the run's futures, until the
            # garbage collector's next full pass; an adaptive cluster would keep a worker
            # for the result it thinks is still wanted
            deadline = time.perf_counter() + interval
            while not (finished := _all_done(future)) and time.perf_counter() < deadline:
                time.sleep(POLL_S)
            try:
                last = tracker.read() or last
            except Exception:
                pass
            if bar is not None:
                bar.total = max(last.get("total", 0), last.get("done", 0))
                bar.n = last.get("done", 0)
                bar.set_postfix_str(f"{format_bytes(last.get('bytes', 0))} produced", refresh=False)
                bar.refresh()
            if finished:
                break
    finally:
        if bar is not None:
            bar.close()
    last["elapsed_s"] = time.perf_counter() - start
    return last


def line_writer(stream):
    """``say(line)``: ``line`` on ``stream``, above a progress bar drawn there (tqdm moves
    the bar below it rather than writing over it)."""

    def say(line: str) -> None:
        from tqdm import tqdm

        tqdm.write(line, file=stream)

    return say


def default_stream():
    """stderr when it is a terminal, else None (logs and pipes get no bar)."""
    return sys.stderr if sys.stderr.isatty() else None
