"""`strata generate`: generate text from a prompt, streaming it to stdout as it is produced."""

from __future__ import annotations

import argparse
import json
import sys

from strata.errors import StrataError, UsageError

DEFAULT_N_PREDICT = 128

# compiling below this (a few functions the cache missed) is not worth a line of its own
COMPILE_NOTE_S = 0.5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", metavar="FILE",
                   help="GGUF model (default: the built-in tiny synthetic model, made once in "
                        "the user cache)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="prompt text")
    src.add_argument("--prompt-tokens", metavar="IDS", help="prompt as token ids: 1,2,3")
    src.add_argument("--chat", metavar="TEXT",
                     help="a user message, wrapped in the model's chat template")
    src.add_argument("-i", "--interactive", action="store_true",
                     help="chat turn by turn: each line read is a user message (a line ending "
                          "in \\ goes on); each turn computes only what the conversation "
                          "adds; /clear starts over, /exit or the end of input ends")
    p.add_argument("--system", metavar="TEXT",
                   help="a system message before the user's (--chat, --interactive)")
    p.add_argument("-n", "--n-predict", type=int, default=DEFAULT_N_PREDICT, metavar="N",
                   help=f"tokens to generate at most (default {DEFAULT_N_PREDICT})")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, metavar="K", help="0 = off (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, metavar="P",
                   help="1 = off (default 0.95)")
    p.add_argument("--min-p", type=float, default=0.05, metavar="P",
                   help="0 = off (default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, metavar="R",
                   help="1 = off (default 1.0)")
    p.add_argument("--presence-penalty", type=float, default=0.0, metavar="P",
                   help="subtracted from a recent token's logit once; 0 = off (default)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, metavar="F",
                   help="subtracted per occurrence among the recent tokens; 0 = off (default)")
    p.add_argument("--repeat-last-n", type=int, default=64, metavar="N",
                   help="recent tokens (prompt included) the penalties look at (default 64)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="sampling seed (default: random)")
    p.add_argument("--backend", default="auto", choices=("auto", "cuda", "cpu"),
                   help="auto picks CUDA when a GPU and the CUDA engine exist, else the CPU")
    g = p.add_argument_group("--backend cuda")  # the flags only the CUDA engine reads
    g.add_argument("--gpu-mem", metavar="SIZE[,SIZE...]",
                   help="CUDA: plan for this much VRAM (e.g. 8GiB), a smaller card's budget; "
                        "one size for every GPU or one per GPU of a layer split")
    g.add_argument("--no-graph", action="store_true",
                   help="CUDA: launch the decode kernels one by one instead of a CUDA graph")
    g.add_argument("--miss-path", choices=("mapped", "cpu", "hybrid"), default=None,
                   help="CUDA: where experts missed in VRAM are computed: the GPU reading mapped "
                        "host memory, the CPU pool, or both at once (hybrid) (default: the "
                        "engine's measured choice)")
    g.add_argument("--adaptive-cache", action="store_true",
                   help="CUDA: after each prompt, swap expert-cache slots towards the experts "
                        "its routing used most")
    g.add_argument("--miss-share", type=float, default=None, metavar="F",
                   help="CUDA, --miss-path hybrid: the CPU pool's fraction of the misses "
                        "(default: from the measured rates of both paths)")
    g.add_argument("--prompt-steps", type=int, default=None, metavar="N",
                   help="CUDA: prompts (and a chat turn's new tokens) of up to N tokens run "
                        "as decode steps, one token each (0: never; default: where the plan "
                        "estimates steps beat the prompt path)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json-object", action="store_true",
                     help="constrain the output to one JSON object, ended by the end token")
    fmt.add_argument("--json-schema", metavar="SCHEMA",
                     help="constrain the output to one JSON object this schema allows: inline "
                          "JSON, or a file's path (the subset `strata serve` takes; another "
                          "keyword is refused by name)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object at the end instead of streaming text")
    p.add_argument("--logits-out", metavar="FILE.npy",
                   help="save float32 [n_generated, n_vocab]: row i chose generated token i")
    from strata.plan.knobs import add_engine_knobs
    add_engine_knobs(p)  # --max-context and the CUDA plan's VRAM knobs
    from strata.plan.split.knobs import add_split_knobs
    add_split_knobs(p)  # several GPUs: one stage of layers each (strata.engine.multi)


def _engine(args, model) -> tuple[str, object]:
    """(backend name, engine): the CUDA engine planned with the VRAM knobs and --gpu-mem (a
    layer split's `SplitEngine` over several GPUs); the CPU engine takes only --max-context."""
    from strata.engine.backends import select_backend
    from strata.cli.flags import cuda_only_given, ignored_note
    from strata.engine.multi.request import (gpu_request, gpu_sizes, split_flags_given,
                                             visible_gpus)
    from strata.plan.knobs import options_from_args
    from strata.plan.split.knobs import split_from_args

    # a bad knob is refused on every backend (the CPU engine takes any --max-context)
    options_from_args(argparse.Namespace(**{**vars(args), "max_context": None}))
    split_from_args(args)  # and a bad split flag
    name, mod = select_backend(args.backend)
    if name != "cuda":
        gpu_sizes(args.gpu_mem)  # a bad size is refused on every backend too
        given = cuda_only_given(add_arguments, args)
        if given:
            print(ignored_note(given, "the CUDA engine", f"the {name} backend"), file=sys.stderr)
        given = (["--gpus"] if args.gpus else []) + split_flags_given(args)
        if given:
            print(f"note: {', '.join(given)}: the layer split runs on the CUDA engine; the "
                  f"{name} backend runs every layer on the CPU", file=sys.stderr)
        return name, mod.engine_factory(model, max_context=args.max_context)()
    import dataclasses

    from strata.engine.cuda.options import CudaOptions

    req = gpu_request(args, visible_gpus())
    if req.is_split and args.miss_path in ("cpu", "hybrid"):
        raise UsageError(f"--miss-path {args.miss_path}: a layer split reads missed experts "
                         "from mapped host memory on each stage's GPU (drop --miss-path, or use "
                         "one GPU)")
    plan = options_from_args(args)
    if plan.max_context is None:  # generate's default on every backend: the CPU engine's
        from strata.engine.cpu.engine import default_max_context

        plan = dataclasses.replace(plan, max_context=default_max_context(model.shape))
    extra = {} if args.miss_path is None else {"miss_path": args.miss_path}
    if args.miss_share is not None:
        extra["miss_share"] = args.miss_share
    if args.prompt_steps is not None:
        extra["prompt_steps"] = args.prompt_steps
    if args.adaptive_cache:
        if req.is_split:
            raise UsageError("--adaptive-cache: a layer split keeps its planned residency "
                             "(drop --adaptive-cache, or use one GPU)")
        extra["adaptive_cache"] = True
    options = CudaOptions(plan=plan, gpu_mem=req.gpu_mem[0], device=req.devices[0],
                          graph=not args.no_graph, profile_path=args.profile,
                          progress=not args.json, **extra)
    if req.is_split:
        from strata.engine.multi.request import open_split

        return "cuda-split", open_split(model, options, req, use_graph=not args.no_graph)
    return name, mod.engine_factory(model, options=options)()


def _sampling(args):
    import math

    from strata.engine import SamplingParams

    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise UsageError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                              presence_penalty=args.presence_penalty,
                              frequency_penalty=args.frequency_penalty,
                              repeat_last_n=args.repeat_last_n, seed=args.seed)
    except ValueError as e:  # "top_p must be ...": said as the flag that set it
        field, _, rest = str(e).partition(" ")
        flag = f"--{field.replace('_', '-')}" if hasattr(args, field) else field
        raise UsageError(f"{flag} {rest}") from None


def _parse_ids(text: str) -> list[int]:
    parts = [s.strip() for s in text.split(",") if s.strip()]
    if not parts:
        raise UsageError("--prompt-tokens is empty: give ids like 1,2,3")
    try:
        return [int(s) for s in parts]
    except ValueError:
        raise UsageError(f"--prompt-tokens must be comma-separated integers, got {text!r}") \
            from None


def _prompt_ids(args, model, tokenizer) -> list[int]:
    if args.prompt_tokens is not None:
        ids = _parse_ids(args.prompt_tokens)
        bad = [i for i in ids if not 0 <= i < model.shape.n_vocab]
        if bad:
            raise UsageError(f"--prompt-tokens: token id {bad[0]} is outside the vocabulary "
                             f"(0..{model.shape.n_vocab - 1})")
        return ids
    flag, text = ("--prompt", args.prompt) if args.prompt is not None else ("--chat", args.chat)
    if not text:
        raise UsageError(f"{flag} is empty: give some text")
    if args.chat is not None:
        from strata.tokenizer import ChatTemplate

        system = [{"role": "system", "content": args.system}] if args.system else []
        text = ChatTemplate.from_metadata(model.metadata, tokenizer).render(
            system + [{"role": "user", "content": text}], add_generation_prompt=True)
    return tokenizer.encode(text)


def _model_path(args) -> str:
    if args.model:
        return args.model
    from strata.synth import default_model_path

    return str(default_model_path(progress=not args.json))


def run(args) -> int:
    from strata.gguf import open_model
    from strata.plan.options import check_max_context
    from strata.tokenizer import Tokenizer

    if args.n_predict < 1:
        raise UsageError(f"-n must be at least 1, got {args.n_predict}")
    check_max_context(args.max_context)  # the CUDA engine's plan asks more (`_engine`)
    sampling = _sampling(args)
    if args.system is not None and (args.prompt is not None or args.prompt_tokens is not None):
        raise UsageError("--system goes with --chat or --interactive (a chat template's "
                         "system message), not a raw prompt")
    if args.interactive:
        given = [f for f, on in (("--json", args.json), ("--logits-out", args.logits_out),
                                 ("--json-object", args.json_object),
                                 ("--json-schema", args.json_schema is not None)) if on]
        if given:
            raise UsageError(f"{', '.join(given)}: not with --interactive (each turn streams "
                             f"its reply as text)")
    root = _json_root(args)
    if args.logits_out:  # a path that cannot be written is said before the run, not after
        from strata.cli.output import check_output, npy_path

        check_output(npy_path(args.logits_out), "--logits-out")
    model = open_model(_model_path(args))
    model.check_weights()  # a header-only file (zero weights) is for `strata plan` alone
    tokenizer = Tokenizer.from_metadata(model.metadata)
    prompt = None if args.interactive else _prompt_ids(args, model, tokenizer)
    backend, engine = _engine(args, model)
    try:
        if args.interactive:
            from strata.cli.generate_chat import chat

            return chat(args, model, tokenizer, (backend, engine), sampling)
        return _generate(args, model, tokenizer, prompt, (backend, engine), sampling, root)
    finally:
        close = getattr(engine, "close", None)  # a layer split gives its GPUs back in order
        if close is not None:
            close()


def _json_root(args):
    """The schema node `--json-schema` / `--json-object` hold the output to (`False`: none;
    None: any object), checked before the model loads."""
    if not args.json_object and args.json_schema is None:
        return False
    if args.json_object:
        return None
    from pathlib import Path

    from strata.engine.json_schema import SchemaError
    from strata.engine.json_schema_request import compile_request_schema

    text = args.json_schema
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as e:
            raise StrataError(f"--json-schema: {args.json_schema!r} is neither inline JSON "
                              f"nor a readable file: {e}") from None
        except UnicodeDecodeError as e:
            raise UsageError(f"--json-schema: {args.json_schema}: not UTF-8 text (byte "
                             f"0x{e.object[e.start]:02x} at offset {e.start})") from None
    try:
        return compile_request_schema(json.loads(text))
    except (json.JSONDecodeError, RecursionError) as e:
        raise UsageError(f"--json-schema: not JSON: {e}") from None
    except SchemaError as e:
        raise UsageError(f"--json-schema: {e}") from None


def _generate(args, model, tokenizer, prompt, loaded, sampling, root=False) -> int:
    from strata.engine import Sampler, generate

    backend, engine = loaded
    constraint = None
    if root is not False:  # the host samples under it (generate keeps it off the device)
        from strata.engine.json_constraint import JsonConstraint, TokenBytes

        constraint = JsonConstraint(TokenBytes.of_tokenizer(tokenizer), sorted(tokenizer.eot_ids),
                                    root)

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    from strata.telemetry.compile_clock import compile_clock

    with compile_clock() as compiled:  # a first run compiles inside its prompt: said apart
        gen = generate(engine, prompt, n_predict=args.n_predict,
                       sampler=Sampler(sampling, constraint),
                       stop_ids=tokenizer.eot_ids, text=tokenizer.stream_decoder(after=prompt[-1]),
                       on_text=None if args.json else show, keep_logits=bool(args.logits_out))
    if args.logits_out:
        import numpy as np

        from strata.cli.output import npy_path, write_atomic

        write_atomic(npy_path(args.logits_out), "--logits-out",
                     lambda f: np.save(f, gen.logits, allow_pickle=False))
    stats = {
        "prompt_tokens": gen.prompt_tokens, "generated_tokens": len(gen.tokens),
        "prefill_tokens_per_s": round(gen.prefill_tokens_per_s, 3),
        "decode_tokens_per_s": round(gen.decode_tokens_per_s, 3), "backend": backend,
        "stop_reason": gen.stop_reason, "prefill_s": round(gen.prefill_s, 6),
        "decode_s": round(gen.decode_s, 6), "max_context": engine.max_context,
        "model": model.path, "compile_s": round(compiled.seconds, 3),
    }
    if args.json:
        print(json.dumps({"tokens": gen.tokens, "text": gen.text, "stats": stats}))
    else:
        print()
        print(f"[{backend}] prompt {gen.prompt_tokens} tokens at "
              f"{gen.prefill_tokens_per_s:.1f} tok/s, generated {len(gen.tokens)} at "
              f"{gen.decode_tokens_per_s:.1f} tok/s", file=sys.stderr)
        if compiled.seconds >= COMPILE_NOTE_S:
            print(f"[{backend}] those times include {compiled.seconds:.1f} s of compiling "
                  f"kernels, once for this version of strata: later runs load them from the "
                  f"cache", file=sys.stderr)
    if gen.stop_reason == "context":
        print(f"stopped: the context of {engine.max_context} tokens is full "
              f"(raise --max-context)", file=sys.stderr)
    return 0
