"""The OpenAI Conversations API (`strata.serve.conversation_store` keeps them):

  POST   /v1/conversations                          {items?, metadata?} -> the conversation
  GET    /v1/conversations/{id}                     the conversation
  POST   /v1/conversations/{id}                     {metadata} -> the conversation
  DELETE /v1/conversations/{id}                     {id, object: conversation.deleted, ...}
  GET    /v1/conversations/{id}/items               a page of its items (limit, order, after,
                                                    before: `response_store.page`)
  POST   /v1/conversations/{id}/items               {items} -> the list of the items added
  GET    /v1/conversations/{id}/items/{item_id}     one item
  DELETE /v1/conversations/{id}/items/{item_id}     the conversation

Items are those a Responses request's `input` takes (messages, reasoning, function calls and
their outputs), checked as it checks them, at most 20 a call; a response made with
`conversation` adds its own (`responses_dialect`). Reading them takes `include`
(`responses_request.with_includes`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.serve.conversation_store import MAX_ITEMS_A_CALL
from strata.serve.errors import bad_request
from strata.serve.fields import Fields, check_metadata
from strata.serve.response_store import page
from strata.serve.responses_request import check_items, with_includes
from strata.serve.state import ServerState


def _items(f: Fields, *, required: bool) -> list:
    items = f.list("items", required=required) or []
    if required and not items:
        raise bad_request("items: expected at least one item", "items")
    if len(items) > MAX_ITEMS_A_CALL:
        raise bad_request(f"items: {len(items)} items, at most {MAX_ITEMS_A_CALL} a call",
                          "items")
    check_items(items, "items")
    return items


async def create(request: Request, state: ServerState, body: dict) -> Response:
    f = Fields(body)
    items = _items(f, required=False)
    conv = state.conversations.create(items, check_metadata(f.raw("metadata")))
    return JSONResponse(conv.body())


async def retrieve(request: Request, state: ServerState) -> Response:
    return JSONResponse(state.conversations.get(request.path_params["conversation_id"]).body())


async def update(request: Request, state: ServerState, body: dict) -> Response:
    f = Fields(body)
    metadata = check_metadata(f.raw("metadata", required=True))
    conv_id = request.path_params["conversation_id"]
    return JSONResponse(state.conversations.set_metadata(conv_id, metadata).body())


async def delete(request: Request, state: ServerState) -> Response:
    conv_id = request.path_params["conversation_id"]
    state.conversations.delete(conv_id)
    return JSONResponse({"id": conv_id, "object": "conversation.deleted", "deleted": True})


async def list_items(request: Request, state: ServerState) -> Response:
    conv = state.conversations.get(request.path_params["conversation_id"])
    body = page(conv.items, request.query_params, "item of this conversation")
    body["data"] = with_includes(body["data"], request.query_params)
    return JSONResponse(body)


async def add_items(request: Request, state: ServerState, body: dict) -> Response:
    items = _items(Fields(body), required=True)
    added = state.conversations.add(request.path_params["conversation_id"], items)
    return JSONResponse({"object": "list", "data": added, "first_id": added[0]["id"],
                         "last_id": added[-1]["id"], "has_more": False})


async def get_item(request: Request, state: ServerState) -> Response:
    p = request.path_params
    item = state.conversations.item(p["conversation_id"], p["item_id"])
    return JSONResponse(with_includes([item], request.query_params)[0])


async def delete_item(request: Request, state: ServerState) -> Response:
    p = request.path_params
    return JSONResponse(state.conversations.delete_item(p["conversation_id"],
                                                        p["item_id"]).body())
