"""`strata serve` over raw HTTP: every refusal is the right 4xx with a JSON body, 32 concurrent
clients get complete, uncrossed answers, disconnects free their slot (queued ones never run),
max_tokens is clamped with a header, and a configuration that cannot run never prints READY."""

from __future__ import annotations

import json
import re
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers.serve_process import (
    API_KEY, MODEL_NAME, ServeProcess, tiny_model, wait_for,
)

AUTH = {"authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def chat(content="Hello", **kw):
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}],
            "max_tokens": 4, "temperature": 0, **kw}


def metric(http, name: str, **labels) -> float:
    text = http.get("/metrics").text
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(f"{name}{{{lab}}}" if lab else name) + r" (\S+)"
    found = re.search("^" + pattern + "$", text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("path, body, status, needle", [
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, "not valid JSON"),
    ("/v1/chat/completions", json.dumps(chat(max_tokens="4")).encode(), 400, "max_tokens"),
    ("/v1/chat/completions", json.dumps(chat(stop=[1, 2])).encode(), 400, "stop"),
    ("/v1/chat/completions", json.dumps({**chat(), "model": "other"}).encode(), 404, "other"),
    ("/v1/chat/completions", json.dumps(chat(content="x" * 70000)).encode(), 413, "limit"),
    ("/v1/completions", json.dumps({"model": MODEL_NAME, "prompt": {"a": 1}}).encode(), 400,
     "prompt"),
    ("/v1/messages", json.dumps({"model": MODEL_NAME, "messages": [
        {"role": "user", "content": "x"}]}).encode(), 400, "max_tokens"),
    ("/v1/messages", json.dumps({"model": MODEL_NAME, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "document", "source": {}}]}]}).encode(), 400,
     "messages[0].content[0]"),
    ("/v1/messages", json.dumps({"model": "nope", "max_tokens": 2, "messages": [
        {"role": "user", "content": "x"}]}).encode(), 404, "nope"),
])
def test_bad_requests_get_a_4xx_json_body(http, path, body, status, needle):
    r = http.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    data = r.json()
    message = data["error"]["message"]
    assert needle in message
    if path.startswith("/v1/messages"):
        assert data["type"] == "error"


def test_missing_or_wrong_auth_is_401(server):
    with httpx.Client(base_url=server.url, timeout=30) as bare:
        for path, body, kind in (("/v1/chat/completions", chat(), "invalid_request_error"),
                                 ("/v1/messages", {}, "authentication_error")):
            r = bare.post(path, json=body)
            assert r.status_code == 401 and r.json()["error"]["type"] == kind
        assert bare.get("/metrics", headers={"x-api-key": "wrong"}).status_code == 401
        assert bare.get("/v1/models", headers={"x-api-key": API_KEY}).status_code == 200
        assert bare.get("/health").json()["status"] == "ok"


def test_max_tokens_is_clamped_with_a_header(http):
    r = http.post("/v1/chat/completions", json=chat(max_tokens=100000))
    assert r.status_code == 200
    n_prompt = r.json()["usage"]["prompt_tokens"]
    assert r.headers["x-strata-max-tokens-clamped-from"] == "100000"
    assert int(r.headers["x-strata-max-tokens"]) == 1024 - n_prompt


def sampled(prompt: str, seed: int, **kw) -> dict:
    """A seeded sampled request: its answer is a function of (prompt, seed) alone."""
    return chat(prompt, max_tokens=6, temperature=1.0, seed=seed, **kw)


def run_client(url: str, prompts: list[str], client_id: int) -> list[tuple[int, str, dict]]:
    out = []
    with httpx.Client(base_url=url, headers=AUTH, timeout=120) as c:
        for k in range(5):
            i = (client_id + k) % len(prompts)
            if (client_id + k) % 2:
                r = c.post("/v1/chat/completions", json=sampled(prompts[i], i, stream=True))
                events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
                assert events[-1] == "[DONE]"
                chunks = [json.loads(e) for e in events[:-1]]
                text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
                out.append((i, text, {"finish": chunks[-1]["choices"][0]["finish_reason"]}))
            else:
                r = c.post("/v1/chat/completions", json=sampled(prompts[i], i))
                assert r.status_code == 200, r.text
                body = r.json()
                out.append((i, body["choices"][0]["message"]["content"],
                            {"finish": body["choices"][0]["finish_reason"]}))
    return out


def test_32_concurrent_clients_get_complete_uncrossed_answers(server, http):
    prompts = [f"Question {i}: what does the {w} do?" for i, w in
               enumerate(["river", "baker", "market", "snow", "valley", "miller", "wool", "oil"])]
    reference = [http.post("/v1/chat/completions", json=sampled(p, i)).json()
                 ["choices"][0]["message"]["content"] for i, p in enumerate(prompts)]
    assert len(set(reference)) == len(prompts)  # all distinct: a crossed answer would show
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda k: run_client(server.url, prompts, k), range(32)))
    answers = [a for client in results for a in client]
    assert len(answers) == 160
    for i, text, info in answers:
        assert text == reference[i], f"prompt {i} got another request's answer"
        assert info["finish"] in ("stop", "length")
    assert metric(http, "strata_active_sequences") == 0
    assert metric(http, "strata_queue_depth") == 0


def open_stream(url: str, max_tokens: int, end_ids=()) -> tuple[httpx.Client, httpx.Response]:
    """A stream of up to `max_tokens`; `end_ids` banned (logit_bias -100), so it cannot end on
    its own: this prompt and seed met an end token after 59 tokens, which a loaded machine
    reached before the test closed the stream."""
    client = httpx.Client(base_url=url, headers=AUTH, timeout=60)
    req = client.build_request("POST", "/v1/chat/completions",
                               json=chat("Tell me a long story", max_tokens=max_tokens,
                                         stream=True, temperature=0.8, seed=7,
                                         logit_bias={str(t): -100 for t in end_ids}))
    resp = client.send(req, stream=True)
    return client, resp


@pytest.fixture(scope="module")
def long_server(tmp_models):
    """A server whose context leaves room for 4,000-token streams: long enough that none can
    finish on its own while the test opens and closes the others, however loaded the machine
    (900 tokens in a 1,024-token context sometimes finished first)."""
    from helpers.serve_process import start_server

    s = start_server(tmp_models, max_context=4096)
    yield s
    s.stop()


def test_disconnect_frees_the_slot_and_queued_cancels_never_run(long_server, tmp_models):
    from strata.gguf import open_model
    from strata.tokenizer import Tokenizer

    server = long_server
    end_ids = Tokenizer.from_metadata(open_model(tiny_model(tmp_models)).metadata).eot_ids
    http = httpx.Client(base_url=server.url, headers=AUTH, timeout=60)
    n_long = 4000
    done_before = metric(http, "strata_completion_tokens_total")
    cancelled_r = metric(http, "strata_requests_cancelled_total", where="running")
    running = [open_stream(server.url, n_long, end_ids) for _ in range(4)]  # every slot busy
    readers = [resp.iter_lines() for _, resp in running]  # kept: a dropped reader closes
    assert all(next(r).startswith("data: ") for r in readers)
    assert wait_for(lambda: metric(http, "strata_active_sequences") == 4)
    # a sequence counts as active before its prefill is done (and counted): the engine thread's
    # next decode step comes after the last one's prefill
    steps = metric(http, "strata_decode_steps_total")
    assert wait_for(lambda: metric(http, "strata_decode_steps_total") > steps)
    queued_client, queued = open_stream(server.url, n_long, end_ids)
    assert wait_for(lambda: metric(http, "strata_queue_depth") == 1)
    prompt_before = metric(http, "strata_prompt_tokens_total")
    cancelled_q = metric(http, "strata_requests_cancelled_total", where="queued")
    queued.close()
    queued_client.close()
    for client, resp in running:
        resp.close()
        client.close()
    assert wait_for(lambda: metric(http, "strata_active_sequences") == 0, timeout=5)
    assert wait_for(lambda: metric(http, "strata_queue_depth") == 0, timeout=5)
    assert metric(http, "strata_requests_cancelled_total", where="running") == cancelled_r + 4
    assert metric(http, "strata_requests_cancelled_total", where="queued") == cancelled_q + 1
    assert metric(http, "strata_prompt_tokens_total") == prompt_before  # never prefilled
    # the four streams stopped long before their 4,000 tokens each
    assert metric(http, "strata_completion_tokens_total") - done_before < 4 * n_long
    assert http.post("/v1/chat/completions", json=chat()).status_code == 200
    http.close()


def test_a_client_that_leaves_a_non_streamed_request_frees_its_slot(server, http):
    before = metric(http, "strata_requests_cancelled_total", where="running")
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(chat("Tell me a long story", max_tokens=900, temperature=0.8,
                           seed=3)).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head + body)
        assert wait_for(lambda: metric(http, "strata_active_sequences") == 1)
    assert wait_for(lambda: metric(http, "strata_requests_cancelled_total", where="running")
                    == before + 1, timeout=5)
    assert metric(http, "strata_active_sequences") == 0


def test_metrics_and_health(http):
    text = http.get("/metrics").text
    assert re.search(r'^strata_requests_total\{route="/v1/chat/completions",status="200"\} \d+$',
                     text, re.M)
    assert re.search(r'^strata_region_bytes\{device="cpu",region="kv \(4 slots\)"\} \d+', text,
                     re.M)
    assert "strata_decode_tokens_per_second" in text and "strata_slots 4" in text
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["slots"] == 4


def test_a_backend_that_cannot_run_never_reports_ready(tmp_models):
    proc = ServeProcess(tmp_models, config={"model": str(tiny_model(tmp_models)),
                                            "backend": "nosuch"}, args=["--port", "0"])
    assert proc.wait_exit() == 1
    out = "\n".join(proc.lines)
    assert "error:" in out and "nosuch" in out
    assert not any(line.startswith("READY") for line in proc.lines)


def test_a_bad_config_file_names_the_knob(tmp_models):
    proc = ServeProcess(tmp_models, config={"model": str(tiny_model(tmp_models)),
                                            "batchsize": 4}, args=[])
    assert proc.wait_exit() == 2  # a bad knob, as a bad flag: a usage error
    assert "unknown knob 'batchsize'" in "\n".join(proc.lines)
