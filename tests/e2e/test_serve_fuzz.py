"""Fuzz `strata serve` from its own OpenAPI schema (schemathesis): over 1,900 generated requests,
valid and invalid, against a real server process; none may get a 5xx."""

from __future__ import annotations

import pytest

from helpers.serve_process import API_KEY, start_server

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402 - after the importorskip
from hypothesis import strategies as st  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

# (path, method, mode, examples): 5 operations with bodies x 2 modes x 126 -> 1,260 bodies, the
# tokenizer's two, Ollama's three and a new conversation's x 2 modes x 60, plus the GETs, DELETEs
# and item adds (a GET without parameters has no invalid form; an id in the path is generated)
_BODIES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
           "/v1/messages/count_tokens")
_MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
OPERATIONS = [(path, "POST", mode, 126) for path in _BODIES for mode in _MODES] + [
    (path, "POST", mode, 60) for path in ("/tokenize", "/detokenize", "/api/chat",
                                          "/api/generate", "/api/show", "/v1/conversations")
    for mode in _MODES] + [
    (path, "GET", GenerationMode.POSITIVE, 3) for path in (
        "/v1/models", "/health", "/metrics", "/api/tags", "/api/ps", "/api/version")] + [
    (path, method, GenerationMode.POSITIVE, 20) for path, method in (
        ("/v1/models/{model}", "GET"), ("/v1/responses/{response_id}", "GET"),
        ("/v1/responses/{response_id}", "DELETE"), ("/v1/conversations/{conversation_id}", "GET"),
        ("/v1/conversations/{conversation_id}/items", "POST"),
        ("/v1/conversations/{conversation_id}/items/{item_id}", "DELETE"))]
MIN_CASES = 1900
calls: list[tuple[str, int]] = []


@pytest.fixture(scope="module")
def fuzz_server(tmp_models):
    # every generation is capped at 2 tokens: the fuzz is about the HTTP layer, not the model
    s = start_server(tmp_models, max_tokens_limit=2, max_queue=4096)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


def fuzz(operation, mode: GenerationMode, n: int) -> None:
    @given(case=operation.as_strategy(generation_mode=mode), stream=st.booleans())
    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case, stream):
        if stream and isinstance(case.body, dict) and operation.method.upper() == "POST":
            case.body = {**case.body, "stream": True}
        response = case.call(headers={"authorization": f"Bearer {API_KEY}"}, timeout=60)
        calls.append((operation.label, response.status_code))
        assert response.status_code < 500, (
            f"{operation.label} answered {response.status_code} to {case.body!r}: "
            f"{response.text[:500]}")
        content_type = (response.headers.get("content-type") or [""])[0]
        assert content_type.split(";")[0] in (
            "application/json", "text/event-stream", "text/plain", "application/x-ndjson")

    run()


@pytest.mark.parametrize("path, method, mode, n", OPERATIONS,
                         ids=[f"{m} {p} {g.value}" for p, m, g, _ in OPERATIONS])
def test_no_request_gets_a_5xx(api_schema, path, method, mode, n):
    fuzz(api_schema[path][method], mode, n)


def test_the_fuzz_ran_enough_cases(fuzz_server):
    assert len(calls) >= MIN_CASES, f"only {len(calls)} cases ran"
    statuses = {status for _, status in calls}
    assert 200 in statuses and 400 in statuses  # both valid and invalid requests were made
    log = "\n".join(fuzz_server.lines)
    assert "Traceback" not in log and "unhandled error" not in log
