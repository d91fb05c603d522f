"""`strata serve`: an OpenAI- and Anthropic-compatible HTTP endpoint for one model."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Every default is None: the config file fills what the command line leaves out, and
    # ServeConfig holds the real defaults once.
    p.add_argument("-m", "--model", metavar="FILE",
                   help="GGUF model (default: the built-in tiny synthetic model, made once in "
                        "the user cache)")
    p.add_argument("--config", metavar="FILE.json",
                   help="a JSON object of these knobs (keys as the long options; the command "
                        "line wins)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, help="TCP port (default 8080; 0 picks a free one)")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda"),
                   help="auto (the default) picks CUDA when a GPU and the CUDA engine exist, "
                        "else the CPU")
    p.add_argument("--api-key", dest="api_key",
                   help="require 'Authorization: Bearer KEY' or 'x-api-key: KEY' "
                        "(or set STRATA_API_KEY)")
    p.add_argument("--model-name", dest="model_name",
                   help="the model id clients send (default: the file name without .gguf)")
    p.add_argument("--alias", dest="aliases", action="append", metavar="NAME",
                   help="another model id accepted for this model (repeatable)")
    p.add_argument("--cors-origin", dest="cors_origins", action="append", metavar="ORIGIN",
                   help="a browser origin (https://app.example:3000) allowed to call the server "
                        "besides this machine's own (localhost, 127.0.0.1, [::1], any port, "
                        "always allowed); repeatable; * allows any web page")
    p.add_argument("--no-prefix-cache", dest="no_prefix_cache", action="store_true",
                   default=None,
                   help="compute every prompt whole (by default a prompt that starts as a "
                        "finished request's text did reuses its KV: a chat's next turn)")
    p.add_argument("--max-queue", dest="max_queue", type=int,
                   help="requests that may wait for a slot before a 503 (default 256)")
    p.add_argument("--max-body-bytes", dest="max_body_bytes", type=int,
                   help="largest request body accepted (default 8 MiB)")
    p.add_argument("--response-store-mib", dest="response_store_mib", type=int, metavar="MIB",
                   help="memory for the Responses API's stored responses (previous_response_id, "
                        "GET /v1/responses/ID) and, as much again, for its conversations "
                        "(/v1/conversations); least recently used leave first; 0 keeps none; "
                        "default 64)")
    p.add_argument("--max-tokens-limit", dest="max_tokens_limit", type=int,
                   help="upper bound on any request's max_tokens (default: the context left)")
    p.add_argument("--chat-template", dest="chat_template", metavar="FILE",
                   help="a Jinja chat template to use instead of the model file's")
    p.add_argument("--reasoning", choices=("auto", "none"),
                   help="a thinking model's <think> block: auto (the default) returns it apart "
                        "(reasoning_content, Anthropic thinking blocks, Responses reasoning "
                        "items, Ollama thinking); none leaves it in the answer's text")
    p.add_argument("--log-level", dest="log_level",
                   choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--gpu-mem", dest="gpu_mem", metavar="SIZE",
                   help="CUDA: plan within this much VRAM (e.g. 24GiB), as on a smaller card; "
                        "several sizes (12GiB,16GiB) split the layers over GPUs 0, 1, ...")
    p.add_argument("--no-graph", dest="no_graph", action="store_true", default=None,
                   help="CUDA: launch decode kernels one by one instead of replaying graphs")
    p.add_argument("--batch-invariant", dest="batch_invariant", action="store_true",
                   default=None,
                   help="CUDA: a sequence gets the same tokens alone and beside others (one "
                        "sequence then decodes through the batched kernels: slower)")
    p.add_argument("--prompt-steps", dest="prompt_steps", type=int, default=None, metavar="N",
                   help="CUDA: prompts (and a chat turn's new tokens) of up to N tokens "
                        "run as decode steps, one token each (0: never; default: where the plan "
                        "estimates steps beat the prompt path)")
    from strata.plan.knobs import add_engine_knobs
    # --batch (sequences decoded together, one slot each; on CUDA they share each pass over the
    # weights), --max-context (per sequence) and the CUDA plan's VRAM knobs. Their defaults are
    # None here so a config file's values are not overridden by defaults.
    add_engine_knobs(p)
    from strata.plan.split.knobs import add_split_knobs
    # several GPUs named (--gpus 0,1 or several --gpu-mem sizes): a layer split, one sequence at
    # a time; unlike generate, several visible GPUs alone do not split (strata.serve.engines)
    add_split_knobs(p, gpus_help="the GPU to serve from (default 0), or several to split the "
                                  "layers over, in stage order (one sequence at a time)")
    p.set_defaults(gpus=None, layer_split=None, cover_b=None, no_helper_tiers=None,
                   no_carve=None, stage_cache=None, gpu_bandwidth=None, handoff=None)
    p.set_defaults(max_context=None, kv=None, kv_resident=None, prefill=None, expert_cache=None,
                   vram_reserve_mib=None, ring_mib=None, batch=None,
                   no_prefill_borrow=None, embd_on_gpu=None, lend_pct=None,
                   lend_floor_slots=None, profile=None)


def _check_readable(path: str) -> None:
    """A --config file that cannot be read is a failed run (status 1), said here: past this,
    what `build_config` refuses is a knob's value, a usage error."""
    from strata.errors import StrataError

    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise StrataError(f"--config {path}: cannot read it ({e.strerror or e})") from None


def run(args: argparse.Namespace) -> int:
    from strata.cli.flags import flag_checks
    from strata.plan.options import check_max_context
    from strata.serve.config import ServeConfigError, build_config
    from strata.serve.server import run_server

    # the command line's, in every command's words; a config file's "max_context" is checked
    # by ServeConfig against the same least
    check_max_context(args.max_context)
    if args.config is not None:
        _check_readable(args.config)
    cli = {k: v for k, v in vars(args).items()
           if not k.startswith("_") and k not in ("config", "spec")}
    def default_model() -> str:
        from strata.synth import default_model_path
        return str(default_model_path())

    with flag_checks(ServeConfigError):  # a knob of the command line or the config file
        config = build_config(cli, args.config, default_model=default_model)
    return run_server(config)
