"""`CudaBatchEngine`: up to N sequences on the GPU, decoded together (`strata serve --batch N`).

The plan is made for `batch` N, so its KV region holds N sequences of `max_context` tokens
([L, N * T, H, row]) and its session buffers N rows; the engine carves the KV
region into N equal row regions. A sequence lives in a row: its KV region, its position
(seq_len[r]) and its token history (history[r]). Active sequences always fill rows 0..n-1, so a
step runs one captured graph per row count n; when a sequence has left a row below the last, the
last row's state (KV up to its length, history, position) moves into it before the next prefill
or step.

The prompt path (`PromptRun`) runs one sequence at a time through a row view of the model: the
same buffers, with the session's per-sequence entries and the KV sides narrowed to one row.

A step of one row runs the single engine's fused launches (`DecodeStep` on row 0: one client
of `strata serve` decodes as fast as `strata generate`), whose 8-bit x rounds as the batched
kernels' float32 x does not: a sequence's logits then depend, by that rounding, on whether
others share its steps. `invariant=True` (`strata serve --batch-invariant`) runs one row through
the batched kernels' float32 path instead, so a sequence gets the same bits alone and in any
batch (slower alone: 3.67 ms a step against 2.41 on the H200's 30B-A3B).

It is the serve worker's `BatchEngine`: `prefill(slot, tokens)`, `decode(slots, tokens)`,
`release(slot)`; slots are the worker's names for sequences, rows the engine's. Where every held
sequence samples by settings the device draws as the host would (`picks`), `decode_picked`
chooses their tokens on the device in the same step and copies back n tokens instead of n rows of
logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from numba import cuda

from strata.cuda_kernels.kvcache import KvLayout, KvSide
from strata.cuda_kernels.sampling import FLAG_NAN, FLAG_PAST, MAX_BIAS, N_FPARAMS, N_IPARAMS
from strata.engine.cuda import prompt_steps
# the options' names, where serve and the tests have always imported them from
from strata.engine.cuda.batch_options import (  # noqa: F401
    MAX_BATCH, BatchOptions, batch_options, default_context)
from strata.engine.cuda.batch_step import BatchStep
from strata.engine.cuda.decode import DecodeStep
from strata.engine.cuda.model import CudaModel
from strata.engine.cuda.options import CudaEngineError
from strata.engine.cuda.prefill import PromptRun
from strata.engine.cuda.row_view import RowModel
from strata.engine.cuda.run_ahead import device_params, may_fall_back, picks
from strata.engine.cuda.rows import RowTable
from strata.engine.engine import ContextFullError, EngineInputError, PromptRecord
from strata.engine.interrupt import PrefillInterrupted, checkpoint
from strata.engine.sampler import SamplingParams
from strata.experts import PrefillTraffic
from strata.gguf import ModelFile
from strata.plan import check_runtime_use, runtime_use


class CudaBatchEngine:
    """N sequences decoded together on one GPU (see the module doc; `invariant`: one row runs
    the batched kernels' float32 path, not the single engine's fused 8-bit-x step)."""

    backend = "cuda"

    def __init__(self, m: CudaModel, *, use_graph: bool = True, invariant: bool = False):
        self.m = m
        self.shape = s = m.shape
        self.n_slots = n = m.plan.options.batch
        if not 1 <= n <= MAX_BATCH:
            raise CudaEngineError(f"the plan's batch {n} is outside 1..{MAX_BATCH}")
        if m.plan.kv.n_seq != n or m.plan.kv.host_bytes:
            raise CudaEngineError(f"the batch engine needs the plan's KV to hold {n} whole "
                                  f"contexts in VRAM (plan: {m.plan.kv.n_seq} sequences, "
                                  f"{m.plan.kv.resident_tokens} of {m.plan.kv.max_context} "
                                  f"tokens resident): drop --kv-resident")
        self.max_context = m.plan.kv.resident_tokens
        self.sides = self._carve_rows()
        self.step = BatchStep(m, self.sides, use_graph=use_graph)
        self.set_invariant(invariant)
        self.traffic = PrefillTraffic()
        self.rows = RowTable(n, self._copy_kv, self._move_row)  # slots, rows, what KV holds
        self._logits = _host_buffer((n, s.n_vocab), np.float32)  # [n_slots, n_vocab] f32
        self._tok = _host_buffer((n,), np.int32)  # [n_slots] i32 staging of input tokens
        # [2, n_slots] i32 tokens picked on the device, and [2, n_slots, 3] the picks' states:
        # two sets, so a step run ahead copies its own while the one before is read
        self._picked = _host_buffer((2, n), np.int32)
        self._flags = _host_buffer((2, n, 3), np.uint64)
        self._done = (cuda.event(), cuda.event())  # each set's copies finished
        self._buf = 0  # the set the next picked step copies into
        self._chain: list[int] | None = None  # slots of the last step, all picked on the device
        self._open: list[int] = []  # result sets of steps begun and not ended, oldest first
        self.n_reused = 0  # prompt tokens the last prefill found in KV (its row's or copied)
        self._fparams = _host_buffer((n, N_FPARAMS), np.float32)  # [n_slots, 6] rows' sampling
        self._iparams = _host_buffer((n, N_IPARAMS), np.int64)  # [n_slots, 4]
        self._bias_ids = _host_buffer((n, MAX_BIAS), np.int32)  # [n_slots, MAX_BIAS] i32
        self._bias_vals = _host_buffer((n, MAX_BIAS), np.float32)  # [n_slots, MAX_BIAS] f32
        self._hits = _host_buffer((s.n_layer, 2), np.int64)  # [n_layer, 2] i64, after each step
        # rows 0..k-1 of the logits, device and host, per row count k: sliced here once, since
        # a device array's slice costs tens of microseconds of Python on every step
        self._logit_rows = {k: (m.acts["logits"][:k], self._logits[:k]) for k in range(1, n + 1)}
        a = m.acts  # and the same for the picked path's settings and tokens
        self._pick_rows = {k: (a["sample_fparams"][:k], a["sample_iparams"][:k],
                               a["step_tokens"][:k], a["pick_state"][:k],
                               a["sample_bias_ids"][:k], a["sample_bias_vals"][:k])
                           for k in range(1, n + 1)}
        self._row_sampling: list[SamplingParams | None] = [None] * n  # what each row's are
        self._logit_row = [a["logits"][r] for r in range(n)]  # [n_vocab] f32 each
        # prompts up to this many tokens run as decode steps of their row (`prompt_steps`), by
        # a `DecodeStep` over that row's view (graphs captured per row on its second use)
        self.prompt_steps = prompt_steps.limit(m.options.prompt_steps, m.plan)
        self._row_steps: dict[int, DecodeStep] = {}
        self.n_step_prompts = 0  # prompts (or their new tokens) that ran as decode steps

    def _carve_rows(self) -> list[list[tuple[KvSide, KvSide]]]:
        """The plan's KV region [L, n * T, H, row] as n row regions of T tokens per layer."""
        m, s, n, t = self.m, self.shape, self.n_slots, self.max_context
        kv = m.arena.views("kv")
        lay = KvLayout(m.kv_layout.fmt, t, s.n_head_kv, s.head_dim)
        spare = m.kv_sides[0][0].scale  # f16/q4_0: the placeholder the kernels never read
        rows = []
        for r in range(n):
            per_layer = []
            for il in range(s.n_layer):
                pair = []
                for side in ("k", "v"):
                    data = kv[side][il][r * t:(r + 1) * t].reshape(-1)
                    scale = (kv[side + "_scale"][il][r * t:(r + 1) * t].reshape(-1)
                             if lay.fmt == "int8" else spare)
                    pair.append(KvSide(lay, data, scale))
                per_layer.append(tuple(pair))
            rows.append(per_layer)
        return rows

    def set_invariant(self, invariant: bool) -> None:
        """How a step of one row runs (see the class): the batched kernels' float32 path
        (True), or the single engine's launches on row 0's view. Its graphs are captured again."""
        self.invariant = invariant
        self.step.one = None if invariant else DecodeStep(self._row_view(0), use_graph=False)
        for key in (1, ("pick", 1)):
            self.step.graphs.pop(key, None)
            self.step._warm.discard(key)

    # -- slots and rows ----------------------------------------------------------------------

    @property
    def n_active(self) -> int:
        return self.rows.n_active

    def _check_ids(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise EngineInputError("tokens must be a non-empty list of integer ids")
        bad = ids[(ids < 0) | (ids >= self.shape.n_vocab)]
        if bad.size:
            raise EngineInputError(f"token id {int(bad[0])} is outside the vocabulary "
                                   f"(0..{self.shape.n_vocab - 1})")
        return ids.astype(np.int32)

    keeps_prefix = True  # `release` takes the tokens a sequence fed, for the next prefill

    def release(self, slot: int, tokens: Sequence[int] | None = None) -> None:
        """The slot's sequence is over (`RowTable.release`: its row keeps the first tokens of
        `tokens` its KV holds, for a later prompt that shares them)."""
        self.rows.release(slot, tokens)
        self._chain = None

    def _move_row(self, src: int, dst: int, n_tok: int) -> None:
        """Row src's sequence into row dst on the device: KV up to n_tok, history, position."""
        a, st = self.m.acts, self.m.stream
        self._copy_kv(src, dst, n_tok)
        a["history"][dst].copy_to_device(a["history"][src], stream=st)
        a["seq_len"][dst:dst + 1].copy_to_device(a["seq_len"][src:src + 1], stream=st)

    def _copy_kv(self, src: int, dst: int, n_tok: int) -> None:
        """Positions 0..n_tok-1 of row src into row dst: every layer's K and V (and int8
        scales), and the history's tokens."""
        m, st = self.m, self.m.stream
        n_rows = n_tok * self.shape.n_head_kv
        for il in range(self.shape.n_layer):
            for s_side, d_side in zip(self.sides[src][il], self.sides[dst][il]):
                nb = n_rows * s_side.layout.row_bytes
                if nb:
                    d_side.data[:nb].copy_to_device(s_side.data[:nb], stream=st)
                if s_side.layout.fmt == "int8" and n_rows:
                    d_side.scale[:n_rows].copy_to_device(s_side.scale[:n_rows], stream=st)
        if n_tok:
            hist = m.acts["history"]
            hist[dst][:n_tok].copy_to_device(hist[src][:n_tok], stream=st)

    # -- prompt ------------------------------------------------------------------------------

    def prefill(self, slot: int, tokens: Sequence[int], *, reuse: bool = True) -> np.ndarray:
        """Start a sequence in `slot` (dropping what it held) from `tokens`; [n_vocab] f32
        logits of the token that follows them. `reuse`: take the K/V rows hold of its prefix
        (`RowTable.place`); False: compute the whole prompt (`--no-prefix-cache`)."""
        self.rows.check_slot(slot)
        ids = self._check_ids(tokens)
        if ids.size > self.max_context:
            raise ContextFullError(f"the prompt has {ids.size} tokens but the context holds "
                                   f"{self.max_context} (raise --max-context)")
        self.release(slot)
        row, common, record = self.rows.place(slot, ids, reuse)
        m = self.m
        m.acts["seq_len"][row:row + 1].copy_to_device(np.array([common], np.int32),
                                                     stream=m.stream)
        self.rows.n_past[row] = self.n_reused = common
        if common == ids.size:  # a recorded prompt: its KV taken, nothing computed
            logits = record.logits
        else:
            try:
                self._prompt(row, ids[common:])
            except PrefillInterrupted:  # the chunks run stay the row's: `release` with
                raise  # the prompt keeps them for a retry of the request
            except BaseException:
                self.release(slot)
                raise
            m.acts["logits"][row].copy_to_host(self._logits[row], stream=m.stream)
            logits = self._logits[row]
        m.stream.synchronize()
        self.rows.prompts[row] = PromptRecord.of(ids, logits)
        return np.array(logits)

    def _prompt(self, row: int, ids: np.ndarray) -> None:
        m = self.m
        if ids.size <= self.prompt_steps:
            step = self._row_steps.get(row)
            if step is None:
                step = self._row_steps[row] = DecodeStep(self._row_view(row),
                                                         use_graph=self.step.use_graph)
            prompt_steps.feed(step, ids, int(self.rows.n_past[row]))
            self.rows.n_past[row] += ids.size
            self.n_step_prompts += 1
            return
        use = check_runtime_use(m.plan, runtime_use(m.plan, int(ids.size)))
        if use.mode == "borrowed":
            m.cache.lend(use.lend_slots)
        try:
            P, R = m.arena.prompt_views(use)
            run = PromptRun(self._row_view(row), P, R, use.chunk, self.traffic)
            for off in range(0, ids.size, use.chunk):
                if off:
                    checkpoint()  # a cancelled request's prompt stops here (`interrupt`)
                part = ids[off:off + use.chunk]
                run.chunk_step(part, int(self.rows.n_past[row]))
                self.rows.n_past[row] += part.size
        finally:
            m.cache.refill()

    def row_model(self, slot: int) -> Any:
        """The model seen through `slot`'s row (what the prompt path runs on)."""
        return self._row_view(self.rows.row_of[slot])

    def _row_view(self, row: int) -> RowModel:
        return RowModel(self.m, row, self.sides[row], len(self.step.partials[row][0]))

    # -- decode --------------------------------------------------------------------------------

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Append one token to every held sequence in one step; `slots` must name each held
        sequence once. Returns [len(slots), n_vocab] f32 logits in the order of `slots`."""
        rows = self._step_rows(slots, tokens)
        self._chain = None  # this step picks nothing: step_tokens keeps its inputs
        n = len(rows)
        if n == 0:
            return np.zeros((0, self.shape.n_vocab), np.float32)
        st = self.m.stream
        self.step.run(n)
        dev, host = self._logit_rows[n]
        dev.copy_to_host(host, stream=st)
        self.m.acts["hit_counts"].copy_to_host(self._hits, stream=st)
        st.synchronize()
        self.rows.n_past[:n] += 1
        # one host copy, the caller's own (the pinned buffer is refilled by the next step)
        return host.copy() if rows == list(range(n)) else self._logits[rows]

    @staticmethod
    def picks(p: SamplingParams | None) -> bool:
        """Whether a step draws a sequence of settings `p` on the device as the host would:
        what `generate` picks there (`run_ahead.picks`), and a top-p or min-p cut over every
        token (top-k 0), which the device draws from its 256 best and every token's mass, and
        hands back as logits for the host where the cut lies past them (`may_fall_back`)."""
        return picks(p) or may_fall_back(p)

    may_fall_back = staticmethod(may_fall_back)

    def decode_picked(self, slots: Sequence[int], tokens: Sequence[int],
                      sampling: Sequence[SamplingParams | None]) -> list[int | np.ndarray]:
        """One step as `decode`, each held sequence's next token then chosen on the device by
        its `sampling` (one per slot, each one `picks` accepts, with a seed: the draw's random
        number is a hash of (seed, position)), or, where it is None, left to the caller: that
        sequence's [n_vocab] f32 logits. Returns, in the order of `slots`, each token (-1 for a
        sequence whose logits held a NaN: no token is picked from them, and the caller ends
        it, as the host `Sampler` refuses such logits) or logits row (also where a top-p /
        min-p cut over every token lay past the device's 256 candidates: `may_fall_back`)."""
        return self.end_picked(self.begin_picked(slots, tokens, sampling))

    def begin_picked(self, slots: Sequence[int], tokens: Sequence[int] | None,
                     sampling: Sequence[SamplingParams | None]) -> PickedStep:
        """Enqueue `decode_picked`'s step and the copies of its results; `end_picked` waits
        for them. `tokens` None: the step is fed the tokens the last step picked, on the device
        (a step run ahead: the last step's slots, every token picked on the device, nothing
        prefilled or released since), so it may be enqueued before that step's tokens are read.
        At most two picked steps are begun and not yet ended."""
        if len(sampling) != len(slots):
            raise ValueError(f"{len(slots)} slots but {len(sampling)} sampling settings")
        host = list(sampling)  # None: the caller chooses that token, from its logits
        sampling = [_GREEDY_STAND_IN if p is None else p for p in host]
        for p in sampling:
            if not self.picks(p):
                raise ValueError(f"the device does not draw {p} as the host does (greedy, "
                                 f"top-k 0..256, a penalty window within the sampler's "
                                 f"block, no logit bias)")
            if p.seed is None and not p.greedy:
                raise ValueError("a sampled sequence needs a seed on the device")
        if len(self._open) == 2:
            raise RuntimeError("two picked steps are open: end the older before beginning another")
        if tokens is None and any(may_fall_back(p) for p in host):
            raise ValueError("a step fed on the device cannot hold a top-p / min-p cut over every "
                             "token: its token may be the host's")
        rows = self._fed_rows(slots) if tokens is None else self._step_rows(slots, tokens)
        n = len(rows)
        if n == 0:
            return PickedStep([], [], [], -1)
        st, b = self.m.stream, self._buf
        dev_f, dev_i, dev_tok, dev_state, dev_bid, dev_bval = self._pick_rows[n]
        # settings are copied to the device only when a row's change (and marked as copied
        # once they are); the bias tables only where a changed row has one (a row without
        # reads none of its table: its iparams say 0 entries)
        changed = [(r, p) for r, p in zip(rows, sampling) if self._row_sampling[r] != p]
        biased = any(p.logit_bias for _, p in changed)
        for r, p in changed:
            (self._fparams[r], self._iparams[r], self._bias_ids[r],
             self._bias_vals[r]) = device_params(p, p.seed or 0, self.shape.n_vocab)
        if changed:
            dev_f.copy_to_device(self._fparams[:n], stream=st)
            dev_i.copy_to_device(self._iparams[:n], stream=st)
            if biased:
                dev_bid.copy_to_device(self._bias_ids[:n], stream=st)
                dev_bval.copy_to_device(self._bias_vals[:n], stream=st)
            for r, p in changed:
                self._row_sampling[r] = p
        self.step.run(n, pick=True)
        dev_tok.copy_to_host(self._picked[b, :n], stream=st)
        dev_state.copy_to_host(self._flags[b, :n], stream=st)
        for r, h in zip(rows, host):  # the rows left to the caller: their logits
            if h is None:
                self._logit_row[r].copy_to_host(self._logits[r], stream=st)
        self.m.acts["hit_counts"].copy_to_host(self._hits, stream=st)
        self._done[b].record(st)
        self.rows.n_past[:n] += 1
        self._buf = 1 - b
        self._open.append(b)
        # the step's picks are in step_tokens: the next step may be fed from there (not where
        # a row's token may come from the host after all)
        self._chain = (list(slots) if all(h is not None and not may_fall_back(h) for h in host)
                       else None)
        return PickedStep(list(slots), rows, host, b)

    def end_picked(self, step: PickedStep) -> list[int | np.ndarray]:
        """Wait for `step`'s results and return them as `decode_picked` does."""
        if step.buf < 0:
            return []
        if not self._open or self._open[0] != step.buf:
            raise RuntimeError("picked steps end in the order they were begun, once each")
        self._open.pop(0)
        self._done[step.buf].synchronize()
        picked, flags = self._picked[step.buf], self._flags[step.buf]
        nan = (flags[:, 2] & FLAG_NAN) != 0
        past = (flags[:, 2] & FLAG_PAST) != 0  # a cut past the 256 best: the host draws
        if (nan | past)[step.rows].any():  # cleared for the rows' next steps (the rest is zero)
            st = self.m.stream
            dev_state = self._pick_rows[self.n_slots][3]
            dev_state.copy_to_device(np.zeros(dev_state.shape, np.uint64), stream=st)
            for r in step.rows:  # no step ran after this one (none is fed on the device)
                if past[r] and not nan[r]:
                    self._logit_row[r].copy_to_host(self._logits[r], stream=st)
            st.synchronize()
        bad = [(s, int(picked[r])) for s, r, h in zip(step.slots, step.rows, step.host)
               if h is not None and not nan[r] and not past[r]
               and not 0 <= picked[r] < self.shape.n_vocab]
        if bad:  # never a wrong token: a row whose history had no room picks none
            raise CudaEngineError(f"slot {bad[0][0]}: the device picked no token ({bad[0][1]})")
        return [np.array(self._logits[r]) if h is None or (past[r] and not nan[r])
                else -1 if nan[r] else int(picked[r]) for r, h in zip(step.rows, step.host)]

    def drop_picked(self) -> None:
        """Forget the picked steps begun and not ended (their results unread: a caller that
        failed between the two), once the device has finished them; and any KV kept for reuse."""
        self.m.stream.synchronize()
        self._open.clear()
        self._chain = None
        self.rows.forget()

    def _fed_rows(self, slots: Sequence[int]) -> list[int]:
        """The rows of a step fed from the device (`begin_picked` without tokens)."""
        if self._chain is None or list(slots) != self._chain:
            raise ValueError(f"a step fed on the device follows a step of the same sequences "
                             f"(slots {self._chain}) whose every token was picked on the "
                             f"device, with nothing prefilled or released since; got {list(slots)}")
        return self.rows.rows_with_room(slots, self.max_context)

    def _step_rows(self, slots: Sequence[int], tokens: Sequence[int]) -> list[int]:
        """Check a step's slots and tokens, compact the rows, and stage the input tokens (one
        copy of all rows' to the device); the rows of `slots`, in their order."""
        if len(slots) != len(tokens):
            raise ValueError(f"{len(slots)} slots but {len(tokens)} tokens")
        held = sorted(self.rows.row_of)
        if sorted(slots) != held:
            raise ValueError(f"a step decodes every held sequence: slots {sorted(slots)} given, "
                             f"{held} held")
        ids = self._check_ids(tokens) if len(tokens) else np.zeros(0, np.int32)
        if not slots:
            return []
        self.rows.compact()
        rows = self.rows.rows_with_room(slots, self.max_context)
        self._tok[rows] = ids
        # every row's token in one copy (rows n.. carry stale ones the step never reads); the
        # step writes each at its row's position (`scatter_tokens`, inside the graph)
        self.m.acts["step_tokens"].copy_to_device(self._tok, stream=self.m.stream)
        return rows

    def hit_counts(self) -> np.ndarray:
        """The per-layer decode [hits, misses] expert counters (cumulative) as of the last step:
        int64 [L, 2], a host copy (safe to read from any thread: no GPU call)."""
        return np.array(self._hits)


@dataclass(slots=True)
class PickedStep:
    """A step `begin_picked` enqueued: its slots, their rows, each one's settings (None: its
    logits go to the caller) and the host result set its copies land in (-1: no step)."""

    slots: list[int]
    rows: list[int]
    host: list[SamplingParams | None]
    buf: int


# the device's settings for a row whose token the caller chooses from its logits (any the
# sampler takes: its pick is overwritten by the caller's token at the next step)
_GREEDY_STAND_IN = SamplingParams(temperature=0.0)


def _host_buffer(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Pinned host memory (async copies at full PCIe speed); plain numpy under the simulator."""
    from strata.cuda_kernels.intrinsics import SIMULATED
    return np.zeros(shape, dtype) if SIMULATED else cuda.pinned_array(shape, dtype)


def load_batch(model: ModelFile, options: BatchOptions, *, log: Callable[[str], None] | None
               = None, backend=None, invariant: bool = False) -> CudaBatchEngine:
    """Plan and load `model` for `options.plan.batch` sequences and return the engine
    (`invariant`: a sequence's bits do not depend on the others in its steps; see the class)."""
    engine = CudaBatchEngine(CudaModel(model, options, backend=backend, log=log),
                             use_graph=options.graph, invariant=invariant)
    if log is not None:
        n = engine.prompt_steps
        log(f"short prompts: up to {n} tokens run as decode steps (--prompt-steps)" if n else
            "short prompts: every prompt takes the prompt path (--prompt-steps 0)")
    return engine
