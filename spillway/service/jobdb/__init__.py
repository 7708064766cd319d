"""The job database: tenants, jobs and their logs, persisted through SQLAlchemy.

(Called the job database, never a store: "store" is the workers' tiered memory store.)

SQLite in WAL mode (in the service's state directory) is the embedded default; a
``postgresql://`` URL uses PostgreSQL through psycopg 3. Every state change is committed
before it is acted on, so a killed service finds each job where it left it.

Methods return plain dicts (JSON-able) rather than ORM objects, so nothing outside this
package holds a database session. The schema is versioned (:mod:`.schema`): opening an
older database migrates it. :attr:`JobDB.health` is the service's view of whether the
database answers (:mod:`.health`).
"""

from .database import DB_FILE, JobDB, database_url
from .errors import JobDBError, QuotaExceeded
from .health import is_unavailable
from .models import (CLUSTER_JOB_BYTES, DEFAULT_MAX_JOB_BYTES, DEFAULT_MAX_QUEUED, DEFAULT_MAX_RUNNING, FINAL_STATES,
                     STATES)
from .rows import hash_token

__all__ = ["CLUSTER_JOB_BYTES", "DB_FILE", "DEFAULT_MAX_JOB_BYTES", "DEFAULT_MAX_QUEUED", "DEFAULT_MAX_RUNNING", "JobDB",
           "JobDBError", "QuotaExceeded", "STATES", "FINAL_STATES", "hash_token", "database_url", "is_unavailable"]
