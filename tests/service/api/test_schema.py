"""Schemathesis against the served OpenAPI spec: valid and invalid requests to every
operation; no 5xx, responses match the spec, and a 422 names the field at fault."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, errors, given, settings
from schemathesis import GenerationMode
from serve_helpers import Server, add_tenant, jobs_json

EXAMPLES = 25


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("schema") / "state")}
    token = add_tenant(state, "fuzz", "--max-running", "1", "--max-job-bytes", "100MB")
    admin = add_tenant(state, "root", "--admin")
    # the spec's every answer, guessed tokens' 429 included; the limit high enough that the
    # fixture's own admin requests from the same address still get in
    server = Server(state, "--cpu", "--n-workers", "1", "--max-auth-failures", "1000000").start()
    try:
        yield server, token, admin
    finally:
        with server.client(admin) as root:
            for job in jobs_json(root, state="queued"):
                root.post(f"/jobs/{job['id']}/cancel")
        server.stop()


@pytest.mark.slow
def test_api_against_its_openapi_spec(service):
    server, token, _ = service
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    headers = {"Authorization": f"Bearer {token}"}
    failures, exercised = [], []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def check(case):
                # A negative case may be invalid only by its missing Authorization header:
                # adding the token would make it valid, so it goes without and must get 401.
                auth = headers if mode is GenerationMode.POSITIVE or "Authorization" in (case.headers or {}) else None
                try:
                    # Parameters are validated by the workflow, not the spec (whose params
                    # object is open), so schema-valid bodies may still get a 422.
                    response = case.call_and_validate(
                        headers=auth, excluded_checks=[schemathesis.checks.positive_data_acceptance])
                except Exception as e:  # noqa: BLE001 (collected and reported together)
                    failures.append(f"{operation.method.upper()} {operation.path} [{mode.value}]: {e}")
                    return
                assert response.status_code < 500
                if response.status_code == 422:
                    for item in response.json()["detail"]:
                        # the field, or ["body"] when the body itself is not an object
                        if not (item["loc"] and item["loc"][0] in ("body", "query", "path", "header")
                                and (len(item["loc"]) >= 2 or item["loc"] == ["body"]) and item["msg"]):
                            failures.append(f"{operation.path}: 422 without a field: {item}")
                exercised.append(response.status_code)

            try:
                check()
            except errors.Unsatisfiable:
                pass  # no invalid request exists for an operation without inputs
    assert not failures, "\n\n".join(failures[:5])
    assert len(exercised) > 100 and 200 in exercised and 422 in exercised and 404 in exercised
