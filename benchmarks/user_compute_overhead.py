"""What a user's own compute pays on spillway's cluster that it does not on a plain one.

    python3 benchmarks/user_compute_overhead.py [--cpu] [--sizes 2000:500,4000:250,8000:2000]
        [--runs 10] [--repeats 3] [--variants defaults,no-capacity,...] [--profile]
        [--before TREE] [--label before] [--out benchmarks/results]

Each pairing starts, fresh and at once, spillway's cluster (``spillway.local``, the
dashboard off as the bench has it) and the bench's baseline on the same workers and
threads (:func:`spillway_bench.clusters.baseline_cluster`: ``distributed.LocalCluster`` on
CPU, ``LocalCUDACluster(protocol="ucx")`` on GPUs), each in a process of its own (the
client and the local scheduler in it, as in a user's notebook), and with ``--before`` a
third side: spillway from another checkout (the code before a change). For each size
``N:C`` it persists a seeded ``N x N`` float64 array in ``C x C`` chunks on every side,
then runs ``(x + x.T).sum().compute()`` ``--runs`` times on each, the sides alternating
run by run (the order turning each run), so that a neighbour's load falls on all alike.
Per side: the first run, the median of runs 2..N and its ratio to the baseline's, the CPU
seconds a compute takes in the process of the client and scheduler and in the workers
(process times, which a neighbour's load hurts less than wall times), and the
scheduler's own time from a graph's arrival to its tasks made (its "update-graph" event).

A variant turns one of spillway's suspects off on its cluster before the arrays are
persisted, from outside (the probe reaches into the scheduler; production code reads no
switch for it):

* ``defaults``: spillway as started;
* ``no-capacity``: the capacity check's scheduler plugin removed and its sizing of each
  graph unwrapped from distributed's graph materialization;
* ``no-sizes``: the sizing alone unwrapped (the check sees no sizes and admits every graph);
* ``no-collective``: the collective's placement plugin removed;
* ``no-worker-setup``: spillway's worker plugin torn down and its heartbeat metric removed;
* ``no-session-config``: this process's dask config as before ``spillway.local`` (the
  peer-to-peer rechunk method, and dask's own rechunk function);
* ``dashboard``: spillway's default dashboard on (the other variants have it off);
* on GPU workers, spillway's own options: ``dask-cuda-store`` (``memory_store="dask-cuda"``,
  not the tiered store), ``no-prefetch``, ``no-spill-on-demand``, ``no-data-plane``,
  ``no-pinned-pool`` (``pinned_pool_size=0``).

``--profile``: after the timed pairings, one more pairing of the defaults a size, with
cProfile in each side's process over runs 2..N, on the thread of the client's and
scheduler's event loop, the thread that materializes graphs and the main thread:
spillway's functions and distributed's graph steps by their milliseconds a compute.

Writes ``<machine>-<date>-user-overhead-<label>.json`` and ``.md`` and a ``.png`` of the
medians under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import json
import os
import platform
import pstats
import statistics
import sys
import time

#: variants that are spillway's own options, for GPU workers (what they turn off is not on
#: CPU workers): the keywords given to ``spillway.local``
OPTION_VARIANTS = {"dask-cuda-store": {"memory_store": "dask-cuda"}, "no-prefetch": {"prefetch": False},
                   "no-spill-on-demand": {"spill_on_demand": False}, "no-data-plane": {"data_plane": False},
                   "no-pinned-pool": {"pinned_pool_size": 0}}
VARIANTS = ("defaults", "no-capacity", "no-sizes", "no-collective", "no-worker-setup", "no-session-config",
            "dashboard", *OPTION_VARIANTS)
SEED = 5500


# --- the suspects, turned off from outside


def _drop_capacity(dask_scheduler=None) -> bool:
    from spillway.memory.capacity import PLUGIN_NAME, uninstall_sizes

    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None:
        return False
    dask_scheduler.remove_plugin(PLUGIN_NAME)
    if plugin._sizes:
        uninstall_sizes()
        plugin._sizes = False
    return True


def _drop_sizes(dask_scheduler=None) -> bool:
    from spillway.memory.capacity import PLUGIN_NAME, uninstall_sizes

    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None or not plugin._sizes:
        return False
    uninstall_sizes()
    plugin._sizes = False
    return True


def _drop_collective(dask_scheduler=None) -> bool:
    from spillway.datapath.collective.spread import PLUGIN_NAME

    if PLUGIN_NAME not in dask_scheduler.plugins:
        return False
    dask_scheduler.remove_plugin(PLUGIN_NAME)
    return True


def _drop_tiers_metric(dask_worker=None) -> bool:
    from spillway.memory.capacity import TIERS

    return dask_worker.metrics.pop(TIERS, None) is not None


@contextlib.contextmanager
def turned_off(variant: str, cluster):
    """``cluster`` (a :class:`spillway.clusters.local.Local`) with ``variant``'s suspect off."""
    client = cluster.client
    if variant == "no-capacity":
        assert client.run_on_scheduler(_drop_capacity), "no capacity plugin to remove"
    elif variant == "no-sizes":
        assert client.run_on_scheduler(_drop_sizes), "no sizing to unwrap"
    elif variant == "no-collective":
        assert client.run_on_scheduler(_drop_collective), "no collective plugin to remove"
    elif variant == "no-worker-setup":
        from spillway.launch.plugins import PLUGIN_NAME

        client.unregister_worker_plugin(PLUGIN_NAME)
        client.run(_drop_tiers_metric)
    if variant != "no-session-config":
        yield
        return
    import dask.config

    from spillway.datapath.collective.method import stop_using, use_on

    address = client.scheduler.address
    stop_using(address)
    try:
        with dask.config.set({"array.rechunk.method": None}):
            yield
    finally:
        use_on(address)


# --- one side, in a process of its own


class Side:
    """One side of a pairing in its own process, started fresh: as a user's notebook would
    have it, the client and the scheduler of a local cluster in that process (two sides in
    one process would share distributed's module, whose graph materialization spillway's
    capacity check wraps, and so the baseline would pay for spillway's sizing too).
    Commands go as JSON lines on its stdin, answers come back on its stdout."""

    def __init__(self, name: str, variant: str, args, *, profile: bool = False, hooks: bool = False,
                 tree: str | None = None):
        """``tree``: a checkout whose ``spillway`` this side imports instead (the code
        before a change, measured in the same pairings as the code after it)."""
        import subprocess

        side = "baseline" if name == "baseline" else "spillway"
        argv = [sys.executable, os.path.abspath(__file__), "--serve", side, "--variants", variant,
                "--workers", str(args.workers)]
        if args.cpu:
            argv.append("--cpu")
        if profile:
            argv.append("--profile")
        if hooks:
            argv.append("--hooks")
        env = dict(os.environ)
        if tree:
            env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(tree), *filter(None, [env.get("PYTHONPATH")])])
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.described = None

    def ready(self) -> dict:
        if self.described is None:
            self.described = self._answer()
        return self.described

    def ask(self, op: str, **kwargs) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} side ended (exit {self.proc.wait()}); see its stderr above")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask("close")
            except (RuntimeError, BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(120)
            except Exception:  # noqa: BLE001
                self.proc.kill()


def side_names(args) -> list[str]:
    return ["spillway", *(["spillway-before"] if args.before else []), "baseline"]


@contextlib.contextmanager
def pairing(variant: str, args, *, profile: bool = False, hooks: bool = False, only: str | None = None):
    """The sides, fresh, started at once (or the side ``only``): spillway, spillway
    before a change where ``--before`` names its checkout, and the baseline."""
    sides = {}
    for name in side_names(args) if only is None else [only]:
        sides[name] = Side(name, variant, args, profile=profile, hooks=hooks and name != "baseline",
                           tree=args.before if name == "spillway-before" else None)
    try:
        for side in sides.values():
            side.ready()
        yield sides
    finally:
        for side in sides.values():
            side.close()


def measure_size(sides: dict, n: int, chunk: int, runs: int, seed: int) -> dict:
    """Persist the array on each side, then ``runs`` computes each, the sides alternating
    (which goes first swaps each run)."""
    for side in sides.values():
        side.ask("persist", n=n, chunk=chunk, seed=seed)
    got: dict = {name: [] for name in sides}
    order = list(sides)
    for i in range(runs):
        for name in (order if i % 2 == 0 else order[::-1]):
            got[name].append(sides[name].ask("compute", profile=i > 0))
    graphs = {name: side.ask("release", computes=runs)["graphs"] for name, side in sides.items()}
    first = got[order[0]][0]["value"]
    agree = all(abs(g["value"] - first) <= 1e-9 * abs(first) for gs in got.values() for g in gs)
    out = {"values_agree": agree}
    for name, gs in got.items():
        rest = gs[1:] or gs
        out[name] = {"value": gs[0]["value"], "first_s": gs[0]["seconds"],
                     "median_rest_s": statistics.median(g["seconds"] for g in rest),
                     "cpu_rest_s": statistics.median(g["cpu_s"] for g in rest),
                     "workers_cpu_rest_s": statistics.median(g["workers_cpu_s"] for g in rest),
                     "runs_s": [round(g["seconds"], 5) for g in gs], "update_graph": graphs[name]}
    return out


def serve(side: str, variant: str, args) -> int:
    """The child: start this side's cluster, then answer commands until ``close``."""
    import dask

    out = sys.stdout
    sys.stdout = sys.stderr  # whatever else prints stays off the answers' pipe
    with cluster_of(side, variant, args) as (client, described):
        profile = Profile(client) if args.profile else None
        hooks = Hooks(client) if args.hooks and side == "spillway" else None
        held = None
        out.write(json.dumps(described) + "\n")
        out.flush()
        for line in sys.stdin:
            command = json.loads(line)
            op = command.pop("op")
            try:
                if op == "close":
                    break
                if op == "persist":
                    from distributed import wait

                    x = _array(command["n"], command["chunk"], command["seed"], gpu=not args.cpu)
                    held = client.persist(x)
                    wait(held)
                    answer = {"tasks": len(dask.optimize((held + held.T).sum())[0].__dask_graph__())}
                elif op == "compute":
                    timed = profile.running() if profile is not None and command["profile"] else (
                        contextlib.nullcontext())
                    workers = client.run(_cpu_seconds)
                    if hooks is not None:
                        hooks.on = command["profile"]
                        hooks.computes += command["profile"]
                    with timed:
                        cpu, t = time.process_time(), time.perf_counter()
                        value = client.compute((held + held.T).sum(), sync=True)
                        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
                    if hooks is not None:
                        hooks.on = False
                    workers = sum(client.run(_cpu_seconds).values()) - sum(workers.values())
                    answer = {"seconds": seconds, "value": float(value), "cpu_s": cpu, "workers_cpu_s": workers}
                elif op == "release":
                    held = None
                    answer = {"graphs": _update_graph_metrics(client, command["computes"])}
                elif op == "profile":
                    answer = profile.summary() if profile is not None else {}
                elif op == "hooks":
                    answer = hooks.summary() if hooks is not None else {}
                else:
                    answer = {"error": f"unknown command {op!r}"}
            except Exception as e:  # noqa: BLE001 (said to the parent, which stops)
                answer = {"error": f"{type(e).__name__}: {e}"}
            out.write(json.dumps(answer) + "\n")
            out.flush()
    return 0


@contextlib.contextmanager
def cluster_of(side: str, variant: str, args):
    """(client, what it is) of this side: spillway's local cluster with ``variant``'s
    suspect off, or the bench's baseline on the workers spillway's plan gives."""
    from spillway.options.settings import Options

    keywords = {} if variant == "dashboard" else {"dashboard_address": None}
    if args.cpu:
        keywords.update(cpu=True, n_workers=args.workers)
    if side == "spillway":
        keywords.update(OPTION_VARIANTS.get(variant, {}))
        import spillway

        with spillway.local(**keywords) as cluster, turned_off(variant, cluster):
            cluster.client.as_current().__enter__()
            yield cluster.client, {"cluster": f"spillway.local({', '.join(f'{k}={v!r}' for k, v in keywords.items())})",
                                   "variant": variant}
        return
    from spillway_bench.clusters import baseline_cluster
    from spillway.options.gpus import Inventory, discover
    from spillway.launch.plan import HostProbe, plan

    options = Options.resolve(**keywords)
    launch = plan(options, Inventory() if args.cpu else discover(), HostProbe.here())
    with baseline_cluster(launch, options, {}) as (client, described):
        yield client, {"cluster": described.get("cluster", ""), "variant": variant}


def _cpu_seconds(dask_worker=None) -> float:
    """CPU seconds of this worker's process so far (all its threads)."""
    return time.process_time()


def _update_graph_metrics(client, computes: int) -> dict:
    """The scheduler's own account of its last ``computes`` graphs (its "update-graph"
    events): medians of the seconds from arrival to the tasks made (materialized, ordered,
    tasks and plugins' ``update_graph``), and of the materialization alone."""
    events = [msg for _, msg in client.get_events("scheduler")
              if isinstance(msg, dict) and msg.get("action") == "update-graph" and msg.get("metrics")]
    last = [e["metrics"] for e in events[-computes:]]
    if not last:
        return {}
    return {"duration_s": statistics.median(m["duration_seconds"] for m in last),
            "materialization_s": statistics.median(m["materialization_duration_seconds"] for m in last),
            "tasks": last[-1].get("tasks"), "new_tasks": last[-1].get("new_tasks")}


def _array(n: int, chunk: int, seed: int, gpu: bool = False):
    import dask.array as da

    x = da.random.default_rng(seed).random((n, n), chunks=(chunk, chunk))
    if gpu:
        import cupy

        x = x.map_blocks(cupy.asarray)
    return x


# --- spillway's hooks, timed where they run


class Hooks:
    """CPU seconds of the threads that run them (``time.thread_time``, which a
    neighbour's load hurts far less than wall time) inside each scheduler plugin's
    ``update_graph`` and ``transition``, inside spillway's sizing of each graph and
    inside the graph's materialization with it, over the computes run while ``on``.
    A no-op plugin's hooks are timed the same way: its seconds a call (the timing's own
    cost) are taken off every hook's."""

    NO_OP = "probe-no-op"

    def __init__(self, client):
        import distributed.scheduler as ds
        from distributed.diagnostics.plugin import SchedulerPlugin

        from spillway.memory import capacity

        self.on = False
        self.computes = 0
        self.totals: dict = {}
        scheduler = client.cluster.scheduler
        scheduler.add_plugin(SchedulerPlugin(), name=self.NO_OP)
        for name, plugin in scheduler.plugins.items():
            name = "WorkStealing" if name.startswith("WorkStealing") else name  # named afresh each start
            for hook in ("update_graph", "transition"):
                self._wrap(plugin, hook, f"{name}.{hook}")
        self._wrap(capacity, "graph_bytes", "sizing (graph_bytes)")
        self._wrap(ds, "_materialize_graph", "materialization with the sizing")

    def _wrap(self, owner, attr: str, name: str) -> None:
        inner = getattr(owner, attr)
        totals = self.totals

        def timed(*args, **kwargs):
            if not self.on:
                return inner(*args, **kwargs)
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                entry = totals.setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += time.thread_time() - start

        setattr(owner, attr, timed)

    def summary(self) -> dict:
        n = max(1, self.computes)
        calls, seconds = self.totals.get(f"{self.NO_OP}.transition", [0, 0.0])
        cost = seconds / calls if calls else 0.0
        out = {"computes": self.computes, "timing_us_a_call": round(1e6 * cost, 3)}
        for name, (calls, seconds) in sorted(self.totals.items()):
            if name.startswith(self.NO_OP):
                continue
            out[name] = {"calls": round(calls / n, 1), "ms": round(1e3 * max(0.0, seconds - calls * cost) / n, 3)}
        return out


# --- profiles


class Profile:
    """cProfile over the computes run under it: on this process's main thread (the graph
    built and sent), on the thread of the client's event loop (a local cluster's scheduler
    runs there too), and on the thread that materializes each graph (distributed offloads
    it, with spillway's sizing)."""

    def __init__(self, client):
        import distributed.scheduler as ds

        self.client = client
        self.main = cProfile.Profile()
        self.loop = cProfile.Profile()
        self.offload = cProfile.Profile()
        self.computes = 0
        self._on = False
        inner = ds._materialize_graph

        def materialize(*a, **kw):
            if not self._on:
                return inner(*a, **kw)
            self.offload.enable()
            try:
                return inner(*a, **kw)
            finally:
                self.offload.disable()

        ds._materialize_graph = materialize

    @contextlib.contextmanager
    def running(self):
        self.client.sync(self._loop_enable)
        self._on = True
        self.main.enable()
        try:
            yield
        finally:
            self.main.disable()
            self._on = False
            self.client.sync(self._loop_disable)
            self.computes += 1

    async def _loop_enable(self):
        self.loop.enable()

    async def _loop_disable(self):
        self.loop.disable()

    def summary(self, top: int = 20) -> dict:
        """Per compute: spillway's functions and distributed's graph steps by cumulative
        milliseconds, on each thread."""
        out = {"computes": self.computes}
        n = max(1, self.computes)
        for where, prof in (("loop", self.loop), ("offload", self.offload), ("main", self.main)):
            try:
                stats = pstats.Stats(prof)
            except TypeError:  # nothing ran under it
                out[where] = []
                continue
            rows = []
            for (path, line, name), (cc, nc, tt, ct, callers) in stats.stats.items():
                ours = "/spillway/" in path
                theirs = "distributed" in path and name in STEPS
                if ours or theirs:
                    rows.append({"function": f"{_short(path)}:{line}({name})", "calls": round(nc / n, 1),
                                 "cumulative_ms": round(1e3 * ct / n, 3), "own_ms": round(1e3 * tt / n, 3)})
            rows.sort(key=lambda r: -r["cumulative_ms"])
            out[where] = rows[:top]
        return out


#: distributed's steps of a graph's way, shown beside spillway's functions in a profile
STEPS = ("update_graph", "_materialize_graph", "_create_taskstate_from_graph", "_graph_to_futures", "transitions",
         "_transitions", "order", "convert_legacy_graph", "_generate_taskstates", "_apply_annotations",
         "handle_task_finished", "stimulus_task_finished", "_task_to_msg", "compute")


def _short(path: str) -> str:
    for marker in ("/spillway/", "/distributed/", "/dask/"):
        at = path.rfind(marker)
        if at != -1:
            return path[at + 1:]
    return os.path.basename(path)


# --- the report


def machine(gpu: bool) -> dict:
    """The bench's description of this machine; on CPU named as the other CPU results are
    (``cpu-<cores>core-<vendor>``)."""
    from spillway_bench.report import describe_machine
    from spillway.options.gpus import discover

    described = describe_machine(discover() if gpu else None, "gpu" if gpu else "cpu")
    if not gpu:
        vendor = "amd-epyc" if "EPYC" in described["cpu"] else (described["cpu"].split() or ["cpu"])[0].lower()
        described["name"] = f"cpu-{described['cores']}core-{vendor}"
    return described


def summarize(rows: list[dict]) -> list[dict]:
    """Per variant, size and side: each pairing's figures, and their medians over the
    pairings (the ratio: a side's runs 2..N median over the baseline's of its pairing)."""
    out = {}
    for row in rows:
        for side in row["sides"]:
            key = (row["variant"], row["size"], side)
            entry = out.setdefault(key, {"variant": row["variant"], "size": row["size"], "tasks": row.get("tasks"),
                                         "side": side, **{k: [] for k in FIGURES}})
            got, base = row[side], row["baseline"]
            entry["first"].append(got["first_s"])
            entry["median"].append(got["median_rest_s"])
            entry["ratio"].append(got["median_rest_s"] / base["median_rest_s"])
            entry["cpu"].append(got["cpu_rest_s"])
            entry["workers_cpu"].append(got["workers_cpu_rest_s"])
            entry["graph"].append(got["update_graph"].get("duration_s"))
    for entry in out.values():
        for k in FIGURES:
            known = [v for v in entry[k] if v is not None]
            entry[f"{k}_med"] = statistics.median(known) if known else None
    return list(out.values())


#: what each pairing gives per side and size: first run, runs 2..N's median and its ratio
#: to the baseline's, CPU seconds a compute of this process (client and scheduler) and of
#: the workers, and the scheduler's seconds from a graph's arrival to its tasks made
FIGURES = ("first", "median", "ratio", "cpu", "workers_cpu", "graph")


def _ms(v) -> str:
    return "-" if v is None else f"{1e3 * v:.1f}"


def render_md(result: dict) -> str:
    lines = [f"# User compute overhead: {result['label']}", "",
             f"{result['machine']} ({result['machine_detail'].get('cpu', '')}), {result['when']}; "
             f"`(x + x.T).sum().compute()` on a persisted float64 array, {result['runs']} runs a side, the sides "
             f"alternating run by run, {result['repeats']} fresh pairings per variant, each side in a process of its "
             f"own. spillway: {result['spillway']}"
             + (f" (spillway-before: the same from `{result['before']}`)" if result.get("before") else "")
             + f"; baseline: {result['baseline']}. `{result['command']}`", "",
             "Medians over the pairings, in ms. runs 2-N: the median wall time of runs 2..N; ratio: that over the "
             "baseline's of the same pairing (each pairing's in brackets); CPU: CPU time a compute (runs 2..N) "
             "of the process that holds the client and the scheduler, and of the workers together (less hurt by "
             "a neighbour's load than wall time); graph: the scheduler's time from a compute's graph arriving to "
             "its tasks made (materialization, order, task states, plugins' update_graph).", "",
             "| variant | size:chunk | tasks | side | first | runs 2-N | ratio | CPU client+scheduler | CPU workers | "
             "graph |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in result["summary"]:
        lines.append(f"| {e['variant']} | {e['size']} | {e['tasks']} | {e['side']} | {_ms(e['first_med'])} | "
                     f"{_ms(e['median_med'])} | {e['ratio_med']:.2f}x ({', '.join(f'{r:.2f}' for r in e['ratio'])}) | "
                     f"{_ms(e['cpu_med'])} | {_ms(e['workers_cpu_med'])} | {_ms(e['graph_med'])} |")
    if result.get("hooks"):
        lines += ["", "## spillway's hooks, CPU ms a compute (runs 2-N of the defaults)", "",
                  "Each hook's thread CPU time where it runs (the scheduler's event loop; the sizing and the "
                  "materialization on distributed's offload thread), less the timing's own cost (a no-op "
                  "plugin's hook timed alike); calls a compute in brackets.", ""]
        names = sorted({k for h in result["hooks"].values() for k in h if isinstance(h[k], dict)})
        sides = list(result["hooks"])
        lines += ["| hook | " + " | ".join(sides) + " |", "| --- |" + " --- |" * len(sides)]
        for name in names:
            cells = []
            for side in sides:
                got = result["hooks"][side].get(name)
                cells.append("-" if not got else f"{got['ms']:.3f} ({got['calls']:g})")
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    if result.get("profile"):
        lines += ["", "## Profile (cProfile over runs 2-N of the defaults), ms per compute", "",
                  "Profiled, so inflated; spillway's functions and distributed's graph steps, on the thread of "
                  "the client's and scheduler's event loop (loop), the thread that materializes graphs "
                  "(offload) and the main thread.", ""]
        for name, prof in result["profile"].items():
            lines += [f"### {name}", "", "| thread | function | calls | cumulative | own |",
                      "| --- | --- | --- | --- | --- |"]
            for where in ("loop", "offload", "main"):
                for r in prof.get(where, [])[:12]:
                    lines.append(f"| {where} | `{r['function']}` | {r['calls']} | {r['cumulative_ms']} | "
                                 f"{r['own_ms']} |")
            lines.append("")
    return "\n".join(lines) + "\n"


#: the hooks the figure shows: spillway's, and one of distributed's own plugins beside them
HOOKS_SHOWN = ("sizing (graph_bytes)", "spillway-capacity.update_graph", "spillway-capacity.transition",
               "spillway-collective.transition", "WorkStealing.transition")


def plot(result: dict, path: str) -> None:
    """Per size: each variant's runs 2..N (wall) and CPU of the client and scheduler's
    process per compute, for each side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(e["size"] for e in result["summary"]))
    sides = list(dict.fromkeys(e["side"] for e in result["summary"]))
    hooks = result.get("hooks") or {}
    rows = 3 if hooks else 2
    fig, axes = plt.subplots(rows, len(sizes), figsize=(5.5 * len(sizes), 3.8 * rows), squeeze=False)
    width = 0.8 / len(sides)
    for col, size in enumerate(sizes):
        entries = [e for e in result["summary"] if e["size"] == size]
        variants = list(dict.fromkeys(e["variant"] for e in entries))
        for row, (figure, label) in enumerate((("median_med", "runs 2-N, median wall (ms)"),
                                               ("cpu_med", "CPU of client + scheduler a compute (ms)"))):
            ax = axes[row][col]
            for i, side in enumerate(sides):
                xs = [v + (i - (len(sides) - 1) / 2) * width for v in range(len(variants))]
                ys = [1e3 * next((e[figure] or 0 for e in entries if e["variant"] == v and e["side"] == side), 0)
                      for v in variants]
                ax.bar(xs, ys, width=width, label=side)
                if figure == "median_med" and side != "baseline":
                    for x, v in zip(xs, variants):
                        e = next((e for e in entries if e["variant"] == v and e["side"] == side), None)
                        if e:
                            ax.annotate(f"{e['ratio_med']:.2f}x", (x, 1e3 * e["median_med"]), ha="center",
                                        va="bottom", fontsize=7)
            ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            if row == 0:
                ax.set_title(f"{size} ({entries[0]['tasks']} tasks a compute)", fontsize=9)
            ax.legend(fontsize=7)
    for col, size in enumerate(sizes if hooks else ()):
        ax = axes[2][col]
        measured = {name.rsplit(" ", 1)[0]: h for name, h in hooks.items() if name.endswith(f" {size}")}
        names = [n for n in HOOKS_SHOWN if any(n in h for h in measured.values())]
        width = 0.8 / max(1, len(measured))
        for i, (side, h) in enumerate(measured.items()):
            xs = [v + (i - (len(measured) - 1) / 2) * width for v in range(len(names))]
            ax.bar(xs, [(h.get(n) or {}).get("ms", 0) for n in names], width=width, label=side)
        ax.set_xticks(range(len(names)), [n.replace("spillway-", "").replace(" (graph_bytes)", "") for n in names],
                      rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("thread CPU a compute (ms)", fontsize=8)
        ax.set_title(f"scheduler hooks, {size} (WorkStealing: distributed's own)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"(x + x.T).sum() on a persisted array, {result['label']}: {result['machine']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measured(variant: str, args, sizes, repeat: int, described: dict):
    """(N, chunk, figures, side names) a size: the sides of a pairing alternating run by
    run, or with ``--sequential`` each side started, measured and closed in turn."""
    if not args.sequential:
        with pairing(variant, args) as sides:
            described.update((name, side.described["cluster"]) for name, side in sides.items())
            for n, chunk in sizes:
                figures = measure_size(sides, n, chunk, args.runs, SEED + 100 * repeat + n // chunk)
                yield n, chunk, figures, list(sides)
        return
    names = side_names(args)
    got: dict = {}
    for name in names:
        with pairing(variant, args, only=name) as sides:
            described[name] = sides[name].described["cluster"]
            for n, chunk in sizes:
                got.setdefault((n, chunk), {}).update(
                    measure_size(sides, n, chunk, args.runs, SEED + 100 * repeat + n // chunk))
    for (n, chunk), figures in got.items():
        values = [figures[name]["value"] for name in names]
        figures["values_agree"] = all(abs(v - values[0]) <= 1e-9 * abs(values[0]) for v in values)
        yield n, chunk, figures, names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="CPU workers (the default where no GPU is seen)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sizes", default="2000:500,4000:250,8000:2000", help="N:chunk, comma-separated")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", help="comma-separated (default: all, less the GPU workers' options on CPU)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sequential", action="store_true",
                        help="each side started, measured and closed in turn, not alternating: on GPUs, "
                             "where one side's RMM pool takes the memory another would need")
    parser.add_argument("--hooks", action="store_true",
                        help="a pairing a size more, the CPU time of spillway's hooks measured where they run")
    parser.add_argument("--before", metavar="TREE",
                        help="a checkout of spillway before a change: a third side, its code, in every pairing")
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--render", metavar="JSON", help="write the .md and .png of an earlier run's JSON again")
    parser.add_argument("--serve", choices=("spillway", "baseline"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve, args.variants, args)
    if args.render:
        with open(args.render) as f:
            result = json.load(f)
        stem = args.render.removesuffix(".json")
        with open(stem + ".md", "w") as f:
            f.write(render_md(result))
        plot(result, stem + ".png")
        print(f"wrote {stem}.md, .png")
        return 0
    from spillway.options.gpus import discover

    gpu = not args.cpu and bool(discover().gpus)
    args.cpu = not gpu
    sizes = [tuple(int(p) for p in s.split(":")) for s in args.sizes.split(",")]
    variants = args.variants.split(",") if args.variants else [
        v for v in VARIANTS if not (args.cpu and v in OPTION_VARIANTS)]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    if args.cpu and set(variants) & set(OPTION_VARIANTS):
        parser.error(f"{', '.join(sorted(set(variants) & set(OPTION_VARIANTS)))}: options of GPU workers")
    rows, described = [], {}
    if gpu and not args.sequential:
        print("GPUs: the sides alternate run by run, all started at once; where their pools cannot share the GPUs, "
              "pass --sequential", flush=True)
    started = time.time()
    for repeat in range(args.repeats):
        # the variants' order turns each repeat, so none always follows the same one
        turn = variants[repeat % len(variants):] + variants[:repeat % len(variants)]
        for variant in turn:
            for n, chunk, got, names in measured(variant, args, sizes, repeat, described):
                size = f"{n}:{chunk}"
                tasks = got["spillway"]["update_graph"].get("tasks")
                rows.append({"variant": variant, "repeat": repeat, "size": size, "tasks": tasks,
                             "sides": names, **got})
                base = got["baseline"]["median_rest_s"]
                print(f"{variant:<18} r{repeat} {size:<10} " + " | ".join(
                    f"{name} first {g['first_s']:.3f} s, runs 2-N {g['median_rest_s']:.4f} s "
                    f"({g['median_rest_s'] / base:.2f}x), cpu {_ms(g['cpu_rest_s'])} ms, workers "
                    f"{_ms(g['workers_cpu_rest_s'])} ms, graph {_ms(g['update_graph'].get('duration_s'))} ms"
                    for name, g in got.items() if name != "values_agree")
                    + ("" if got["values_agree"] else " VALUES DIFFER"), flush=True)
    profile = None
    if args.profile:
        profile = {}
        for n, chunk in sizes:
            for only in side_names(args) if args.sequential else [None]:
                with pairing("defaults", args, profile=True, only=only) as sides:
                    measure_size(sides, n, chunk, args.runs, SEED - 1)
                    for name, side in sides.items():
                        profile[f"{name} {n}:{chunk}"] = side.ask("profile")
    hooks = None
    if args.hooks:
        hooks = {}
        for n, chunk in sizes:
            for only in [name for name in side_names(args) if name != "baseline"] if args.sequential else [None]:
                with pairing("defaults", args, hooks=True, only=only) as sides:
                    measure_size(sides, n, chunk, args.runs, SEED - 2)
                    for name, side in sides.items():
                        if name != "baseline":
                            hooks[f"{name} {n}:{chunk}"] = side.ask("hooks")
                            print(f"hooks {name} {n}:{chunk}: {hooks[f'{name} {n}:{chunk}']}", flush=True)
    info = machine(gpu)
    result = {"label": args.label, "machine": info["name"], "machine_detail": info,
              "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "runs": args.runs, "repeats": args.repeats, "workers": args.workers,
              "spillway": described.get("spillway", ""), "baseline": described.get("baseline", ""),
              "before": args.before,
              "seconds": round(time.time() - started, 1),
              "command": " ".join(["python3 benchmarks/" + os.path.basename(sys.argv[0]), *sys.argv[1:]]),
              "rows": rows, "summary": summarize(rows), "profile": profile, "hooks": hooks}
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{info['name']}-{datetime.date.today().isoformat()}-user-overhead-{args.label}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(render_md(result))
    if result["summary"]:
        plot(result, stem + ".png")
    print(render_md(result))
    print(f"wrote {stem}.json, .md" + (", .png" if result["summary"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
