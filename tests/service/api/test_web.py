"""The web page in headless Chromium (Debian's): jobs with state and progress, a job's
detail with its report, the catalogue; checked in the rendered DOM and a screenshot."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image
from serve_helpers import Server, add_tenant, wait_state

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/setup.d/chromium.sh)")

HEADER = (0x17, 0x32, 0x4D)
DONE_BADGE = (0x1F, 0x8F, 0x3A)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("web") / "state")}
    token = add_tenant(state, "carol")
    other = add_tenant(state, "dave")
    server = Server(state, "--cpu", "--n-workers", "1").start()
    try:
        yield server, token, other
    finally:
        server.stop()


def chromium(*args: str, tmp_path) -> str:
    out = subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
         "--virtual-time-budget=15000", "--window-size=1280,900", *args],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def near(pixels, colour, tol=12):
    """Which pixels are within ``tol`` of ``colour`` in every channel."""
    return (np.abs(pixels - np.array(colour)) <= tol).all(axis=-1)


def test_page_shows_jobs_detail_and_catalogue(service, tmp_path):
    server, token, other = service
    with server.client(token) as c:
        job = c.post("/jobs", json={"workflow": "transpose-sum",
                                    "params": {"size": "200x200", "chunks": "100x100"}}).json()
        wait_state(c, job["id"], "done")
    with server.client(other) as c:
        hidden = c.post("/jobs", json={"workflow": "transpose-sum",
                                       "params": {"size": "200x200", "chunks": "50x50"}}).json()

    dom = chromium("--dump-dom", f"{server.url}/ui?job={job['id']}#token={token}", tmp_path=tmp_path)
    assert 'data-loaded="true"' in dom
    assert f'data-job="{job["id"]}"' in dom
    assert hidden["id"] not in dom  # another tenant's job is not on carol's page
    assert 'class="state state-done"' in dom
    assert 'id="result-summary"' in dom and '"sum"' in dom and '"workflow": "transpose-sum"' in dom
    assert "<h3>transpose-sum</h3>" in dom and "<code>chunks</code>" in dom

    shot = tmp_path / "page.png"
    # kept for people to look at when the test fails
    print(f"screenshot: {shot}")
    chromium(f"--screenshot={shot}", f"{server.url}/ui#token={token}", tmp_path=tmp_path)
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 900)
    pixels = np.asarray(image).astype(int)
    assert near(pixels[5], HEADER).sum() > 640, "the header bar is not drawn"
    badges = int(near(pixels, DONE_BADGE).sum())
    assert badges > 200, f"no green 'done' badge in the screenshot ({badges} pixels)"

    # without a token the page asks for one and shows no job
    dom = chromium("--dump-dom", f"{server.url}/ui", tmp_path=tmp_path)
    assert 'id="login" style="display: block;"' in dom and job["id"] not in dom
