"""`POST /tokenize` and `POST /detokenize`: the served model's tokenizer over HTTP, for tools
that count or cut a prompt before they send it.

Both of the shapes local servers use are read: a prompt as `prompt` (vLLM) or `content`
(llama.cpp), `add_special_tokens` or `add_special`; or a chat as OpenAI `messages` (and `tools`),
rendered by the model's template as `/v1/chat/completions` renders it, generation prompt
included. The answer holds `tokens` (with `with_pieces`, each as `{"id", "piece"}`, the piece
its text as the logprobs show it), `count` and `max_model_len` (the served context). The
tokens are what the generation routes feed the model: a prompt's are `/v1/completions`' (BOS
as the file says, unless `add_special_tokens` is false). `/detokenize` takes `tokens` and
returns the text as `prompt` and `content`, control tokens kept (they are part of a prompt).
`model`, where given, must be the served one.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.serve.chat import template_vars
from strata.serve.errors import bad_request
from strata.serve.fields import Fields, join, type_name
from strata.serve.openai_request import chat_message, parse_tools
from strata.serve.state import ServerState


def _check_model(f: Fields, state: ServerState) -> None:
    name = f.str("model")
    if name is not None:
        state.check_model(name)


def _flag(f: Fields, names: tuple[str, str], default: bool) -> bool:
    given = [n for n in names if f.has(n)]
    if len(given) > 1:
        raise bad_request(f"{given[1]}: send {given[0]} or {given[1]}, not both", given[1])
    return f.bool(given[0], default=default) if given else default


def _text_key(f: Fields) -> str:
    keys = [k for k in ("prompt", "content", "messages") if f.has(k)]
    if len(keys) > 1:
        raise bad_request(f"{keys[1]}: send one of prompt, content or messages, not "
                          f"{keys[0]} and {keys[1]}", keys[1])
    if not keys:
        raise bad_request("prompt: required (or content, or messages)", "prompt")
    return keys[0]


async def tokenize(request: Request, state: ServerState, body: dict) -> Response:
    f = Fields(body)
    _check_model(f, state)
    key = _text_key(f)
    model = state.model
    pieces = f.bool("with_pieces")
    if key == "messages":
        raw = f.list("messages", required=True, non_empty=True)
        messages = [chat_message(m, join("messages", i)) for i, m in enumerate(raw)]
        tools = parse_tools(f)[0] or None
        extra = dict(template_vars(f.raw("chat_template_kwargs"), "chat_template_kwargs"))

        def encode() -> list[int]:
            return model.encode(model.render_chat(messages, tools, extra))
    else:
        text = f.str(key, required=True)
        special = _flag(f, ("add_special_tokens", "add_special"), True)

        def encode() -> list[int]:
            return model.encode_prompt(text, special=special)

    ids = await run_in_threadpool(encode)
    tokens = ([{"id": t, "piece": model.token_piece(t)[0]} for t in ids] if pieces
              else ids)
    return JSONResponse({"tokens": tokens, "count": len(ids),
                         "max_model_len": model.max_context})


async def detokenize(request: Request, state: ServerState, body: dict) -> Response:
    f = Fields(body)
    _check_model(f, state)
    ids = f.list("tokens", required=True)
    n_vocab = state.model.n_vocab
    for i, t in enumerate(ids):
        where = join("tokens", i)
        if isinstance(t, bool) or not isinstance(t, int):  # true is no token, though Python's 1
            raise bad_request(f"{where}: expected an integer token id (0..{n_vocab - 1}), got "
                              f"{type_name(t)}", where)
        if not 0 <= t < n_vocab:
            raise bad_request(f"{where}: token id {t} is outside the vocabulary "
                              f"(0..{n_vocab - 1})", where)
    text = state.model.decode(ids, skip_special=False)
    return JSONResponse({"prompt": text, "content": text})
