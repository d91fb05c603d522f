"""`Choices`: the `n` generations of one OpenAI request (its `n` choices), submitted together,
read together, cancelled together.

Each choice is its own job (its own sequence in the batch, so n choices decode side by side in
one step where the batch has room). Their prompt is computed once: the engine gives each later
choice a copy of the first one's K/V and its logits (`PerSlotEngines`, `RowTable.place`),
unless `--no-prefix-cache`. A sampled request's choices draw from different streams: a
request seed s gives choice i the seed s + i, so the whole response repeats with the seed. The
prompt is counted once in the usage, as OpenAI counts it; the completions are summed. A
completion's batch of prompts is `n` choices of each, in one `Choices`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncIterator

from strata.serve.errors import bad_request
from strata.serve.generation import Generation, Prepared, Submitter
from strata.serve.job import FinishEvent
from strata.serve.model import SEED_MODULUS
from strata.serve.tools import ToolCall

MAX_CHOICES = 16  # per request: each is a sequence of the batch (and its KV)


def choice_prepared(prepared: Prepared, index: int) -> Prepared:
    """Choice `index`'s request: the same, its seed (where one is given) moved on by index."""
    seed = prepared.sampling.seed
    if index == 0 or seed is None:
        return prepared
    sampling = dataclasses.replace(prepared.sampling, seed=(seed + index) % SEED_MODULUS)
    return dataclasses.replace(prepared, sampling=sampling)


class Choices:
    """`n` generations of `prepared`, queued together: where the queue has no room for all
    of them, none is queued and the 503 goes to the caller. An `n` above what the queue holds
    at all is the client's 400 (naming `n`): its choices could never be queued together, so a
    retry would never succeed."""

    def __init__(self, worker: Submitter, prepared: Prepared | list[Prepared], n: int, *,
                 id_prefix: str = "call_"):
        """`prepared`: one request, or (a completion's batch of prompts) one a prompt, whose
        choices come prompt after prompt: prompt i's choice j at index i * n + j."""
        if not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"n must be in [1, {MAX_CHOICES}], got {n}")
        prompts = prepared if isinstance(prepared, list) else [prepared]
        total = n * len(prompts)
        if total > worker.max_queue:
            room = worker.max_queue
            what = (f"{n} choices" if len(prompts) == 1 else
                    f"{len(prompts)} prompts x {n} choices")
            raise bad_request(f"n: {what} wait in the request queue together, but it "
                              f"holds {room} request{'' if room == 1 else 's'} "
                              f"(--max-queue): ask for at most {room}", "n")
        self.prepared = prompts[0]
        self.n = n
        self.gens = [Generation(worker, choice_prepared(p, i), id_prefix=id_prefix,
                                submit=False) for p in prompts for i in range(n)]
        worker.submit_all([g.job for g in self.gens])

    def __len__(self) -> int:
        return len(self.gens)

    def cancel(self) -> None:
        for g in self.gens:
            g.cancel()

    async def collect(self) -> list[tuple[str, list[ToolCall]]]:
        """Each choice's text and tool calls, in choice order."""
        return list(await asyncio.gather(*(g.collect() for g in self.gens)))

    async def items(self) -> AsyncIterator[tuple[int, str | ToolCall | None, list | None]]:
        """(choice index, text piece or tool call, log-probability entries) as the choices
        produce them, each choice's own in order, and (index, None, entries) once that choice
        has finished (its `finish` is set). The entries are those of the tokens received with
        the item (the rest, with the finish), None where the request asked for none: taken as
        the item is, since a choice may run ahead of the reader. Ends when every choice has."""
        queue: asyncio.Queue = asyncio.Queue()
        wants = self.prepared.sampling.logprobs is not None

        async def pump(i: int, gen: Generation) -> None:
            try:
                async for item in gen.items():
                    queue.put_nowait((i, item, gen.take_logprobs() if wants else None))
                queue.put_nowait((i, None, gen.take_logprobs() if wants else None))
            except Exception as e:  # the reader's to raise
                queue.put_nowait((i, e, None))

        tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(self.gens)]
        try:
            n_open = len(tasks)
            while n_open:
                i, item, entries = await queue.get()
                if isinstance(item, Exception):
                    raise item
                n_open -= item is None
                yield i, item, entries
        finally:
            for t in tasks:
                t.cancel()

    @property
    def finishes(self) -> list[FinishEvent]:
        """Each choice's `FinishEvent` (after `collect` or `items` ended)."""
        return [g.finish for g in self.gens]

    @property
    def failed(self) -> FinishEvent | None:
        """The first choice that ended in an error, if any did."""
        return next((f for f in self.finishes if f is not None and f.reason == "error"), None)

    def usage(self) -> dict:
        """OpenAI's usage: each prompt once (and the tokens of it a finished request's KV held,
        for its first choice), every choice's completion tokens."""
        firsts = self.finishes[::self.n]
        n_prompt = sum(f.n_prompt for f in firsts)
        n_completion = sum(f.n_completion for f in self.finishes)
        n_reasoning = sum(f.n_reasoning for f in self.finishes)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                "total_tokens": n_prompt + n_completion,
                "prompt_tokens_details": {"cached_tokens": sum(f.n_cached for f in firsts)},
                "completion_tokens_details": {"reasoning_tokens": n_reasoning}}
