"""The job database's one class, :class:`JobDB`: tenants, jobs and their logs through one
SQLAlchemy engine (SQLite in WAL mode in the state directory, or PostgreSQL), its schema
migrated on open."""

from __future__ import annotations

import os

import contextlib
import tempfile
import threading
import uuid
from pathlib import Path
from datetime import datetime

from sqlalchemy import create_engine, event, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession, sessionmaker

from .errors import JobDBError, QuotaExceeded
from .health import DatabaseHealth
from .models import (CLUSTER_JOB_BYTES, DEFAULT_MAX_JOB_BYTES, DEFAULT_MAX_QUEUED, DEFAULT_MAX_RUNNING, FINAL_STATES,
                     STATES, Job, LogLine, Tenant, Token)
from .private import private_database, private_directory
from .rows import _iso, hash_token, job_dict, now, tenant_dict
from .schema import migrate
from .tokens import TokensMixin, new_token

DB_FILE = "spillway.db"


def database_url(state_dir: str | Path | None, db: str | None) -> str:
    """The database URL: ``db`` when given, else SQLite in ``state_dir``."""
    if db:
        if db.startswith(("postgresql://", "postgres://")):
            # psycopg 3 is the driver this package installs; SQLAlchemy defaults to psycopg2
            return "postgresql+psycopg://" + db.split("://", 1)[1]
        return db
    if not state_dir:
        raise JobDBError("state-dir: give a state directory or --db URL")
    path = Path(state_dir).expanduser()
    try:
        private_directory(path)
        # SQLite writes beside its file (the journal): a directory that cannot take a new
        # entry is refused here, in one line, not by the first query
        tempfile.TemporaryFile(dir=path).close()
        private_database(path / DB_FILE)
    except OSError as e:
        raise JobDBError(f"state-dir: cannot write in {str(path)!r} ([Errno {e.errno}] {e.strerror})") from None
    return f"sqlite:///{path / DB_FILE}"


def _engine(url: str, *, pool_size: int = 10, max_overflow: int = 20):
    """An engine on ``url``: SQLite with its pragmas on every connection; a server database
    with a pool of ``pool_size`` (and ``max_overflow`` more) and bounded waits."""
    if url.startswith("sqlite"):
        engine = create_engine(url, future=True, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # bounded waits: a database host that drops packets must not hold a request thread (or
    # the scheduler) for the TCP timeout of minutes
    return create_engine(url, future=True, pool_size=pool_size, max_overflow=max_overflow, pool_pre_ping=True,
                         pool_timeout=10, connect_args={"connect_timeout": 5})


class JobDB(TokensMixin):
    def __init__(self, url: str):
        self.url = url
        self.engine = _engine(url)
        # SQLite takes one writer at a time and makes the others poll with growing sleeps;
        # queueing this process's writers on a lock instead keeps a burst's tail short.
        self._write_lock = threading.Lock() if url.startswith("sqlite") else contextlib.nullcontext()
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.schema_found, self.schema_version = migrate(self.engine)
        self.health = DatabaseHealth(self.counts)
        self._touched: dict[int, float] = {}
        self._tokens_engine_made = None
        self._tokens_engine_lock = threading.Lock()
        #: set by :meth:`close` (the API's token reader stops on seeing it)
        self.closed = False

    @classmethod
    def open(cls, state_dir=None, db=None) -> JobDB:
        return cls(database_url(state_dir, db))

    def close(self):
        self.closed = True
        self.health.stop()
        self.engine.dispose()
        with self._tokens_engine_lock:
            if self._tokens_engine_made is not None:
                self._tokens_engine_made.dispose()

    def _tokens_engine(self):
        """An engine of one connection for :meth:`live_tokens` alone, made at its first
        read: the API's reads of the token table (every second) neither take one of the
        requests' connections nor wait behind them when a burst holds them all."""
        with self._tokens_engine_lock:
            if self._tokens_engine_made is None:
                self._tokens_engine_made = _engine(self.url, pool_size=1, max_overflow=0)
            return self._tokens_engine_made

    def _session(self) -> DbSession:
        return self.sessions()

    # --- tenants

    def add_tenant(self, name: str, *, admin=False, priority=0, max_running=DEFAULT_MAX_RUNNING,
                   max_job_bytes: int | None = DEFAULT_MAX_JOB_BYTES, max_queued: int | None = None,
                   expires: datetime | None = None, data_dirs=None) -> tuple[dict, str]:
        """A new tenant and its bearer token (the only time the token exists in clear).
        ``max_job_bytes`` None: jobs up to the cluster's memory (device + host tier);
        :data:`~.models.CLUSTER_JOB_BYTES`: what the cluster's admission accepts, spill disk
        included. ``max_queued`` None: :data:`~.models.DEFAULT_MAX_QUEUED`. ``expires``:
        when the token stops working (None: never). ``data_dirs``: the directories its jobs
        may read inputs in (None: the service's ``--data-dir``)."""
        name = name.strip()
        if not name or len(name) > 64:
            raise JobDBError(f"name: {name!r} must be 1 to 64 characters")
        if not name.isprintable():
            # an escape sequence in a name would reach the owner's terminal with `tenant list`
            raise JobDBError(f"name: {name!r} holds control characters; use printable text")
        _check_limits(max_running, max_job_bytes, max_queued)
        data_dirs = checked_data_dirs(data_dirs)
        token = new_token()
        with self._session() as s:
            if s.scalar(select(Tenant).where(Tenant.name == name)) is not None:
                raise JobDBError(f"name: tenant {name!r} already exists")
            t = Tenant(name=name, token_hash=hash_token(token), admin=admin, priority=priority,
                       max_running=max_running, max_job_bytes=max_job_bytes, max_queued=max_queued,
                       data_dirs=data_dirs, revoked=False, created=now())
            s.add(t)
            s.flush()
            s.add(Token(tenant_id=t.id, token_hash=t.token_hash, created=t.created, expires=expires))
            s.commit()
            return tenant_dict(t), token

    def set_tenant(self, name: str, **changes) -> dict:
        """Change a tenant's ``priority``, ``max_running``, ``max_queued`` or
        ``max_job_bytes`` (as :meth:`add_tenant` takes them); its tokens and jobs stay.
        Queued jobs keep their place and are not checked again: the limits apply to
        submissions from now on."""
        unknown = set(changes) - {"priority", "max_running", "max_job_bytes", "max_queued", "data_dirs"}
        if unknown:
            raise JobDBError(f"{sorted(unknown)[0]}: not a tenant setting (priority, max_running, max_queued, "
                             "max_job_bytes, data_dirs)")
        if "data_dirs" in changes:
            changes["data_dirs"] = checked_data_dirs(changes["data_dirs"])
        _check_limits(changes.get("max_running", 1), changes.get("max_job_bytes"), changes.get("max_queued"))
        with self._session() as s:
            t = s.scalar(select(Tenant).where(Tenant.name == name))
            if t is None:
                raise JobDBError(f"name: no tenant {name!r}")
            for key, value in changes.items():
                setattr(t, key, value)
            s.commit()
            return tenant_dict(t)

    def tenants(self) -> list[dict]:
        with self._session() as s:
            summaries = self._token_summaries(s)
            none = {"tokens": 0, "expires": None, "last_used": None}
            return [tenant_dict(t) | summaries.get(t.id, none) for t in s.scalars(select(Tenant).order_by(Tenant.id))]

    def revoke_tenant(self, name: str) -> dict:
        with self._session() as s:
            t = s.scalar(select(Tenant).where(Tenant.name == name))
            if t is None:
                raise JobDBError(f"name: no tenant {name!r}")
            t.revoked = True
            # its queued jobs would never start; running ones finish
            for j in s.scalars(select(Job).where(Job.tenant_id == t.id, Job.state == "queued")):
                j.state, j.finished, j.cancel_requested = "cancelled", now(), True
                s.add(LogLine(job_id=j.id, time=now(), line="cancelled: tenant revoked"))
            s.commit()
            return tenant_dict(t)

    def tenant(self, tenant_id: int) -> dict | None:
        """Tenant ``tenant_id`` as it is now (a job's, when it starts: its data directories
        then, not at submission)."""
        with self._session() as s:
            t = s.get(Tenant, tenant_id)
            return None if t is None else tenant_dict(t)

    def tenant_for_token(self, token: str) -> dict | None:
        return self.authenticate(token)[0]

    # --- jobs

    def submit(self, tenant: dict, *, workflow: str, params: dict, verify: bool, priority: int,
               idempotency_key: str | None, footprint_bytes: int, output: bool = False) -> tuple[dict, bool]:
        """The job, and whether it is new (False when the idempotency key names an earlier one)."""
        if idempotency_key is not None:
            found = self._by_key(tenant["id"], idempotency_key)
            if found is not None:
                return found, False
        job_id = uuid.uuid4().hex
        with self._write_lock, self._session() as s:
            self._check_queue_quota(s, tenant)
            s.add(Job(id=job_id, tenant_id=tenant["id"], workflow=workflow, params=params, verify=verify, output=output,
                      priority=priority, idempotency_key=idempotency_key, state="queued",
                      footprint_bytes=footprint_bytes, created=now()))
            s.add(LogLine(job_id=job_id, time=now(), line=f"queued by {tenant['name']}"))
            try:
                s.commit()
            except IntegrityError:
                # a concurrent retry with the same key won the insert
                s.rollback()
                found = self._by_key(tenant["id"], idempotency_key)
                if found is None:
                    raise
                return found, False
        return self.job(job_id), True

    def check_queue_quota(self, tenant: dict, idempotency_key: str | None = None):
        """QuotaExceeded where ``tenant`` has its quota of jobs queued (and ``idempotency_key``,
        if given, names none of its jobs): a refusal before a submission is validated, so a
        flood past its quota costs the service a count each. :meth:`submit` counts again,
        exactly."""
        if idempotency_key is not None and self._by_key(tenant["id"], idempotency_key) is not None:
            return
        with self._session() as s:
            self._check_queue_quota(s, tenant, lock=False)

    def _check_queue_quota(self, s: DbSession, tenant: dict, *, lock: bool = True):
        """QuotaExceeded where ``tenant`` already has its quota of jobs queued. The tenant's
        row is locked first (PostgreSQL; SQLite takes one writer at a time), so concurrent
        submissions of one tenant count one after the other."""
        q = select(Tenant.max_queued).where(Tenant.id == tenant["id"])
        row = s.execute(q.with_for_update() if lock else q).first()
        limit = DEFAULT_MAX_QUEUED if row is None or row[0] is None else row[0]
        queued = s.scalar(select(func.count()).select_from(Job)
                          .where(Job.state == "queued", Job.tenant_id == tenant["id"]))
        if queued >= limit:
            s.rollback()
            raise QuotaExceeded(f"queue quota: tenant {tenant['name']} has {queued} jobs queued, its limit "
                                f"(max-queued {limit}); submit more as they start, or ask the service's owner "
                                f"(spillway tenant set {tenant['name']} --max-queued N)")

    def _by_key(self, tenant_id: int, key: str) -> dict | None:
        with self._session() as s:
            row = s.execute(select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
                            .where(Job.tenant_id == tenant_id, Job.idempotency_key == key)).first()
            return job_dict(*row) if row else None

    def job(self, job_id: str, tenant: dict | None = None) -> dict | None:
        """The job, or None when it does not exist or belongs to another tenant (unless
        ``tenant`` is None or an admin)."""
        with self._session() as s:
            q = select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id).where(Job.id == job_id)
            if tenant is not None and not tenant["admin"]:
                q = q.where(Job.tenant_id == tenant["id"])
            row = s.execute(q).first()
            return job_dict(*row) if row else None

    def report(self, job_id: str) -> dict | None:
        with self._session() as s:
            return s.scalar(select(Job.report).where(Job.id == job_id))

    def jobs(self, tenant: dict | None = None, *, state: str | None = None, limit: int = 100,
             offset: int = 0) -> list[dict]:
        with self._session() as s:
            q = select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
            if tenant is not None and not tenant["admin"]:
                q = q.where(Job.tenant_id == tenant["id"])
            if state is not None:
                q = q.where(Job.state == state)
            q = q.order_by(Job.created.desc(), Job.id).limit(limit).offset(offset)
            return [job_dict(*row) for row in s.execute(q)]

    def request_cancel(self, job_id: str, tenant: dict | None = None) -> dict | None:
        """Cancel a queued job at once; mark a running one for the scheduler to stop.

        Each change is one conditional UPDATE, so it is decided against the job's state at
        that moment: a job that finished meanwhile is answered as finished, never marked
        (and answered) cancel-requested after it ended ``done``."""
        if self.job(job_id, tenant) is None:
            return None
        with self._session() as s:
            if s.execute(update(Job).where(Job.id == job_id, Job.state == "queued")
                         .values(state="cancelled", finished=now(), cancel_requested=True)).rowcount:
                s.add(LogLine(job_id=job_id, time=now(), line="cancelled while queued"))
            elif s.execute(update(Job).where(Job.id == job_id, Job.state == "running",
                                             Job.cancel_requested.is_not(True))
                           .values(cancel_requested=True)).rowcount:
                s.add(LogLine(job_id=job_id, time=now(), line="cancel requested"))
            s.commit()
        return self.job(job_id)

    def logs(self, job_id: str) -> list[dict]:
        with self._session() as s:
            rows = s.scalars(select(LogLine).where(LogLine.job_id == job_id).order_by(LogLine.id))
            return [{"time": _iso(r.time), "line": r.line} for r in rows]

    def log(self, job_id: str, line: str):
        with self._session() as s:
            s.add(LogLine(job_id=job_id, time=now(), line=line))
            s.commit()

    # --- what the job queue's loop needs

    def queued(self, per_tenant: int | None = 1) -> list[dict]:
        """Queued jobs that may start, with their tenant's priority and quota: the first
        ``per_tenant`` of each tenant in the tenant's own order (its higher job priority
        first, then the oldest), or all of them with None; a revoked tenant's and a
        cancelled job's are left out. What the queue's loop reads on every pass: one
        tenant's backlog costs it ``per_tenant`` rows, not the backlog."""
        with self._session() as s:
            live = (select(Job.id).join(Tenant, Job.tenant_id == Tenant.id)
                    .where(Job.state == "queued", Tenant.revoked.is_(False), Job.cancel_requested.is_not(True)))
            if per_tenant is not None:
                rank = func.row_number().over(partition_by=Job.tenant_id,
                                              order_by=(Job.priority.desc(), Job.created, Job.id)).label("rank")
                ranked = live.add_columns(rank).subquery()
                live = select(ranked.c.id).where(ranked.c.rank <= per_tenant)
            q = (select(Job, Tenant).join(Tenant, Job.tenant_id == Tenant.id)
                 .where(Job.id.in_(live)).order_by(Job.created, Job.id))
            out = []
            for j, t in s.execute(q):
                d = job_dict(j, t.name)
                d["tenant_id"] = t.id
                d["tenant_priority"] = t.priority
                d["tenant_max_running"] = t.max_running
                d["tenant_revoked"] = t.revoked
                out.append(d)
            return out

    def running(self) -> list[dict]:
        with self._session() as s:
            q = (select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
                 .where(Job.state == "running"))
            return [job_dict(*row) | {"tenant_id": row[0].tenant_id} for row in s.execute(q)]

    def start(self, job_id: str, line: str) -> bool:
        """queued -> running; False when the job left the queue meanwhile (cancelled)."""
        with self._session() as s:
            n = s.execute(update(Job).where(Job.id == job_id, Job.state == "queued")
                          .values(state="running", started=now(), attempts=Job.attempts + 1,
                                  tasks_done=0, tasks_total=0)).rowcount
            if n:
                s.add(LogLine(job_id=job_id, time=now(), line=line))
            s.commit()
            return bool(n)

    def progress(self, job_id: str, done: int, total: int):
        with self._session() as s:
            s.execute(update(Job).where(Job.id == job_id, Job.state == "running")
                      .values(tasks_done=done, tasks_total=total))
            s.commit()

    def finish(self, job_id: str, state: str, *, line: str, report: dict | None = None,
               error: str | None = None, wall_s: float | None = None, bytes_spilled: int = 0,
               tasks: int | None = None, unless_cancelled: bool = False) -> bool:
        """running -> ``state``; whether the job was changed. With ``unless_cancelled`` a
        job whose cancel was accepted is left running (False), in the same UPDATE that
        would finish it: a cancel answered 200 is never overtaken by ``done``."""
        assert state in FINAL_STATES
        values = dict(state=state, report=report, error=error, wall_s=wall_s, bytes_spilled=bytes_spilled,
                      finished=now())
        if state == "cancelled":  # also a cancel the service took while the database was down
            values["cancel_requested"] = True
        if tasks is not None:
            values.update(tasks_done=tasks, tasks_total=tasks)
        where = [Job.id == job_id, Job.state == "running"]
        if unless_cancelled:
            where.append(Job.cancel_requested.is_not(True))
        with self._session() as s:
            n = s.execute(update(Job).where(*where).values(**values)).rowcount
            if not n:  # ended meanwhile (or, with unless_cancelled, cancelled): nothing to record
                s.rollback()
                return False
            s.add(LogLine(job_id=job_id, time=now(), line=line))
            s.commit()
            return True

    def cancel_requested(self, job_id: str) -> bool:
        with self._session() as s:
            return bool(s.scalar(select(Job.cancel_requested).where(Job.id == job_id)))

    def recover(self) -> list[str]:
        """Put jobs that were running when the service stopped back in the queue (or mark
        them cancelled when a cancel was asked for). Returns their ids."""
        return [job_id for job_id, _ in self.release(None, "service restarted while running",
                                                     cancelled="cancelled (service restarted)")]

    def release(self, job_ids: list[str] | None, why: str, *, cancelled: str | None = None,
                max_attempts: int | None = None) -> list[tuple[str, str]]:
        """Jobs still ``running`` in the database with no runner (all of them with None):
        cancelled where a cancel was asked for, failed after ``max_attempts`` attempts,
        else queued to run again; each with a log line. Returns (id, new state) pairs.

        Decided per job against its state now, so a runner that recorded its end
        meanwhile keeps it."""
        q = select(Job).where(Job.state == "running")
        if job_ids is not None:
            q = q.where(Job.id.in_(job_ids))
        out = []
        with self._write_lock, self._session() as s:
            for j in s.scalars(q).all():
                if j.cancel_requested:
                    j.state, j.finished = "cancelled", now()
                    line = cancelled or f"cancelled ({why})"
                elif max_attempts is not None and j.attempts >= max_attempts:
                    j.state, j.finished = "failed", now()
                    j.error = f"{why}, {j.attempts} times; not run again"
                    line = f"failed: {j.error}"
                else:
                    j.state, j.started, j.tasks_done, j.tasks_total = "queued", None, 0, 0
                    line = f"{why}: queued to run again"
                s.add(LogLine(job_id=j.id, time=now(), line=line))
                out.append((j.id, j.state))
            s.commit()
        return out

    def counts(self) -> dict[str, int]:
        with self._session() as s:
            rows = s.execute(select(Job.state, func.count()).group_by(Job.state)).all()
        out = dict.fromkeys(STATES, 0)
        out.update({state: n for state, n in rows})
        return out

    def spilled_total(self) -> int:
        with self._session() as s:
            return int(s.scalar(select(func.coalesce(func.sum(Job.bytes_spilled), 0))) or 0)


def checked_data_dirs(dirs) -> list[str] | None:
    """A tenant's data directories as stored: each an existing directory, resolved (links
    followed now, once: what the owner named is what the tenant reads); None stays None
    (the service's ``--data-dir``). JobDBError naming the first that is not a directory."""
    if dirs is None:
        return None
    out: list[str] = []
    for d in dirs:
        path = os.path.realpath(os.path.expanduser(str(d)))
        if not os.path.isdir(path):
            raise JobDBError(f"data: {str(d)!r} is not a directory")
        if path not in out:
            out.append(path)
    return out


def tenant_data_dirs(tenant: dict, default) -> tuple[str, ...]:
    """The directories ``tenant`` (a tenant dict) reads inputs in: its own, else ``default``
    (the service's ``--data-dir``)."""
    own = tenant.get("data_dirs")
    return tuple(own) if own is not None else tuple(default)


def _check_limits(max_running: int, max_job_bytes: int | None, max_queued: int | None = None) -> None:
    if max_running < 1:
        raise JobDBError(f"max-running: {max_running} must be >= 1")
    if max_job_bytes is not None and max_job_bytes < 1 and max_job_bytes != CLUSTER_JOB_BYTES:
        raise JobDBError(f"max-job-bytes: {max_job_bytes} must be >= 1 (or unset: the cluster's memory; "
                         f"{CLUSTER_JOB_BYTES}: its admission, spill disk included)")
    if max_queued is not None and max_queued < 1:
        raise JobDBError(f"max-queued: {max_queued} must be >= 1 (or unset: {DEFAULT_MAX_QUEUED})")


def _sqlite_pragmas(dbapi_connection, _record):
    cursor = dbapi_connection.cursor()
    # WAL lets the API read while the job queue's loop writes; NORMAL sync is durable
    # against a killed process (only an OS crash can lose the last commits).
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
