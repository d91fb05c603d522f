"""The Conversations API (`strata.serve.conversations_dialect`, `conversation_store`) in process
over the scripted engine: a conversation made, read, given metadata and deleted; its items
listed a page at a time, added, read and deleted one by one; a response made in it sees its
items and adds its own, streamed or not; what is wrong is a 400 or 404 naming the field; and the
store's byte bound. The official SDK against a real server: tests/e2e/test_serve_sdk.py."""

from __future__ import annotations

import json

import pytest

from test_serve_app import Harness, sse_events
from test_serve_responses import ASK, TOOLS, body

from strata.serve.conversation_store import ConversationStore


@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def _new(h, **kw):
    r = h.client.post("/v1/conversations", json=kw)
    assert r.status_code == 200, r.text
    return r.json()


def _items(h, conv_id, **params):
    r = h.client.get(f"/v1/conversations/{conv_id}/items", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_conversation_is_made_read_updated_and_deleted(h):
    empty = h.client.post("/v1/conversations")  # no body at all, as curl -X POST sends
    assert empty.status_code == 200 and empty.json()["metadata"] == {}
    conv = _new(h, metadata={"topic": "demo"}, items=[
        {"type": "message", "role": "user", "content": "hello"}])
    assert conv["object"] == "conversation" and conv["id"].startswith("conv_")
    assert conv["metadata"] == {"topic": "demo"} and isinstance(conv["created_at"], int)
    url = f"/v1/conversations/{conv['id']}"
    assert h.client.get(url).json() == conv
    updated = h.client.post(url, json={"metadata": {"topic": "other", "n": "2"}}).json()
    assert updated == {**conv, "metadata": {"topic": "other", "n": "2"}}
    gone = h.client.delete(url)
    assert gone.json() == {"id": conv["id"], "object": "conversation.deleted", "deleted": True}
    for r in (h.client.get(url), h.client.delete(url), h.client.get(url + "/items")):
        assert r.status_code == 404 and conv["id"] in r.json()["error"]["message"]


def test_items_are_added_listed_a_page_at_a_time_read_and_deleted(h):
    conv = _new(h, items=[{"role": "user", "content": "a"},
                          {"type": "message", "role": "assistant", "content": "b",
                           "id": "msg_mine"}])
    added = h.client.post(f"/v1/conversations/{conv['id']}/items", json={"items": [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"}]}).json()
    assert added["object"] == "list" and [i["type"] for i in added["data"]] == [
        "function_call", "function_call_output"]
    assert added["data"][0]["id"].startswith("fc_") and added["has_more"] is False
    every = _items(h, conv["id"], order="asc")["data"]
    assert [i["id"] for i in every][1] == "msg_mine" and len({i["id"] for i in every}) == 4
    assert every[0]["content"] == [{"type": "input_text", "text": "a"}]
    assert every[1]["content"] == [{"type": "output_text", "text": "b"}]
    newest = _items(h, conv["id"])  # the default order: the last first
    assert [i["id"] for i in newest["data"]] == [i["id"] for i in reversed(every)]
    first = _items(h, conv["id"], order="asc", limit=3)
    assert first["has_more"] is True and first["last_id"] == every[2]["id"]
    rest = _items(h, conv["id"], order="asc", after=first["last_id"])
    assert [i["id"] for i in rest["data"]] == [every[3]["id"]] and rest["has_more"] is False
    one = h.client.get(f"/v1/conversations/{conv['id']}/items/msg_mine")
    assert one.status_code == 200 and one.json() == every[1]
    left = h.client.delete(f"/v1/conversations/{conv['id']}/items/msg_mine")
    assert left.status_code == 200 and left.json()["id"] == conv["id"]
    assert "msg_mine" not in [i["id"] for i in _items(h, conv["id"])["data"]]
    for r in (h.client.get(f"/v1/conversations/{conv['id']}/items/msg_mine"),
              h.client.delete(f"/v1/conversations/{conv['id']}/items/msg_mine")):
        assert r.status_code == 404 and r.json()["error"]["param"] == "item_id"


def test_a_response_in_a_conversation_sees_its_items_and_adds_its_own(h):
    conv = _new(h, items=[{"role": "user", "content": "my name is Ada"}])
    r = h.client.post("/v1/responses", json=body(conversation=conv["id"], input="hi"))
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["conversation"] == {"id": conv["id"]}
    assert "<user>my name is Ada<user>hi" in h.model.rendered[-1]
    listed = _items(h, conv["id"], order="asc")["data"]
    assert [i["type"] for i in listed] == ["message"] * 3
    assert listed[1]["content"] == [{"type": "input_text", "text": "hi"}]
    assert listed[2] == first["output"][0]  # the answer as the response gave it
    # continued by the object form, streamed: the whole conversation before the new input
    r = h.client.post("/v1/responses", json=body(conversation={"id": conv["id"]},
                                                 input="again", stream=True))
    done = [json.loads(d) for e, d in sse_events(r.text) if e == "response.completed"][0]
    assert done["response"]["conversation"] == {"id": conv["id"]}
    assert ("<user>my name is Ada<user>hi<assistant>Hi there!<user>again"
            in h.model.rendered[-1])
    assert len(_items(h, conv["id"])["data"]) == 5
    # a tool turn: its call, then the call's output continues it
    call = h.client.post("/v1/responses", json=body(conversation=conv["id"], input=ASK,
                                                    tools=TOOLS)).json()["output"][1]
    h.client.post("/v1/responses", json=body(conversation=conv["id"], tools=TOOLS, input=[
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]))
    assert "<tool_call>get_weather</tool_call><tool>sunny" in h.model.rendered[-1]
    # store: false keeps no response, but the conversation still grows
    n = len(_items(h, conv["id"], limit=100)["data"])
    r = h.client.post("/v1/responses", json=body(conversation=conv["id"], store=False)).json()
    assert h.client.get(f"/v1/responses/{r['id']}").status_code == 404
    assert len(_items(h, conv["id"], limit=100)["data"]) == n + 2


def test_items_are_read_with_their_includes(h):
    """`include` on the item reads: reasoning.encrypted_content seals a reasoning item stored
    without it (what a response made with that include would have carried, and what a later
    request's input unseals), in the list and one at a time, on both include spellings; logprobs
    are as stored; nothing is changed in the store."""
    from strata.serve.responses_request import seal, unseal
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "think first"}]}
    conv = _new(h, items=[{"role": "user", "content": "q"}, reasoning])
    plain = _items(h, conv["id"], order="asc")["data"]
    assert "encrypted_content" not in plain[1]
    for key in ("include", "include[]"):
        sealed = _items(h, conv["id"], order="asc",
                        **{key: ["reasoning.encrypted_content",
                                 "message.output_text.logprobs"]})["data"]
        assert sealed[0] == plain[0]
        assert sealed[1] == {**plain[1], "encrypted_content": seal("think first")}
        assert unseal(sealed[1]["encrypted_content"]) == "think first"
    one = h.client.get(f"/v1/conversations/{conv['id']}/items/rs_1",
                       params={"include": "reasoning.encrypted_content"}).json()
    assert one["encrypted_content"] == seal("think first")
    assert "encrypted_content" not in _items(h, conv["id"], order="asc")["data"][1]


@pytest.mark.parametrize("method, path, payload, status, param", [
    ("post", "/v1/conversations", {"items": "hello"}, 400, "items"),
    ("post", "/v1/conversations", {"items": [{"type": "web_search_call"}]}, 400,
     "items[0].type"),
    ("post", "/v1/conversations", {"items": [{"role": "robot", "content": "x"}]}, 400,
     "items[0].role"),
    ("post", "/v1/conversations", {"items": [{"role": "user", "content": "x"}] * 21}, 400,
     "items"),
    ("post", "/v1/conversations", {"metadata": {"k": 1}}, 400, "metadata.k"),
    ("post", "/v1/conversations", {"metadata": {str(i): "v" for i in range(17)}}, 400,
     "metadata"),
    ("post", "/v1/conversations", {"metadata": {"k" * 65: "v"}}, 400, "metadata"),
    ("post", "/v1/conversations/{id}", {}, 400, "metadata"),
    ("post", "/v1/conversations/{id}/items", {"items": []}, 400, "items"),
    ("get", "/v1/conversations/{id}/items?limit=0", None, 400, "limit"),
    ("get", "/v1/conversations/{id}/items?order=up", None, 400, "order"),
    ("get", "/v1/conversations/{id}/items?after=msg_x", None, 400, "after"),
    ("get", "/v1/conversations/{id}/items?include=file_search_call.results", None, 400,
     "include[0]"),
    ("get", "/v1/conversations/{id}/items?include[]=reasoning.encrypted_content"
     "&include[]=x", None, 400, "include[1]"),
    ("get", "/v1/conversations/conv_nope", None, 404, "conversation_id"),
    ("post", "/v1/responses", body(conversation="conv_nope"), 404, "conversation"),
    ("post", "/v1/responses", body(conversation={"id": ""}), 400, "conversation.id"),
    ("post", "/v1/responses", body(conversation="{id}", previous_response_id="resp_1"), 400,
     "conversation"),
])
def test_what_is_wrong_is_named(h, method, path, payload, status, param):
    conv = _new(h)
    path = path.replace("{id}", conv["id"])
    if isinstance(payload, dict) and payload.get("conversation") == "{id}":
        payload = {**payload, "conversation": conv["id"]}
    r = getattr(h.client, method)(path, **({} if payload is None else {"json": payload}))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]
    assert _items(h, conv["id"])["data"] == []  # nothing half-added


def test_the_store_keeps_a_bounded_number_of_bytes_least_recently_used_first_out():
    store = ConversationStore(2000)
    text = "x" * 300
    a = store.create([{"role": "user", "content": text}], {})
    b = store.create([{"role": "user", "content": text}], {})
    store.get(a.id)  # a used last: b leaves first
    c = store.create([{"role": "user", "content": text}] * 3, {})
    assert len(store) == 2 and store.n_bytes <= 2000
    assert store.get(a.id) and store.get(c.id)
    with pytest.raises(Exception, match="not|never"):
        store.get(b.id)
    with pytest.raises(Exception, match="more than the whole store"):
        store.add(a.id, [{"role": "user", "content": "y" * 2000}])
    assert len(store.get(a.id).items) == 1  # refused whole
    assert ConversationStore(0).max_bytes == 0
    with pytest.raises(ValueError):
        ConversationStore(-1)
