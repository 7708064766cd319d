"""The job queue's loop: starts queued jobs on the cluster, tracks them, stops cancelled ones.

Each job runs :func:`spillway.run.compute.run_workflow` in its own thread with its own Dask
client on the shared scheduler. A client of its own gives each job its own progress
count (the progress plugin follows a client's next graph) and a clean cancel: cancelling
that client's futures stops the job's tasks and releases its memory, touching no other
job.

The job database may go away while jobs run (a PostgreSQL restart): a runner keeps its
result and retries the write of the job's end with backoff until the database answers
(the API refuses requests meanwhile: their tokens cannot be checked). A
reconciler, every few seconds, finds jobs ``running`` in the database that no runner
holds (a runner that died) and requeues them (failed after ``max_attempts``), and ends
cancelled jobs whose run does not stop within ``cancel_grace_s``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable

from spillway.options.errors import ParamError
from spillway.memory.admission import Capacity, admit, cluster_capacity
from spillway.run.progress import client_progress
from spillway.run.compute import run_workflow
from spillway.run.target import target_of
from spillway.workflows.params import Target
from spillway.run.verify import ChildReference
from ..jobdb import JobDB, is_unavailable
from .order import behind_reason, next_job, waiting_reasons

logger = logging.getLogger("spillway.jobs")


@dataclasses.dataclass
class _Running:
    thread: threading.Thread
    job: dict = dataclasses.field(default_factory=dict)
    client: object = None
    cancelled: bool = False
    #: time.monotonic() of the cancel, for the grace after which the job is ended regardless
    cancel_at: float | None = None
    #: the runner has given up on the job (its end is recorded by the reconciler)
    abandoned: bool = False

    def cancel(self):
        if not self.cancelled:
            self.cancelled, self.cancel_at = True, time.monotonic()


def tenant_results_dir(results_dir: str, tenant: str) -> str:
    """``RESULTS_DIR/<tenant>``, made 0700 if missing (the results directory itself 0711: a
    tenant given its own directory by the owner may reach it, none may list the others)."""
    directory = os.path.join(results_dir, tenant_dir_name(tenant))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    return directory


def tenant_dir_name(tenant: str) -> str:
    """A tenant's name as a directory name: itself where it is a plain word, else a digest."""
    import hashlib
    import re

    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", tenant or ""):
        return tenant
    return "tenant-" + hashlib.sha256((tenant or "").encode("utf-8", "surrogatepass")).hexdigest()[:16]


class JobQueue:
    """Runs the queue kept in ``jobdb`` on ``session`` (a :class:`spillway.launch.Session`)."""

    def __init__(self, jobdb: JobDB, session, *, results_dir: str | None = None,
                 input_roots: tuple[str, ...] = (), poll_s: float = 0.25,
                 client_factory: Callable[[], object] | None = None, reconcile_s: float = 5.0,
                 cancel_grace_s: float = 30.0, max_attempts: int = 3, retry_max_s: float = 5.0,
                 reference_processes: int = 1, reference_max_bytes: int | None = None):
        self.jobdb = jobdb
        #: verify jobs' NumPy references are built in child processes, never in this one
        #: (the API's): at most ``reference_processes`` at once, each within ``reference_max_bytes``
        self.reference = ChildReference(reference_processes, reference_max_bytes)
        self.session = session
        self.poll_s = poll_s
        #: how often running jobs without a runner are looked for
        self.reconcile_s = reconcile_s
        #: a cancelled run that has not stopped after this long is ended (its client closed)
        self.cancel_grace_s = cancel_grace_s
        #: runs of a job whose runner vanished before it is failed rather than requeued
        self.max_attempts = max_attempts
        #: longest wait between two tries of a write to an unreachable database
        self.retry_max_s = retry_max_s
        self._last_reconcile = 0.0
        self.client_factory = client_factory or self._new_client
        #: where jobs that ask for an output get their Zarr store (``<job id>.zarr``)
        self.results_dir = results_dir
        #: directories a tenant without data directories of its own may name Zarr inputs in
        #: (``--data-dir``); none means generated inputs only
        self.input_roots = tuple(os.path.realpath(os.path.expanduser(r)) for r in input_roots)
        # the cluster's workers, their memory and their tiers are asked when needed, never
        # kept from the start: workers join and leave (an adaptive or Slurm cluster)
        self._unreachable = False
        self._running: dict[str, _Running] = {}
        #: why each tenant's next job waits, as of the loop's last pass (job id -> words)
        self._waiting: dict[str, str] = {}
        #: each tenant's next job as of the loop's last pass (tenant name -> job id)
        self._heads: dict[str, str] = {}
        #: tenant id -> when (time.monotonic()) its last job started: round robin among tenants
        self._last_started: dict[int, float] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the last target read, kept while the same workers are up (:meth:`target`)
        self._target: Target | None = None

    def _new_client(self):
        from distributed import Client

        options = self.session.options
        return Client(self.session.scheduler_address, security=options.dask_security,
                      set_as_default=False, timeout="30s")

    # --- the cluster now

    def target(self) -> Target:
        """The workflow target of the workers up now (their kind, count and memory each).
        Which workers are up is asked of the scheduler at every call; their limits, a call
        on every worker, only when that set changed: the loop asks each pass (4 a second)
        while jobs wait beside running ones, whose workers it would otherwise interrupt."""
        from spillway.launch import scheduler_workers

        up = tuple(sorted(scheduler_workers(self.session.client)))
        if self._target is None or self._target.workers != up:
            self._target = target_of(self.session)
        return self._target

    def tiers(self) -> Capacity:
        """Device + host tier + disk of the workers up now: what a job is admitted against."""
        return cluster_capacity(self.session.client)

    def worker_memory(self) -> int:
        """Every worker's memory limit, of the workers up now: the room running jobs share
        (a job waits until its footprint fits beside theirs)."""
        target = self.target()
        return target.worker_bytes * target.n_workers

    # --- submission helpers

    def footprint(self, workflow: str, params: dict, *, output: bool = False,
                  tiers: Capacity | None = None, tenant: dict | None = None) -> int:
        """Validate a submission against the workflow on this cluster; the projected
        bytes. Raises :class:`~spillway.options.errors.ParamError` (or AdmissionError) with the bad
        value and the limit, before anything is queued. ``tiers``: the cluster's, where
        the caller asked them already (:meth:`tiers` otherwise).

        No graph is built here: the footprint comes from the parameters (the workflow's
        ``project``), and the job's graph is built once, when it runs, on the workers'
        own chunk backend. ``tenant``: whose data directories the inputs must be in (the
        service's ``--data-dir`` where it has none, or where no tenant is given)."""
        from spillway import workflows
        from spillway.workflows.inputs import RANDOM

        spec = workflows.get(workflow)
        params = dict(params)
        roots = self.roots_of(tenant)
        # before planning, which opens the inputs it names (the pinned ones, no other)
        for p in spec.params:
            value = params.get(p.name)
            if p.default == RANDOM and value not in (None, RANDOM):
                params[p.name] = self._check_input(p.name, value, roots) or value
        tiers = tiers if tiers is not None else self.tiers()
        # NumPy metas: a workflow without ``project`` is built here to be sized, and the
        # service process touches no GPU for it
        sizing = dataclasses.replace(self.target(), chunk_backend="numpy")
        # a size the cluster cannot hold is refused for that, in bytes, before any other
        # check of the parameters (admit: the one decision, here and at run time)
        projected = spec.projected(params, sizing, fits=lambda floor: admit(workflow, floor, tiers))
        if output and not spec.array_result:
            raise ParamError(f"output: {workflow} has no array result to write (its result is a summary)")
        admit(workflow, projected, tiers)
        return int(projected.total_bytes)

    def roots_of(self, tenant: dict | None) -> tuple[str, ...]:
        """The directories ``tenant`` reads inputs in: its own (``spillway tenant add NAME
        --data DIR``), else the service's ``--data-dir``."""
        from ..jobdb.database import tenant_data_dirs

        return tenant_data_dirs(tenant or {}, self.input_roots)

    def _check_input(self, name: str, value, roots: tuple[str, ...]) -> str | None:
        """A tenant reads Zarr inputs only inside its own data directories (``roots``), so
        a job cannot read another tenant's data or results, or any other file the service
        can. The path resolved (links followed) and pinned
        (:mod:`spillway.workflows.zarr.pinned`): what the job reads is the directory that
        was inside when checked, whatever is put at its name later. None for a value that
        is not a path."""
        from spillway.workflows.zarr.pinned import pin_store

        if not isinstance(value, str) or "\x00" in value:
            return None  # not a path at all: the parameter's own check refuses it with its reason
        path = os.path.realpath(os.path.expanduser(value))
        # checked before anything is opened: a path outside says so, whether or not it exists
        self._refuse_outside(name, value, path, roots)
        pinned = pin_store(path, name)
        # the pin walked its own resolution without following links: inside as it is named
        self._refuse_outside(name, value, pinned, roots)
        return pinned

    def _refuse_outside(self, name: str, value: str, path: str, roots: tuple[str, ...]) -> None:
        # the refusal names this tenant's own directories, never another's or the results'
        if not _inside(path, roots) or self._in_results(path):
            where = ", ".join(roots) if roots else "none: generated inputs only"
            raise ParamError(f"{name}: {value!r} is outside this tenant's data directories ({where})")

    def _in_results(self, path: str) -> bool:
        """Whether ``path`` is in the results directory: tenants' outputs are read through
        their jobs' results, never as another job's input, whatever directory a tenant was
        given."""
        if not self.results_dir:
            return False
        results = os.path.realpath(self.results_dir)
        return path == results or path.startswith(results + os.sep)

    def resolved_inputs(self, workflow: str, params: dict, tenant: dict | None = None) -> dict:
        """``params`` with each Zarr input resolved and checked again, when the job starts
        (it was checked at submission, but a link in a data directory may have been swapped
        since, and the tenant's directories may have changed): the path the job reads is
        the resolved one, inside one of ``tenant``'s data directories, and nothing in the
        store may be a link out of them or a file with another link. ParamError otherwise."""
        from spillway import workflows
        from spillway.workflows.inputs import RANDOM

        spec = workflows.get(workflow)
        roots = self.roots_of(tenant)
        out = dict(params)
        for p in spec.params:
            value = params.get(p.name)
            if p.default == RANDOM and value not in (None, RANDOM):
                path = self._check_input(p.name, value, roots)
                if path is not None:
                    self._check_links(p.name, value, path, roots)
                    out[p.name] = path
        return out

    def _check_links(self, name: str, value: str, store: str, roots: tuple[str, ...]) -> None:
        """No entry of the store at ``store`` is a link that leads out of ``roots``, and no
        file in it has a second name (a hard link: the same file may be another tenant's,
        and nothing in the store tells which name is the original)."""
        import stat

        for directory, dirs, files in os.walk(store):
            for entry in dirs + files:
                full = os.path.join(directory, entry)
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    if not _inside(os.path.realpath(full), roots):
                        raise ParamError(f"{name}: {value!r} holds a link out of this tenant's data directories "
                                         f"({os.path.relpath(full, store)})")
                elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    raise ParamError(f"{name}: {value!r} holds a file with {st.st_nlink} hard links "
                                     f"({os.path.relpath(full, store)}); a store's files must have one link each")

    def output_path(self, job_id: str, tenant: str | None = None) -> str:
        """Where job ``job_id`` of ``tenant`` (looked up where not given) writes its store:
        ``RESULTS_DIR/<tenant's directory>/<job id>.zarr``, the tenant's directory made 0700
        (:func:`tenant_results_dir`)."""
        if tenant is None:
            tenant = (self.jobdb.job(job_id) or {}).get("tenant") or ""
        return os.path.join(tenant_results_dir(self.results_dir, tenant), f"{job_id}.zarr")

    def relative_output(self, path: str | None) -> str | None:
        """An output's path as tenants are told it: relative to the results directory
        (``<job id>.zarr``), whatever the report recorded; the server's own paths stay its own."""
        if not path:
            return None
        if self.results_dir and os.path.isabs(path):
            rel = os.path.relpath(path, self.results_dir)
            if not rel.startswith(os.pardir):
                return rel
        return os.path.basename(path.rstrip("/"))

    def _relative_text(self, text: str) -> str:
        """A message with the results directory left out of the paths it names."""
        return text.replace(self.results_dir.rstrip(os.sep) + os.sep, "") if self.results_dir else text

    # --- lifecycle

    def start(self):
        from spillway import workflows
        # load the catalogue here, once: job threads starting together must not each
        # trigger (and race) the registry's first import
        workflows.names()
        requeued = self.jobdb.recover()
        if requeued:
            logger.warning("requeued %d job(s) that were running when the service stopped", len(requeued))
        self.jobdb.health.start()
        self._thread = threading.Thread(target=self._loop, name="spillway-jobs", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10):
        self._stop.set()
        self._wake.set()
        with self._lock:
            running = list(self._running.values())
        for r in running:
            # the jobs stay "running" in the job database and run again on the next start
            try:
                r.client.close()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(timeout)
        for r in running:
            r.thread.join(timeout)
        self.reference.close()
        self.jobdb.health.stop()

    def wake(self):
        self._wake.set()

    def waiting_reason(self, job: dict) -> str | None:
        """Why a queued job has not started (None for a job that is not queued): the
        loop's last word on it, or that the loop has not looked at it yet."""
        if job["state"] != "queued":
            return None
        reason = self._waiting.get(job["id"])
        if reason is not None:
            return reason
        head = self._heads.get(job.get("tenant"))
        if head is not None and head != job["id"]:
            return behind_reason(head)
        return "queued: the job queue looks at it on its next pass"

    def _loop(self):
        while not self._stop.is_set():
            wait = self.poll_s
            try:
                if time.monotonic() - self._last_reconcile >= self.reconcile_s:
                    self.reconcile()
                    self._last_reconcile = time.monotonic()
                self._tick()
            except Exception as e:
                if is_unavailable(e):
                    self.jobdb.health.failed(e)  # logged once per outage, not once per tick
                    wait = max(wait, 1.0)
                else:
                    logger.exception("job queue loop")
            # a burst of submissions wakes the loop once, not once per job
            self._stop.wait(0.05)
            self._wake.wait(wait)
            self._wake.clear()

    # --- cancels and runners that are gone

    def request_cancel(self, job_id: str, tenant: dict) -> dict | None:
        """Act on a cancel of a job this service runs, at once and without the database:
        its tasks are stopped now, and its end is recorded (with retries) by its runner.
        The job as last known, or None when this service does not run it (for ``tenant``)."""
        with self._lock:
            entry = self._running.get(job_id)
        if entry is None or not (tenant.get("admin") or entry.job.get("tenant_id") == tenant["id"]):
            return None
        entry.cancel()
        if entry.client is not None:
            try:
                self._cancel(entry.client)
            except Exception:  # the watcher tries again
                pass
        return {**entry.job, "state": "running", "cancel_requested": True}

    def reconcile(self) -> list[tuple[str, str]]:
        """Jobs ``running`` in the database that no runner of this service holds are
        requeued (or failed, after ``max_attempts``); a cancelled run that has not stopped
        within ``cancel_grace_s`` is ended: its client closed (which releases its tasks'
        memory) and the job recorded cancelled. Returns what changed, (id, state) pairs."""
        changed = []
        now = time.monotonic()
        with self._lock:
            entries = dict(self._running)
        for job_id, entry in entries.items():
            if entry.cancel_at is not None and now - entry.cancel_at > self.cancel_grace_s and not entry.abandoned:
                if entry.client is not None:
                    try:
                        entry.client.close(timeout=5)
                    except Exception:
                        pass
                line = (f"cancelled: the run did not stop within {self.cancel_grace_s:g} s of the cancel; "
                        "its tasks were released and any result it still returns is discarded")
                # raises while the database is down: tried again on the next round
                if self.jobdb.finish(job_id, "cancelled", line=line):
                    changed.append((job_id, "cancelled"))
                entry.abandoned = True
                with self._lock:
                    if self._running.get(job_id) is entry:
                        del self._running[job_id]
            elif not entry.thread.is_alive() and entry.thread.ident is not None:
                with self._lock:  # died without its finally (it always pops itself otherwise)
                    if self._running.get(job_id) is entry:
                        del self._running[job_id]
        with self._lock:
            ours = set(self._running)
        orphans = [j["id"] for j in self.jobdb.running() if j["id"] not in ours]
        if orphans:
            # read after ``ours``: a runner that ends meanwhile has recorded its end first,
            # and release() leaves a job that is no longer running alone
            released = self.jobdb.release(orphans, "its runner ended without recording an end",
                                          max_attempts=self.max_attempts)
            for job_id, state in released:
                logger.warning("job %s was running with no runner: now %s", job_id, state)
            changed += released
        return changed

    def _tick(self):
        while not self._stop.is_set():
            with self._lock:
                ours = set(self._running)
            running = [j for j in self.jobdb.running() if j["id"] in ours]
            queued = self.jobdb.queued()  # each tenant's next job only
            capacity = self._room(queued, running)
            if capacity is None:
                return  # the workers cannot be asked now: what fits is not known, and no job starts beside others
            job = next_job(queued, running, capacity, self._last_started)
            if job is None:
                self._waiting = waiting_reasons(queued, running, capacity, self._last_started)
                self._heads = {j["tenant"]: j["id"] for j in queued}
                return
            if not self.jobdb.start(job["id"], f"started (attempt {job['attempts'] + 1}) on "
                                               f"{self.session.n_workers} {self.session.kind} workers"):
                continue
            self._last_started[job["tenant_id"]] = time.monotonic()
            thread = threading.Thread(target=self._execute, args=(job,), name=f"job-{job['id'][:8]}",
                                      daemon=True)
            with self._lock:
                self._running[job["id"]] = _Running(thread=thread, job=job)
            thread.start()

    def _room(self, queued: list[dict], running: list[dict]) -> int | None:
        """The workers' memory for this pass, asked of the cluster now; 0 where no job
        waits beside running ones (with nothing running, the next job starts whatever
        its size, and the room is not read), None where the cluster does not answer."""
        if not (queued and running):
            return 0
        try:
            capacity = self.worker_memory()
        except Exception as e:  # noqa: BLE001 (the loop goes on; the next pass asks again)
            if not self._unreachable:
                logger.warning("the job queue cannot ask the cluster for its workers' memory: %s", e)
            self._unreachable = True
            return None
        if self._unreachable:
            logger.warning("the job queue reaches the cluster again")
        self._unreachable = False
        return capacity

    # --- one job

    def _execute(self, job: dict):
        job_id = job["id"]
        entry = self._running[job_id]
        try:
            client = self.client_factory()
        except Exception as e:
            self._finish(job_id, "failed", line=f"failed: cannot reach the cluster: {e}",
                         error=f"cannot reach the cluster: {e}")
            return
        entry.client = client
        done = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(job_id, client, entry, done), daemon=True)
        watcher.start()
        try:
            session = dataclasses.replace(self.session, client=client)
            output = self.output_path(job_id, job.get("tenant")) if job["output"] else None
            # inputs are checked again as the job opens them: a path (or a link on it) changed
            # since the submission is resolved now, and the job reads what was checked
            # the tenant's data directories as they are now (the owner may have changed them)
            tenant = self.jobdb.tenant(job["tenant_id"]) if job.get("tenant_id") is not None else None
            params = self.resolved_inputs(job["workflow"], job["params"], tenant)
            report = run_workflow(session, job["workflow"], params, verify=job["verify"], output=output,
                                  verify_with=self.reference)
        except BaseException as e:  # noqa: BLE001 (every outcome is recorded)
            done.set()
            if entry.cancelled or self._stop.is_set():
                if not self._stop.is_set():
                    self._finish(job_id, "cancelled", line="cancelled: tasks stopped and memory released")
            else:
                msg = f"{type(e).__name__}: {e}".strip().splitlines()[0] if str(e) else type(e).__name__
                msg = self._relative_text(msg)
                self._finish(job_id, "failed", line=f"failed: {msg}", error=msg)
        else:
            done.set()
            for worker in report.get("workers_lost") or ():
                self._durably(self.jobdb.log, job_id, lost_line(worker))
            # a cancel accepted while the last tasks finished still ends the job cancelled:
            # the 200 it answered promised that. The job database finishes the job only if no
            # cancel was accepted, in one UPDATE, so a cancel landing after any check made
            # here cannot be overtaken by done.
            finished = False
            if not entry.cancelled:
                verify = report.get("verify")
                if verify and verify.get("ok") is False:
                    msg = (f"verification failed: relative error {verify['rel_error']:.3e} exceeds "
                           f"tolerance {verify['tolerance']:.0e}")
                    finished = self._finish(job_id, "failed", line=f"failed: {msg}", error=msg, report=report,
                                            unless_cancelled=True, entry=entry)
                else:
                    finished = self._finish(job_id, "done", line=f"done in {report['wall_s']:.3f} s "
                                            f"({report['tasks']} tasks)", report=report, unless_cancelled=True,
                                            entry=entry)
            if not finished and not self._stop.is_set() and not entry.abandoned and (
                    entry.cancelled or self._durably(self.jobdb.cancel_requested, job_id)):
                if report.get("output"):
                    from spillway.workflows.outputs import remove_output

                    remove_output(report["output"])
                self._finish(job_id, "cancelled", line="cancelled: the run had finished; its result was discarded")
        finally:
            watcher.join(5)
            try:
                client.close()
            except Exception:
                pass
            with self._lock:
                if self._running.get(job_id) is entry:  # not when the reconciler ended it
                    del self._running[job_id]
            self._wake.set()

    def _finish(self, job_id, state, *, line, error=None, report=None, unless_cancelled=False,
                entry: _Running | None = None) -> bool:
        """Record the job's end (see :meth:`JobDB.finish`), retried while the database is
        unreachable; False where it was not recorded. With ``unless_cancelled``, a cancel
        taken in memory (``entry``) while the write waits for the database also stops it:
        that cancel was answered and must not be overtaken by done either."""
        if self._stop.is_set():
            return False
        give_up = (lambda: entry.cancelled) if unless_cancelled and entry is not None else None
        return bool(self._durably(
            self.jobdb.finish, job_id, state, line=line, error=error, report=report,
            wall_s=report.get("wall_s") if report else None,
            bytes_spilled=int(report.get("bytes_spilled") or 0) if report else 0,
            tasks=report.get("tasks") if report else None, unless_cancelled=unless_cancelled,
            _give_up=give_up))

    def _durably(self, write, *args, _give_up=None, **kwargs):
        """``write(*args, **kwargs)``, tried again with backoff (0.25 s doubling to
        ``retry_max_s``) for as long as the database is unreachable; what the runner holds
        (the report) stays in memory meanwhile. Gives up (None) when the service stops
        (the job is then still running in the database and runs again on the next start)
        or when ``_give_up()`` turns true."""
        delay, tries, since = 0.25, 0, time.monotonic()
        while True:
            try:
                result = write(*args, **kwargs)
            except Exception as e:
                if not is_unavailable(e):
                    raise
                self.jobdb.health.failed(e)
                if tries == 0:
                    logger.warning("%s of job %s: the job database is unreachable; retrying until it answers",
                                   getattr(write, "__name__", "write"), args[0] if args else "?")
                tries += 1
                if self._stop.wait(delay) or (_give_up is not None and _give_up()):
                    return None
                delay = min(delay * 2, self.retry_max_s)
                continue
            if tries:
                logger.warning("%s of job %s recorded after %d tries (%.1f s)", getattr(write, "__name__", "write"),
                               args[0] if args else "?", tries + 1, time.monotonic() - since)
            return result

    def _watch(self, job_id: str, client, entry: _Running, done: threading.Event):
        """Copy the job's progress to the job database and act on a cancel request."""
        while not done.wait(0.5):
            try:
                # asked again each time: a cancel that lands before the job's graph
                # reaches the scheduler must still catch its futures
                if entry.cancelled or self.jobdb.cancel_requested(job_id):
                    entry.cancel()
                    self._cancel(client)
                counts = client.run_on_scheduler(client_progress, client.id)
                if counts:
                    self.jobdb.progress(job_id, counts.get("done", 0), counts.get("total", 0))
            except Exception:
                if done.is_set():
                    return
                time.sleep(0.5)

    @staticmethod
    def _cancel(client):
        from distributed import Future

        futures = [Future(key, client) for key in list(client.futures)]
        if futures:
            # not force: identical jobs share task keys, and another tenant's job that
            # wants the same results must keep them
            client.cancel(futures)


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def lost_line(worker) -> str:
    """The job log's line for a worker lost during a run that still completed."""
    if isinstance(worker, str):  # reports written before the reason was kept
        return f"worker {worker} was lost during the run; Dask recomputed its part"
    why = f" ({worker['reason']})" if worker.get("reason") else ""
    pid = f" (pid {worker['pid']})" if worker.get("pid") else ""
    # a worker that held or ran anything of the run fails it (WorkerLost): this one did not
    return f"worker {worker['address']}{pid} was lost during the run{why}; it held nothing of this run"
