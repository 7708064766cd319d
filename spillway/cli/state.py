"""The service's state directory (its SQLite job database, the owner's scheduler file) as
``serve`` and the ``tenant`` commands take it: the flags, and which directory a command
uses, named on stderr.

A tenant command makes no state by surprise: ``tenant list`` with no ``--state-dir`` made
an empty database at the default place, and a service served from another directory then
showed an empty table. Only ``serve``, and ``tenant add`` where the directory is named (or
told ``--create``), make one."""

from __future__ import annotations

import os
from pathlib import Path

import click

from spillway.options.errors import OptionsError

DEFAULT_STATE_DIR = os.path.join(os.environ.get("XDG_STATE_HOME", "~/.local/state"), "spillway")

state_options = [
    click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, envvar="SPILLWAY_STATE_DIR",
                 help="Directory for the embedded SQLite database and the owner's scheduler file."),
    click.option("--db", default=None, envvar="SPILLWAY_DB", metavar="URL",
                 help="Database URL instead of SQLite in --state-dir (postgresql://user@host/db)."),
]


def with_state(func):
    for option in reversed(state_options):
        func = option(func)
    return func


def open_jobdb(state_dir, db):
    from spillway.service.jobdb import JobDB

    return JobDB.open(state_dir, db)


def state_source() -> str:
    """Where this command's ``--state-dir`` came from: the flag, the environment or the
    default."""
    from click.core import ParameterSource

    source = click.get_current_context().get_parameter_source("state_dir")
    if source is ParameterSource.COMMANDLINE:
        return "--state-dir"
    if source is ParameterSource.ENVIRONMENT:
        return "SPILLWAY_STATE_DIR"
    return "the default"


def open_tenants(state_dir, db, *, create: bool = False):
    """The job database a tenant command acts on. Without ``--db``, a state directory with
    no database is refused in one line and nothing is made, unless ``create``."""
    if not db:
        from spillway.service.jobdb import DB_FILE

        path = Path(state_dir).expanduser()
        if not (path / DB_FILE).is_file() and not create:
            source = state_source()
            if source == "the default":
                raise OptionsError(f"state-dir: no service state at {str(path)!r} (the default: no --state-dir or "
                                   "SPILLWAY_STATE_DIR given); pass the --state-dir `spillway serve` uses, or "
                                   "`spillway tenant add NAME --create` to start one there")
            raise OptionsError(f"state-dir: no service state at {str(path)!r} (from {source}): no {DB_FILE} there; "
                               "pass the --state-dir `spillway serve` uses, or `spillway tenant add NAME` to "
                               "start one there")
    return open_jobdb(state_dir, db)


def say_state(state_dir, db) -> None:
    """Name on stderr the state this command used (the database, where ``--db`` gives one),
    so that a table or a token is never read against another service's state."""
    click.echo(f"spillway: {state_text(state_dir, db)}", err=True)


def state_text(state_dir, db) -> str:
    if db:
        from sqlalchemy.engine import make_url

        try:
            shown = make_url(db).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 (a URL SQLAlchemy cannot read was refused by the open)
            shown = "(unreadable URL)"
        return f"database {shown}"
    return f"state directory {Path(state_dir).expanduser()} ({state_source()})"
