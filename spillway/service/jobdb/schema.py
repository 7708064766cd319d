"""The job database's schema version and the steps that bring an older database to it.

Version 1 is the tables as first released (no version row: a database with tables and no
``spillway_schema`` row is version 1). Each later version is one step below, run once,
in the same transaction as the version row's update, so a database opened by two
processes at once (``spillway serve`` and ``spillway tenant``) migrates once. New tables
come from ``create_all``; a step adds what ``create_all`` does not (columns, data).
"""

from __future__ import annotations

from sqlalchemy import Connection, exists, insert, inspect, select, update

from .models import Base, SchemaVersion, Tenant, Token

SCHEMA_VERSION = 2
#: any constant: serialises migrations of one PostgreSQL database
_PG_LOCK = 0x5B111A7


def _v2_tokens(conn: Connection):
    """Tokens move to their own table (several per tenant, expiry, last use): each
    tenant's token becomes its first row, without expiry."""
    conn.execute(insert(Token).from_select(
        ["tenant_id", "token_hash", "created"],
        select(Tenant.id, Tenant.token_hash, Tenant.created)
        .where(~exists().where(Token.tenant_id == Tenant.id))))


STEPS = {2: _v2_tokens}


def add_column(conn: Connection, model, name: str):
    """``ALTER TABLE ... ADD COLUMN`` for a nullable column of ``model`` that an older
    database lacks (for steps; no-op where it exists)."""
    table = model.__table__
    if name in {c["name"] for c in inspect(conn).get_columns(table.name)}:
        return
    column = table.c[name]
    conn.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN {name} {column.type.compile(conn.dialect)}')


def migrate(engine) -> tuple[int, int]:
    """Create what is missing and run the steps from the database's version to
    :data:`SCHEMA_VERSION`; returns (version found, version now)."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK})")
        existing = inspect(conn).has_table(Tenant.__tablename__)
        Base.metadata.create_all(conn)
        found = conn.scalar(select(SchemaVersion.version).where(SchemaVersion.id == 1))
        version = found if found is not None else (1 if existing else SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            from . import JobDBError

            raise JobDBError(f"job database: schema version {version} is newer than this spillway's "
                             f"({SCHEMA_VERSION}); upgrade spillway to open it")
        for step in range(version + 1, SCHEMA_VERSION + 1):
            STEPS[step](conn)
        if found is None:
            conn.execute(insert(SchemaVersion).values(id=1, version=SCHEMA_VERSION))
        elif found != SCHEMA_VERSION:
            conn.execute(update(SchemaVersion).where(SchemaVersion.id == 1).values(version=SCHEMA_VERSION))
    return version, SCHEMA_VERSION
