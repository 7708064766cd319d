"""The ``spillway`` command line.

Each command builds the one :class:`~spillway.options.settings.Options` from its flags (generated
from the options object) and hands it on; errors in options or parameters print one line
and exit with status 2 before anything starts.
"""

from .group import main

__all__ = ["main"]

if __name__ == "__main__":  # pragma: no cover
    main()
