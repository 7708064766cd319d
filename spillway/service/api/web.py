"""The web page: jobs with state and progress, a job's detail with its report, and the
workflow catalogue.

The page is static HTML and script that call the same JSON API with the tenant's token,
so it has no access the API does not give. The token is taken from the address's
fragment (``/ui#token=...``, never sent to the server or written to its logs) or typed
in, and kept in the browser's session storage.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

PAGE = Path(__file__).with_name("templates") / "index.html"

router = APIRouter(include_in_schema=False)


@router.get("/")
def root():
    return RedirectResponse("/ui")


@router.get("/ui", response_class=HTMLResponse)
def page():
    return HTMLResponse(PAGE.read_text(), headers={"Cache-Control": "no-store"})
