"""The job database's schema version and the steps that bring an older database to it.

Version 1 is the tables as first released (no version row: a database with tables and no
``spillway_schema`` row is version 1). Each later version is one step below, run once,
in the same transaction as the version row's update, so a database opened by two
processes at once (``spillway serve`` and ``spillway tenant``) migrates once. New tables
come from ``create_all``; a step adds what ``create_all`` does not (columns, data,
constraints).

- 2: tokens in their own table (several per tenant, expiry, revocation, last use).
- 3: ``tenants.max_job_bytes`` nullable (NULL: the tenant may submit what the serving
  cluster's admission accepts, the default since). Databases made before had it NOT NULL
  with 64 GiB as the default. The step only lifts the constraint: every stored limit stays
  as it is, because a 64 GiB that an owner typed cannot be told from the old default.
  Tenants still at exactly the old default are named by :func:`old_default_tenants`
  (``spillway serve`` prints them) and lifted with ``spillway tenant set NAME
  --max-job-bytes cluster``.
- 4: per-tenant queue quota ``tenants.max_queued`` (NULL: the default, 100), an index on
  ``jobs (state, tenant_id)`` for it and for the queue's per-tenant heads; and a tenant's
  NULL ``max_job_bytes`` now means the cluster's memory (device + host tier), not its
  spill disk too (issue 45): ``cluster`` is stored as -1. The tenants whose NULL changed
  meaning are logged when the step runs; ``spillway tenant set NAME --max-job-bytes
  cluster`` gives one back the disk.
- 5: per-tenant data directories ``tenants.data_dirs`` (NULL: the service's ``--data-dir``,
  what every tenant read before).

Each step checks the database before it changes it, so a database that already has what a
step brings passes through it unchanged: one made by a spillway that lifted the NOT NULL
before schema versions existed has no version row (version 1) and a nullable column.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, exists, insert, inspect, select, update
from sqlalchemy.schema import CreateIndex, CreateTable

from .models import Base, Job, SchemaVersion, Tenant, Token

logger = logging.getLogger("spillway.jobdb")

SCHEMA_VERSION = 5
#: any constant: serialises migrations of one PostgreSQL database
_PG_LOCK = 0x5B111A7


def _v2_tokens(conn: Connection):
    """Tokens move to their own table (several per tenant, expiry, last use): each
    tenant's token becomes its first row, without expiry."""
    conn.execute(insert(Token).from_select(
        ["tenant_id", "token_hash", "created"],
        select(Tenant.id, Tenant.token_hash, Tenant.created)
        .where(~exists().where(Token.tenant_id == Tenant.id))))


def _v3_nullable_max_job_bytes(conn: Connection):
    """``tenants.max_job_bytes`` loses its NOT NULL (a tenant without a limit may submit
    what the cluster admits); the stored limits stay."""
    columns = {c["name"]: c for c in inspect(conn).get_columns(Tenant.__tablename__)}
    if columns["max_job_bytes"].get("nullable", True):
        return
    if conn.dialect.name != "sqlite":
        conn.exec_driver_sql("ALTER TABLE tenants ALTER COLUMN max_job_bytes DROP NOT NULL")
        return
    # SQLite cannot change a column: the table is rebuilt (SQLite's documented recipe; the
    # connection's foreign keys are off, see migrate), so the jobs and tokens that name
    # tenants stay as they are. Renaming the old table instead would make SQLite point
    # their foreign keys at the new name.
    table = Tenant.__table__
    # the columns the old table has (a later step adds the others, which the new one has)
    names = ", ".join(c.name for c in table.columns if c.name in columns)
    create = str(CreateTable(table).compile(dialect=conn.dialect)).strip()
    create = create.replace("CREATE TABLE tenants ", "CREATE TABLE tenants_new ", 1)
    conn.exec_driver_sql(create)
    conn.exec_driver_sql(f"INSERT INTO tenants_new ({names}) SELECT {names} FROM tenants")
    conn.exec_driver_sql("DROP TABLE tenants")
    conn.exec_driver_sql("ALTER TABLE tenants_new RENAME TO tenants")
    for index in table.indexes:
        conn.exec_driver_sql(str(CreateIndex(index).compile(dialect=conn.dialect)))
    if conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall():
        raise RuntimeError("job database: rows name tenants the rebuilt tenants table lacks")


def _v4_quotas(conn: Connection):
    """The queue quota's column and the index of a tenant's queued jobs; the tenants whose
    unset per-job limit now means the cluster's memory rather than its disk too."""
    add_column(conn, Tenant, "max_queued")
    add_index(conn, Job, "ix_jobs_state_tenant")
    names = conn.scalars(select(Tenant.name).where(Tenant.max_job_bytes.is_(None), Tenant.revoked.is_(False))).all()
    if names:
        logger.warning("job database schema 4: tenant(s) %s without a per-job limit may now submit jobs up to "
                       "the cluster's memory (device + host tier), no longer its spill disk too; "
                       "`spillway tenant set NAME --max-job-bytes cluster` gives one the disk back",
                       ", ".join(names))


def _v5_data_dirs(conn: Connection):
    """Each tenant's own data directories; none yet, so every tenant keeps the service's."""
    add_column(conn, Tenant, "data_dirs")


STEPS = {2: _v2_tokens, 3: _v3_nullable_max_job_bytes, 4: _v4_quotas, 5: _v5_data_dirs}

#: the per-job limit a tenant got when none was given, before the cluster's admission was
#: the default (schema version 3)
OLD_DEFAULT_MAX_JOB_BYTES = 64 * 2**30


def old_default_tenants(tenants: list[dict]) -> list[str]:
    """Names of active tenants whose limit is exactly the old 64 GiB default."""
    return [t["name"] for t in tenants if t["max_job_bytes"] == OLD_DEFAULT_MAX_JOB_BYTES and not t["revoked"]]


def add_column(conn: Connection, model, name: str):
    """``ALTER TABLE ... ADD COLUMN`` for a nullable column of ``model`` that an older
    database lacks (for steps; no-op where it exists)."""
    table = model.__table__
    if name in {c["name"] for c in inspect(conn).get_columns(table.name)}:
        return
    column = table.c[name]
    assert column.nullable, f"{table.name}.{name}: a step adds nullable columns only"
    conn.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN {name} {column.type.compile(conn.dialect)}')


def add_index(conn: Connection, model, name: str):
    """``CREATE INDEX`` for an index of ``model`` that an older database lacks (no-op where
    it exists: ``create_all`` makes the indexes of new tables only)."""
    table = model.__table__
    if name in {i["name"] for i in inspect(conn).get_indexes(table.name)}:
        return
    index = next(i for i in table.indexes if i.name == name)
    conn.exec_driver_sql(str(CreateIndex(index).compile(dialect=conn.dialect)))


def migrate(engine) -> tuple[int, int]:
    """Create what is missing and run the steps from the database's version to
    :data:`SCHEMA_VERSION`; returns (version found, version now)."""
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK})")
            return _migrate(conn)
    # SQLite: one explicit write transaction (the Python driver would otherwise run the
    # DDL outside any), which also makes a second process opening the database wait for
    # this one's migration. Foreign keys are off for step 3's table rebuild: the PRAGMA is
    # ignored inside a transaction, so it comes first, and they are on again before the
    # connection goes back to the pool (or it is dropped).
    conn = engine.connect()
    try:
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
        conn.commit()
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            versions = _migrate(conn)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        return versions
    finally:
        try:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.commit()
        except Exception:
            conn.invalidate()
        conn.close()


def _migrate(conn: Connection) -> tuple[int, int]:
    existing = inspect(conn).has_table(Tenant.__tablename__)
    Base.metadata.create_all(conn)
    found = conn.scalar(select(SchemaVersion.version).where(SchemaVersion.id == 1))
    version = found if found is not None else (1 if existing else SCHEMA_VERSION)
    if version > SCHEMA_VERSION:
        from .errors import JobDBError

        raise JobDBError(f"job database: schema version {version} is newer than this spillway's "
                         f"({SCHEMA_VERSION}); upgrade spillway to open it")
    for step in range(version + 1, SCHEMA_VERSION + 1):
        STEPS[step](conn)
    if found is None:
        conn.execute(insert(SchemaVersion).values(id=1, version=SCHEMA_VERSION))
    elif found != SCHEMA_VERSION:
        conn.execute(update(SchemaVersion).where(SchemaVersion.id == 1).values(version=SCHEMA_VERSION))
    return version, SCHEMA_VERSION
