"""The web page: jobs with state and progress, a job's detail with its report, and the
workflow catalogue.

The page is static HTML and script that call the same JSON API with the tenant's token,
so it has no access the API does not give. The token is taken from the address's
fragment (``/ui#token=...``, never sent to the server or written to its logs) or typed
in, and kept in the browser's session storage.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

PAGE = Path(__file__).with_name("templates") / "index.html"


@functools.cache
def page_and_headers() -> tuple[str, dict[str, str]]:
    """The page and its headers. Its one script and one style are allowed by their digests
    (no ``unsafe-inline``): a field a job's data put in the page that escaped its escaping
    still runs nothing, loads nothing from elsewhere and sends nowhere but this service; the
    page cannot be framed (clickjacking a tenant into cancelling jobs)."""
    text = PAGE.read_text()

    def digests(tag: str) -> str:
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(m.encode()).digest()).decode()}'"
                        for m in re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.S))

    csp = (f"default-src 'none'; script-src {digests('script')}; style-src {digests('style')}; "
           "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return text, {"Cache-Control": "no-store", "Content-Security-Policy": csp, "X-Frame-Options": "DENY",
                  "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}

router = APIRouter(include_in_schema=False)


@router.get("/")
def root():
    return RedirectResponse("/ui")


@router.get("/ui", response_class=HTMLResponse)
def page():
    text, headers = page_and_headers()
    return HTMLResponse(text, headers=headers)
