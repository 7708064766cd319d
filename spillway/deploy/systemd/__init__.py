"""The systemd unit of the long-running service (``spillway serve``) and its environment
file, rendered by pure functions.

The cluster settings reach the service as ``DASK_SPILLWAY__<KEY>`` variables in the
environment file, the layer :meth:`spillway.options.settings.Options.resolve` reads anyway, so the
unit itself names no cluster setting. ``spillway.service`` and ``spillway.env`` in this
directory are the renderings with the defaults below.
"""

from .unit import ServiceSettings, environment_file, shipped, unit

__all__ = ["ServiceSettings", "environment_file", "shipped", "unit"]
