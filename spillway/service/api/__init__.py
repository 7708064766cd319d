"""The HTTP API and web page of the shared service (``spillway serve``)."""

from .app import create_app

__all__ = ["create_app"]
