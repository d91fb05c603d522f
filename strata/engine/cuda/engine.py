"""`CudaEngine`: one sequence on the GPU through a loaded `CudaModel`.

The `Engine` interface (prefill / decode_step return logits to the host) is served by the same
device step as the fast paths, which pick tokens on the device: `device_tokens` (`generate`:
each token read back one step behind) and `decode_tokens` (the bench: read back at the end). The device keeps the truth — `seq_len` (tokens in the KV cache) and the
token history — and the engine mirrors `n_past`. Between calls the history holds exactly the
sequence (`n_tokens == seq_len`); a step reads its input token at history[seq_len].
"""

from __future__ import annotations

import time
from typing import Iterator, Sequence

import numpy as np

from strata.engine.cuda import prompt_steps
from strata.engine.cuda.decode import DecodeStep
from strata.engine.cuda.model import CudaModel
from strata.engine.cuda.prefill import PromptRun
from strata.engine.cuda.run_ahead import (TokenRing, clear_nan, device_params, nan_error, picks,
                                          put_params, run_ahead, step_mode)
from strata.engine.engine import ContextFullError, Engine, kept_positions
from strata.engine.interrupt import checkpoint
from strata.engine.sampler import SamplingParams
from strata.experts import DecodeHits, PrefillTraffic
from strata.plan import check_runtime_use, runtime_use


class CudaEngine(Engine):
    """qwen3moe on one GPU, exactly within its plan (see `strata.engine.cuda`)."""

    backend = "cuda"

    def __init__(self, model: CudaModel, *, use_graph: bool = True, miss_path: str | None = None,
                 miss_share: float | None = None):
        self.m = model
        self.shape = model.shape
        self.max_context = model.plan.kv.max_context
        self.use_graph = use_graph
        self.step = DecodeStep(model, use_graph=use_graph,
                               miss_path=miss_path or model.options.miss_path,
                               miss_share=model.options.miss_share if miss_share is None
                               else miss_share)
        self.traffic = PrefillTraffic()
        self.n_prompts = 0
        self.last_prompt_use = None
        self.n_adaptive_swaps = 0  # --adaptive-cache: slots swapped after prompts
        # prompts up to this many tokens run as decode steps (`prompt_steps`); the plan's
        # estimate prices misses as mapped reads, so the CPU pool's paths take it only if given
        given = model.options.prompt_steps
        self.prompt_steps = (0 if given is None and self.step.miss_path != "mapped"
                             else prompt_steps.limit(given, model.plan))
        self.n_step_prompts = 0  # prompts that ran as decode steps
        self._n_past = 0
        self._logits = np.zeros(model.shape.n_vocab, np.float32)  # [n_vocab] f32 host copy
        self._one = np.zeros(1, np.int32)
        self.reset()

    @property
    def n_past(self) -> int:
        return self._n_past

    def reset(self) -> None:
        self._n_past = 0
        self._set_lengths(0, 0)

    def rewind(self, n_keep: int) -> None:
        """Keep the sequence's first `n_keep` positions; the next prefill appends after them
        (the KV cache and the device's token history are positional: what lay past them is
        overwritten as it is recomputed). A chat's next turn computes only what it adds."""
        self._n_past = kept_positions(n_keep, self._n_past)
        self._set_lengths(self._n_past, self._n_past)

    def _set_lengths(self, seq_len: int, n_tokens: int) -> None:
        a, st = self.m.acts, self.m.stream
        a["seq_len"].copy_to_device(np.array([seq_len], np.int32), stream=st)
        a["n_tokens"].copy_to_device(np.array([n_tokens], np.int32), stream=st)

    # -- prompt ------------------------------------------------------------------------------

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        ids = self.check_tokens(tokens)
        m = self.m
        if ids.size <= self.prompt_steps:  # a short prompt: decode steps (`prompt_steps`)
            prompt_steps.feed(self.step, ids, self._n_past)
            self._n_past += int(ids.size)
            self.last_prompt_use = None
            self.n_step_prompts += 1
            self._set_lengths_host_only()
            self.n_prompts += 1
            return self._read_logits()
        use = check_runtime_use(m.plan, runtime_use(m.plan, int(ids.size)))
        self.last_prompt_use = use
        if use.mode == "borrowed":
            m.cache.lend(use.lend_slots)  # misses on the device before any buffer is written
        try:
            P, R = m.arena.prompt_views(use)
            run = PromptRun(m, P, R, use.chunk, self.traffic)
            for off in range(0, ids.size, use.chunk):
                if off:
                    checkpoint()  # a cancelled request's prompt stops here (`interrupt`)
                part = ids[off:off + use.chunk]
                run.chunk_step(part, self._n_past)
                self._n_past += int(part.size)
        finally:
            m.cache.refill()
        if m.adaptive is not None:  # between requests, outside any graph
            self.n_adaptive_swaps += m.adaptive.adapt(m.cache)
        self._set_lengths_host_only()
        self.n_prompts += 1
        return self._read_logits()

    def _set_lengths_host_only(self) -> None:
        # seq_len advanced on the device; the history now holds n_past tokens
        self.m.acts["n_tokens"].copy_to_device(np.array([self._n_past], np.int32),
                                               stream=self.m.stream)

    def _read_logits(self) -> np.ndarray:
        self.m.acts["logits"][0].copy_to_host(self._logits, stream=self.m.stream)
        self.m.stream.synchronize()
        return self._logits.copy()

    # -- decode --------------------------------------------------------------------------------

    def decode_step(self, token: int) -> np.ndarray:
        self.check_tokens([token])
        a, st, p = self.m.acts, self.m.stream, self._n_past
        self._one[0] = token
        a["history"][0][p:p + 1].copy_to_device(self._one, stream=st)
        a["n_tokens"].copy_to_device(np.array([p + 1], np.int32), stream=st)
        self.step.run("logits")
        self._n_past += 1
        return self._read_logits()

    picks = staticmethod(picks)  # the samplings `device_tokens` draws as the host does

    def device_tokens(self, sampling: SamplingParams | None, limit: int) -> Iterator[int]:
        """Up to `limit` tokens picked on the device, one at a time, the first from the current
        logits (after `prefill`): a generator for `generate`, read back one step behind
        (`run_ahead`). Closing it takes back a step that fed the last token read: `n_past` then
        counts the tokens fed, as `decode_step` leaves it. Stops early where the context holds
        no more tokens."""
        if self._n_past == 0:
            raise ValueError("device_tokens needs a prefilled sequence")
        mode = self.set_sampling(sampling)
        st, hist, start, ring = self.m.stream, self.m.acts["history"][0], self._n_past, TokenRing()
        nan = self.step.nan_flag
        clear_nan(nan, st)

        def first():
            self.step.pick(mode, st)
            return ring.fetch(hist, start, 0, st, nan)

        def step(i):
            self.step.run(mode)  # feeds token i, picks token i + 1
            self._n_past += 1
            return ring.fetch(hist, start + i + 1, i + 1, st, nan)

        def finish(undo):
            self._n_past -= int(undo)
            self._set_lengths(self._n_past, self._n_past)
            st.synchronize()

        return run_ahead(limit=limit, first=first, step=step, read=ring.read, finish=finish,
                         can_step=lambda: self._n_past < self.max_context)

    def decode_tokens(self, n: int, sampling: SamplingParams | None = None) -> list[int]:
        """Pick `n` tokens on the device, the first from the current logits (after `prefill`
        or a step), each next one after a device step; returns them (read back once). Greedy
        when `sampling` is None or has temperature 0."""
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        if self._n_past == 0:
            raise ValueError("decode_tokens needs a prefilled sequence")
        if self._n_past + n - 1 > self.max_context:
            raise ContextFullError(f"{n} tokens after {self._n_past} exceed the context of "
                                   f"{self.max_context}")
        mode = self.set_sampling(sampling)
        a, st, start = self.m.acts, self.m.stream, self._n_past
        nan = self.step.nan_flag
        clear_nan(nan, st)
        self.step.pick(mode, st)
        for _ in range(n - 1):
            self.step.run(mode)
            self._n_past += 1
        out = np.zeros(n, np.int32)
        seen = np.zeros(1, np.uint64)
        a["history"][0][start:start + n].copy_to_host(out, stream=st)
        nan.copy_to_host(seen, stream=st)
        a["n_tokens"].copy_to_device(np.array([self._n_past], np.int32), stream=st)
        st.synchronize()
        if seen[0]:
            raise nan_error(f"one of {n} steps")
        return [int(t) for t in out]

    def set_sampling(self, sampling: SamplingParams | None) -> str:
        """The decode mode for `sampling` ("greedy" or "sample"), its parameters on the device.
        Greedy with a penalty is the sampler's: it takes the arg-max of the penalised logits
        (the argmax kernel sees them as they are)."""
        if step_mode(sampling) == "greedy":
            return "greedy"
        seed = sampling.seed if sampling.seed is not None else int(time.time_ns())
        put_params(self.m.acts, 0, device_params(sampling, seed, self.shape.n_vocab),
                   self.m.stream)
        return "sample"

    def set_miss_path(self, miss_path: str, *, miss_share: float | None = None) -> None:
        """Serve decode misses by mapped reads ("mapped"), the CPU pool ("cpu") or both
        ("hybrid", the pool's share `miss_share`, None: from measured rates) from the next step
        on (the bench measures them on one loaded model)."""
        if miss_path != self.step.miss_path or miss_path == "hybrid":
            self.step = DecodeStep(self.m, use_graph=self.use_graph, miss_path=miss_path,
                                   miss_share=miss_share)

    # -- accounting ----------------------------------------------------------------------------

    def hits(self) -> DecodeHits:
        """The device's per-layer decode hit/miss counters (cumulative)."""
        out = np.zeros((self.shape.n_layer, 2), np.int64)
        self.m.acts["hit_counts"].copy_to_host(out, stream=self.m.stream)
        self.m.stream.synchronize()
        return DecodeHits(out)

    def synchronize(self) -> None:
        self.m.stream.synchronize()
