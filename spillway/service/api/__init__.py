"""The HTTP API and web page of the shared service (``spillway serve``).

``create_app`` is loaded when first used, so the flags' declarations (:mod:`.settings`)
are read without loading the web framework.
"""


def __getattr__(name):
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["create_app"]
