"""Bringing a job database made by an earlier spillway up to the current tables.

``create_all`` adds missing tables but never changes an existing one; the changes it
cannot make are here, each checked against the database first so running them again is
a no-op.

- ``tenants.max_job_bytes`` became nullable (NULL: the tenant may submit what the
  cluster's admission accepts). Databases made before had it NOT NULL with 64 GiB as the
  default. The migration only lifts the constraint: every stored limit stays as it is,
  because a 64 GiB that an owner typed cannot be told from the old default. Tenants still
  at exactly the old default are named by :func:`old_default_tenants` (``spillway serve``
  prints them) and lifted with ``spillway tenant set NAME --max-job-bytes cluster``.
"""

from __future__ import annotations

from sqlalchemy import inspect
from sqlalchemy.schema import CreateIndex, CreateTable

from .models import Tenant

#: the per-job limit a tenant got when none was given, before the cluster's admission was
#: the default
OLD_DEFAULT_MAX_JOB_BYTES = 64 * 2**30


def migrate(engine) -> list[str]:
    """Apply what this database lacks; returns what was done (for the log)."""
    done = []
    columns = {c["name"]: c for c in inspect(engine).get_columns("tenants")}
    if not columns["max_job_bytes"].get("nullable", True):
        _nullable_max_job_bytes(engine)
        done.append("tenants.max_job_bytes: NULL now means the cluster's admission; stored limits kept")
    return done


def _nullable_max_job_bytes(engine) -> None:
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE tenants ALTER COLUMN max_job_bytes DROP NOT NULL")
        return
    # SQLite cannot change a column: the table is rebuilt (SQLite's documented recipe),
    # with foreign keys off so the jobs that name tenants stay as they are. Renaming the
    # old table instead would make SQLite point the jobs' foreign key at the new name.
    table = Tenant.__table__
    names = ", ".join(c.name for c in table.columns)
    create = str(CreateTable(table).compile(dialect=engine.dialect)).strip()
    create = create.replace("CREATE TABLE tenants ", "CREATE TABLE tenants_new ", 1)
    indexes = [str(CreateIndex(i).compile(dialect=engine.dialect)) for i in table.indexes]
    raw = engine.raw_connection()
    try:
        sqlite = raw.driver_connection
        previous = sqlite.isolation_level
        sqlite.isolation_level = None  # statements as written: the PRAGMA must be outside a transaction
        cur = sqlite.cursor()
        cur.execute("PRAGMA foreign_keys=OFF")
        try:
            cur.execute("BEGIN IMMEDIATE")
            cur.execute(create)
            cur.execute(f"INSERT INTO tenants_new ({names}) SELECT {names} FROM tenants")
            cur.execute("DROP TABLE tenants")
            cur.execute("ALTER TABLE tenants_new RENAME TO tenants")
            for statement in indexes:
                cur.execute(statement)
            if cur.execute("PRAGMA foreign_key_check").fetchall():
                raise RuntimeError("jobs name tenants the rebuilt table lacks")
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        finally:
            cur.execute("PRAGMA foreign_keys=ON")
            sqlite.isolation_level = previous
    finally:
        raw.close()


def old_default_tenants(tenants: list[dict]) -> list[str]:
    """Names of active tenants whose limit is exactly the old 64 GiB default."""
    return [t["name"] for t in tenants if t["max_job_bytes"] == OLD_DEFAULT_MAX_JOB_BYTES and not t["revoked"]]
