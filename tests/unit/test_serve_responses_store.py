"""Stored responses (`strata.serve.response_store`): `previous_response_id` continues a
conversation from the store (text and tool turns, streamed or not), `GET` / `DELETE
/v1/responses/{id}`, `store: false`, and the store's byte bound (least recently used leave
first; a chain missing a turn is a 404 naming it)."""

from __future__ import annotations

import json

import pytest

from test_serve_app import Harness, sse_events
from test_serve_responses import ASK, TOOLS, _post, body

from strata.serve.response_store import ResponseStore, listed


@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def test_a_conversation_continues_from_the_store(h):
    first = _post(h, instructions="be brief", input="hello")
    assert first["store"] is True and first["previous_response_id"] is None
    second = _post(h, previous_response_id=first["id"], input="and then?")
    assert second["previous_response_id"] == first["id"]
    rendered = h.model.rendered[-1]
    # the earlier turn and its answer before the new input; its instructions not carried over
    assert "<user>hello<assistant>Hi there!" in rendered and "<user>and then?" in rendered
    assert "be brief" not in rendered
    third = _post(h, previous_response_id=second["id"], input="last", instructions="new rule")
    rendered = h.model.rendered[-1]
    assert rendered.index("<system>new rule") < rendered.index("<user>hello")
    assert rendered.count("<assistant>Hi there!") == 2 and third["status"] == "completed"


def test_a_tool_turn_continues_with_its_output_only(h):
    first = _post(h, input=ASK, tools=TOOLS)
    call = first["output"][1]
    assert call["type"] == "function_call"
    r = _post(h, previous_response_id=first["id"], tools=TOOLS, input=[
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}])
    assert r["output"][0]["content"][0]["text"] == "Hi there!"
    assert (f"<user>{ASK}<assistant>Checking.<tool_call>get_weather</tool_call><tool>sunny"
            in h.model.rendered[-1])


def test_stored_responses_are_read_back_and_deleted(h):
    r = _post(h, input="hello")
    got = h.client.get(f"/v1/responses/{r['id']}")
    assert got.status_code == 200 and got.json() == r
    gone = h.client.delete(f"/v1/responses/{r['id']}")
    assert gone.json() == {"id": r["id"], "object": "response.deleted", "deleted": True}
    for resp in (h.client.get(f"/v1/responses/{r['id']}"),
                 h.client.delete(f"/v1/responses/{r['id']}")):
        assert resp.status_code == 404 and r["id"] in resp.json()["error"]["message"]
    cont = h.client.post("/v1/responses", json=body(previous_response_id=r["id"]))
    assert cont.status_code == 404
    assert cont.json()["error"]["param"] == "previous_response_id"
    assert h.client.post(f"/v1/responses/{r['id']}", json={}).status_code == 405


def test_store_false_keeps_nothing(h):
    r = _post(h, input="hello", store=False)
    assert r["store"] is False
    assert h.client.get(f"/v1/responses/{r['id']}").status_code == 404


def test_a_streamed_response_is_stored_as_its_last_event_has_it(h):
    r = h.client.post("/v1/responses", json=body(stream=True, input=ASK, tools=TOOLS))
    last = json.loads(sse_events(r.text)[-1][1])
    assert last["type"] == "response.completed"
    stored = h.client.get(f"/v1/responses/{last['response']['id']}").json()
    assert stored == last["response"]
    follow = h.client.post("/v1/responses", json=body(
        stream=True, previous_response_id=stored["id"], tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": stored["output"][1]["call_id"],
                "output": "rain"}]))
    assert follow.status_code == 200 and "<tool>rain" in h.model.rendered[-1]


def _response(rid: str, text: str) -> dict:
    return {"id": rid, "output": [{"type": "message", "role": "assistant",
                                   "content": [{"type": "output_text", "text": text}]}]}


def _user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def test_the_store_keeps_a_bounded_number_of_bytes_least_recently_used_first_out():
    # the response, its turn's items and its input as listed (an id of a fixed length made)
    one = len(json.dumps(_response("r1", "x" * 100))) + len(json.dumps(
        (_user("q"), *_response("r1", "x" * 100)["output"]))) + len(json.dumps(
            [listed(_user("q"))]))
    store = ResponseStore(max_bytes=3 * one + 10)
    for rid in ("r1", "r2", "r3"):
        assert store.put(_response(rid, "x" * 100), [_user("q")], None)
    assert len(store) == 3 and store.n_bytes == 3 * one
    store.get("r1")  # used: r2 is now the oldest
    store.put(_response("r4", "x" * 100), [_user("q")], None)
    assert store.get("r1") and store.get("r3") and store.get("r4")
    with pytest.raises(Exception, match="'r2'"):
        store.get("r2")
    assert not store.put(_response("big", "x" * (4 * one)), [], None)  # larger than it all
    assert len(store) == 3 and store.n_bytes <= store.max_bytes
    assert not ResponseStore(0).put(_response("r", "x"), [], None)
    with pytest.raises(ValueError):
        ResponseStore(-1)


def test_a_chain_is_read_oldest_turn_first_and_a_missing_turn_is_named():
    store = ResponseStore(1 << 20)
    store.put(_response("a", "A"), [_user("1")], None)
    store.put(_response("b", "B"), [_user("2")], "a")
    store.put(_response("c", "C"), [_user("3")], "b")
    texts = [i["content"] if i["role"] == "user" else i["content"][0]["text"]
             for i in store.history("c")]
    assert texts == ["1", "A", "2", "B", "3", "C"]
    store.delete("b")
    with pytest.raises(Exception, match="'b'") as err:
        store.history("c")
    assert err.value.status == 404 and err.value.param == "previous_response_id"


def test_the_store_size_is_a_checked_knob():
    from strata.serve.config import ServeConfig, ServeConfigError

    assert ServeConfig(model="m.gguf").response_store_mib == 64
    assert ServeConfig(model="m.gguf", response_store_mib=0).response_store_mib == 0
    with pytest.raises(ServeConfigError, match="response_store_mib"):
        ServeConfig(model="m.gguf", response_store_mib=-1)


def test_metrics_count_the_route_not_each_id(h):
    """A stored response's id in the path would make a metrics series per request."""
    for _ in range(3):
        rid = _post(h, input="hello")["id"]
        h.client.get(f"/v1/responses/{rid}")
        h.client.delete(f"/v1/responses/{rid}")
    h.client.get("/v1/models/fake")
    routes = {route for route, _ in h.metrics.requests}
    assert {"/v1/responses/{response_id}", "/v1/models/{model}"} <= routes
    assert not any(r.startswith("/v1/responses/resp_") or r == "/v1/models/fake" for r in routes)
    assert h.metrics.requests[("/v1/responses/{response_id}", 200)] == 6


def test_input_items_list_a_stored_responses_own_input_a_page_at_a_time(h):
    first = _post(h, input="hello")
    items = h.client.get(f"/v1/responses/{first['id']}/input_items").json()
    assert items["object"] == "list" and items["has_more"] is False
    [msg] = items["data"]
    assert msg["type"] == "message" and msg["role"] == "user" and msg["status"] == "completed"
    assert msg["content"] == [{"type": "input_text", "text": "hello"}]
    assert msg["id"].startswith("msg_") and items["first_id"] == items["last_id"] == msg["id"]
    # the same ids on every read
    assert h.client.get(f"/v1/responses/{first['id']}/input_items").json() == items
    sent = [{"role": "system", "content": "a"}, {"role": "user", "content": "b"},
            {"type": "message", "role": "assistant", "content": "c", "id": "msg_mine"},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "d"}]}]
    second = _post(h, previous_response_id=first["id"], input=sent)
    url = f"/v1/responses/{second['id']}/input_items"
    listed = h.client.get(url, params={"order": "asc"}).json()["data"]
    # its own input only (not the turn it continued), in order, ids kept or made
    assert [m["content"][0]["text"] for m in listed] == ["a", "b", "c", "d"]
    assert listed[2]["id"] == "msg_mine" and listed[2]["content"][0]["type"] == "output_text"
    assert len({m["id"] for m in listed}) == 4
    # the default order is the last first; pages by after / before in the order asked
    newest = h.client.get(url).json()
    assert [m["id"] for m in newest["data"]] == [m["id"] for m in reversed(listed)]
    page = h.client.get(url, params={"order": "asc", "limit": 2}).json()
    assert [m["id"] for m in page["data"]] == [listed[0]["id"], listed[1]["id"]]
    assert page["has_more"] is True and page["last_id"] == listed[1]["id"]
    rest = h.client.get(url, params={"order": "asc", "limit": 2, "after": page["last_id"]}).json()
    assert [m["id"] for m in rest["data"]] == [listed[2]["id"], listed[3]["id"]]
    assert rest["has_more"] is False
    before = h.client.get(url, params={"order": "asc", "before": listed[2]["id"]}).json()
    assert [m["id"] for m in before["data"]] == [listed[0]["id"], listed[1]["id"]]
    for params, field in (({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
                          ({"limit": "x"}, "limit"), ({"order": "up"}, "order"),
                          ({"after": "msg_nope"}, "after"), ({"before": "msg_nope"}, "before"),
                          ({"include": "file_search_call.results"}, "include[0]")):
        r = h.client.get(url, params=params)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (params, r.text)
    # include: a reasoning item of the input listed with its text sealed
    from strata.serve.responses_request import seal
    thought = {"type": "reasoning", "id": "rs_1", "summary": [],
               "content": [{"type": "reasoning_text", "text": "hm"}]}
    third = _post(h, input=[thought, {"role": "user", "content": "e"}])
    url3 = f"/v1/responses/{third['id']}/input_items"
    got = h.client.get(url3, params={"order": "asc",
                                     "include": "reasoning.encrypted_content"}).json()["data"]
    assert got[0]["encrypted_content"] == seal("hm") and "encrypted_content" not in got[1]
    assert "encrypted_content" not in h.client.get(url3).json()["data"][-1]
    r = h.client.get("/v1/responses/resp_nope/input_items")
    assert r.status_code == 404 and "resp_nope" in r.json()["error"]["message"]
    # the listing counts toward the store's bound, and goes with its response
    h.client.delete(f"/v1/responses/{second['id']}")
    assert h.client.get(url).status_code == 404
