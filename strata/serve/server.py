"""`run_server`: open the model, build the engine's slots, print the plan, warm up, serve.

Start-up prints what will be used (backend, slots, context, memory per region), warms the
engine up with one real prefill and decode step, and only then prints one `READY <url>` line:
a configuration that cannot run (an unknown backend, a plan that does not fit) fails before it
with the refusal's message, and READY is never printed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

from starlette.applications import Starlette

from strata.serve.app import Server
from strata.serve.config import ServeConfig, ServeConfigError
from strata.serve.devices import cpu_report, plan_reports
from strata.serve.engines import build_engine
from strata.serve.metrics import DeviceReport, Metrics
from strata.serve.model import ServedModel
from strata.serve.conversation_store import ConversationStore
from strata.serve.response_store import ResponseStore
from strata.serve.state import ServerState
from strata.serve.worker import Worker

log = logging.getLogger("strata.serve")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


@dataclass(slots=True)
class Loaded:
    """Everything a running server holds."""

    config: ServeConfig
    state: ServerState
    worker: Worker
    plan_lines: list[str]
    plan: Any = None  # the accepted VRAM plan, on backends that plan


def _template_source(config: ServeConfig) -> str | None:
    if config.chat_template is None:
        return None
    try:
        return Path(config.chat_template).read_text(encoding="utf-8")
    except OSError as e:
        raise ServeConfigError(f"chat_template: cannot read {config.chat_template!r}: "
                               f"{e.strerror}") from None


def _devices_reader(engine: Any, weights_bytes: int, plan: Any) -> Callable[[], list[DeviceReport]]:
    if plan is not None:
        counts = getattr(engine, "hit_counts", None)

        def hit_rates() -> dict[int, float] | None:
            if counts is None:
                return None
            c, out = counts(), {}  # [n_layer, 2]: each GPU's rate over the layers it runs
            for d in plan.devices:
                hits, misses = (int(v) for v in c[d.layers[0]:d.layers[1]].sum(axis=0))
                if hits + misses:
                    out[d.device.index] = hits / (hits + misses)
            return out or None
        return lambda: plan_reports(plan, hit_rates=hit_rates())
    engines = getattr(engine, "engines", ())
    report = cpu_report(weights_bytes, engines)
    return lambda: [report]


def model_facts(model_file: Any) -> dict:
    """What clients show of a model: its parameter count (every tensor's values), its
    quantization (the file's `general.file_type` as llama.cpp names it, e.g. Q4_K_M; else the
    format most of its bytes are in) and `model_info`, the file's metadata as Ollama's
    `/api/show` gives it: every one-value key (not the arrays, such as the vocabulary, nor the
    chat template, which `/api/show` sends as `template`) and `general.parameter_count`."""
    from collections import Counter

    import gguf
    import numpy as np

    n_params = sum(int(np.prod(t.ne)) for t in model_file.tensors.values())
    quant = ""
    ftype = model_file.metadata.get("general.file_type")
    if isinstance(ftype, int):
        with contextlib.suppress(ValueError):
            quant = gguf.LlamaFileType(ftype).name.removeprefix("MOSTLY_")
    if not quant and model_file.tensors:
        by_type = Counter()
        for t in model_file.tensors.values():
            by_type[t.qtype.name] += t.n_bytes
        quant = by_type.most_common(1)[0][0]
    info = {k: v for k, v in model_file.metadata.scalars().items()
            if k != "tokenizer.chat_template"}
    info["general.parameter_count"] = n_params
    return {"n_params": n_params, "quantization": quant, "model_info": info}


def load(config: ServeConfig) -> Loaded:
    """Open the model and build the engine, worker and state (no network yet)."""
    from strata.gguf import open_model
    from strata.tokenizer import ChatTemplate, Tokenizer

    model_file = open_model(config.model)
    model_file.check_weights()  # a header-only file (zero weights) is for `strata plan` alone
    meta = model_file.metadata
    tokenizer = Tokenizer.from_metadata(meta)
    template = ChatTemplate.from_metadata(meta, tokenizer, template=_template_source(config))
    built = build_engine(config, model_file)
    backend, engine, plan = built.backend, built.engine, built.plan
    name = config.model_name or Path(config.model).stem
    served = ServedModel(split_thinking=config.reasoning != "none",
                         name=name, aliases=config.aliases, tokenizer=tokenizer,
                         template=template, max_context=engine.max_context)
    metrics = Metrics()
    worker = Worker(engine, served, metrics, max_queue=config.max_queue,
                    prefix_cache=not config.no_prefix_cache)
    weights_bytes = sum(t.n_bytes for t in model_file.tensors.values())
    devices = _devices_reader(engine, weights_bytes, plan)
    summary = {"backend": backend, "slots": engine.n_slots, "max_context": engine.max_context,
               "weights_bytes": weights_bytes, "arch": model_file.arch,
               "tool_calls_parsed": served.tool_calls_parsed,
               "xml_calls": served.xml_calls, "fim": served.fim is not None,
               "prefix_cache": worker.prefix_cache,
               "splits_thinking": served.splits_thinking, **model_facts(model_file)}
    state = ServerState(model=served, worker=worker, metrics=metrics,
                        max_tokens_limit=config.max_tokens_limit, devices=devices,
                        plan_summary=summary,
                        responses=ResponseStore(config.response_store_mib << 20),
                        conversations=ConversationStore(config.response_store_mib << 20))
    return Loaded(config, state, worker, _plan_lines(config, model_file, summary, devices()),
                  plan)


def _plan_lines(config: ServeConfig, model_file: Any, summary: dict,
                devices: list[DeviceReport]) -> list[str]:
    s = model_file.shape
    tools = ("returned as text (the template's call format is not one Strata parses)"
             if not summary["tool_calls_parsed"] else
             "<tool_call> blocks (XML: <function=...>) parsed into tool calls"
             if summary.get("xml_calls") else "<tool_call> blocks parsed into tool calls")
    lines = [f"model    {config.model} ({s.arch}: {s.n_layer} layers, {s.n_expert} experts "
             f"top-{s.n_expert_used}, vocab {s.n_vocab:,})",
             f"backend  {summary['backend']}: {summary['slots']} slot(s) decoding together, "
             f"{summary['max_context']:,} tokens of context each",
             f"tools    {tools}"]
    if summary["splits_thinking"]:
        lines.append("thinking <think> blocks returned apart from the answer (--reasoning none: "
                     "kept in the text)")
    if summary.get("fim"):
        lines.append("insert   fill-in-the-middle: a completion's (or Ollama generate's) suffix")
    # whether the worker hands finished sequences' KV to the next prompts (the engine can and
    # --no-prefix-cache is not set)
    reuse = ("on (a finished request's KV, its slot's; a running one's prompt, copied)"
             if summary["prefix_cache"] else "off")
    if summary["backend"] == "cuda":  # the plan's batch: one KV region per sequence
        n, ctx = summary["slots"], summary["max_context"]
        lines.append(f"kv       {n} sequence(s) x {ctx:,} tokens: the plan holds "
                     f"{n * ctx:,} tokens of KV, one region per sequence")
        alone = ("batch-invariant (a sequence's tokens do not depend on the others)"
                 if config.batch_invariant else "one sequence alone runs the fused single step")
        lines.append(f"decode   {alone}; prefix cache {reuse}")
    else:  # engines per slot: reuse where they can rewind (the CPU engine)
        lines.append(f"prompts  prefix cache {reuse}")
    for d in devices:
        where = f" layers {d.layers[0]}-{d.layers[1] - 1}" if d.layers else ""
        regions = ", ".join(f"{r.name} {_mib(r.n_bytes)}" for r in d.regions)
        lines.append(f"memory   {d.device} ({d.label}){where}: {regions}")
    return lines


def _http_line(config: ServeConfig, url: str) -> str:
    auth = "API key required" if config.api_key else "no API key"
    cors = ", ".join(("localhost", *config.cors_origins))
    return (f"http     {url}, {auth}, bodies up to {_mib(config.max_body_bytes)}, "
            f"queue {config.max_queue}, browser origins: {cors}")


def warm_up(loaded: Loaded) -> float:
    """Prefill and decode steps of 1, 2, .. n_slots sequences (kernels compile and the batched
    engine captures each row count's graph here, not in the first requests); seconds taken."""
    t0 = time.perf_counter()
    engine = loaded.worker.engine
    token = next(iter(sorted(loaded.state.model.stop_token_ids)), 0)
    for n in range(1, engine.n_slots + 1):
        engine.prefill(n - 1, [token])
        for _ in range(2):  # the first run compiles, the second captures
            engine.decode(list(range(n)), [token] * n)
    for slot in range(engine.n_slots):
        engine.release(slot)
    return time.perf_counter() - t0


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 picks a free one), made before READY is printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ServeConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def build_app(loaded: Loaded, ready: Callable[[], None]) -> Starlette:
    """The app, with a lifespan that starts the worker and announces READY."""
    cfg = loaded.config
    app = Server(loaded.state, api_key=cfg.api_key, max_body_bytes=cfg.max_body_bytes,
                 cors_origins=cfg.cors_origins).app()

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        loaded.worker.start()
        ready()
        try:
            yield
        finally:
            loaded.worker.stop()

    app.router.lifespan_context = lifespan
    return app


def run_server(config: ServeConfig, *, out: TextIO = sys.stdout) -> int:
    """Load, print the plan, warm up, bind, serve until interrupted."""
    import uvicorn

    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loaded = load(config)
    sock = bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    url = ServeConfig(**{**_fields(config), "host": host, "port": port}).url
    for line in loaded.plan_lines + [_http_line(config, url)]:
        print(line, file=out, flush=True)
    if loaded.plan is not None:  # the GPU engine's accepted plan, as `strata plan` shows it
        from strata.plan.report import render
        render(loaded.plan, model_name=loaded.state.model.name, file=out)
        out.flush()
    print(f"warm-up  {warm_up(loaded):.2f} s", file=out, flush=True)

    def ready() -> None:
        print(f"READY {url}", file=out, flush=True)

    app = build_app(loaded, ready)
    server = uvicorn.Server(uvicorn.Config(app, log_level=config.log_level, access_log=False,
                                           lifespan="on", timeout_graceful_shutdown=5))
    server.run(sockets=[sock])
    return 0


def _fields(config: ServeConfig) -> dict:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}
