"""`strata generate --interactive`: a chat on one engine, turn by turn from standard input.

Each line read is a user message (a line ending in a backslash goes on with the next); the reply
streams to standard output and a line of figures to standard error. Each turn's prompt is the
whole conversation through the model's chat template, and only what the engine's KV does not
already hold is computed (`strata.engine.conversation`). `/clear` starts over, `/exit` (or
`/bye`, `/quit`, the end of input) ends. Ctrl-C during a reply stops it and forgets the turn;
at the prompt it ends the chat.
"""

from __future__ import annotations

import dataclasses
import sys

EXIT = ("/exit", "/bye", "/quit")


def read_message(tty: bool) -> str | None:
    """The next user message, or None at the end of input."""
    lines: list[str] = []
    while True:
        try:
            line = input((">>> " if not lines else "... ") if tty else "")
        except EOFError:
            return "\n".join(lines) if lines else None
        if line.endswith("\\"):
            lines.append(line[:-1])
            continue
        lines.append(line)
        return "\n".join(lines)


def chat(args, model, tokenizer, loaded, sampling) -> int:
    from strata.cli.generate import COMPILE_NOTE_S
    from strata.engine import Sampler, generate
    from strata.engine.conversation import Conversation
    from strata.errors import StrataError
    from strata.telemetry.compile_clock import compile_clock
    from strata.tokenizer import ChatTemplate

    backend, engine = loaded
    conv = Conversation(ChatTemplate.from_metadata(model.metadata, tokenizer), tokenizer,
                        system=args.system, can_rewind=hasattr(engine, "rewind"))
    tty = sys.stdin.isatty()
    if tty:
        try:  # line editing and the turns' history at the prompt (absent on Windows: plain)
            import readline  # noqa: F401
        except ImportError:
            pass
        print(f"chatting on {backend} (context {engine.max_context} tokens): /clear starts "
              f"over, /exit or Ctrl-D ends", file=sys.stderr)

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    turn = 0
    while True:
        try:
            user = read_message(tty)
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 0
        if user is None or user.strip() in EXIT:
            return 0
        if user.strip() == "/clear":
            conv.clear()  # nothing kept: the next turn starts the engine afresh
            print("(the conversation starts over)", file=sys.stderr)
            continue
        if not user.strip():
            continue
        prompt, reuse = conv.prompt(user)
        if len(prompt) >= engine.max_context:
            print(f"the conversation would take {len(prompt)} tokens of the context's "
                  f"{engine.max_context}: /clear starts over (or raise --max-context)",
                  file=sys.stderr)
            continue
        seed = None if sampling.seed is None else sampling.seed + turn
        try:
            with compile_clock() as compiled:
                gen = generate(engine, prompt, n_predict=args.n_predict,
                               sampler=Sampler(dataclasses.replace(sampling, seed=seed)),
                               stop_ids=tokenizer.eot_ids,
                               text=tokenizer.stream_decoder(after=prompt[-1]), on_text=show,
                               reuse=reuse)
        except (KeyboardInterrupt, StrataError, ValueError) as e:
            # the engine's sequence may be cut anywhere: nothing of it is reused (the next
            # turn resets the engine)
            conv.kept = []
            why = "interrupted" if isinstance(e, KeyboardInterrupt) else f"error: {e}"
            print(f"\n({why}: the turn is forgotten)", file=sys.stderr)
            continue
        print()
        conv.answered(user, prompt, gen.tokens, gen.text)
        turn += 1
        line = (f"[{backend}] prompt {len(prompt) - reuse} new tokens ({reuse} kept) at "
                f"{gen.prefill_tokens_per_s:.1f} tok/s, generated {len(gen.tokens)} at "
                f"{gen.decode_tokens_per_s:.1f} tok/s")
        if compiled.seconds >= COMPILE_NOTE_S:
            line += f"; {compiled.seconds:.1f} s of it compiling kernels (once a version)"
        print(line, file=sys.stderr)
        if gen.stop_reason == "context":
            print(f"the context of {engine.max_context} tokens is full: /clear starts over "
                  f"(or raise --max-context)", file=sys.stderr)
