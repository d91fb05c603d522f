"""Routing profiles: per-(layer, expert) routing counts, recorded by running prompts, saved as
the file `--profile` reads, and the cache's fill order they give.

File format: a numpy `.npy` file holding int64 [n_layer, n_expert]: how many times each layer
routed a token to each expert (every prompt token and every generated token counted once per
layer and chosen expert). `strata.plan.knobs.load_profile` reads it into a `RoutingProfile`.

Where a plan gets its ranking (`profile_source` says which, for the start-up report): the
profile file when given, else the synthetic file's `strata.synth.expert_rank` metadata (the
skew the synthesizer built in), else uniform ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from strata.errors import StrataError
from strata.plan.profile import EXPERT_RANK_KEY, RoutingProfile


class ProfileError(StrataError):
    """A profile file that cannot be used for this model."""


class RoutingCounts:
    """Accumulates routing choices: `counts` int64 [n_layer, n_expert]."""

    def __init__(self, n_layer: int, n_expert: int):
        if n_layer < 1 or n_expert < 1:
            raise ValueError(f"need at least one layer and one expert, got {n_layer}, {n_expert}")
        self.counts = np.zeros((n_layer, n_expert), np.int64)
        self.n_tokens = 0  # tokens seen by layer 0

    def add(self, layer: int, ids: np.ndarray) -> None:
        """Count the experts `ids` (int [n_tok, k]) chose in `layer`."""
        ids = np.asarray(ids).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.counts.shape[1]):
            raise ValueError(f"expert ids outside 0..{self.counts.shape[1] - 1}")
        np.add.at(self.counts[layer], ids.astype(np.int64), 1)
        if layer == 0:
            self.n_tokens += int(np.asarray(ids).size)

    def callback(self):
        """An engine callback (`cb(name, layer, tensor)`) that counts each layer's top-k."""
        def cb(name: str, layer: int, tensor) -> None:
            if name == "ffn_moe_topk":
                self.add(layer, tensor)
        return cb

    def profile(self) -> RoutingProfile:
        n_l, n_e = self.counts.shape
        return RoutingProfile.from_counts(self.counts, n_l, n_e)

    def save(self, path: str | Path) -> Path:
        """Write the counts as a .npy file (the name gets .npy if it lacks it)."""
        p = Path(path)
        if p.suffix != ".npy":
            p = p.with_name(p.name + ".npy")
        np.save(p, self.counts, allow_pickle=False)
        return p


def load_counts(path: str | Path, n_layer: int, n_expert: int) -> np.ndarray:
    """The counts of a profile file, checked against the model's [n_layer, n_expert]."""
    try:
        c = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ProfileError(f"{path}: not a routing profile .npy file ({e})") from None
    if c.shape != (n_layer, n_expert):
        raise ProfileError(f"{path}: routing counts are {list(c.shape)}, this model needs "
                           f"[{n_layer}, {n_expert}] (recorded on another model?)")
    if not np.issubdtype(c.dtype, np.number) or not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ProfileError(f"{path}: counts must be finite non-negative numbers")
    return c


def profile_source(metadata, profile_path: str | None) -> str:
    """Which source a plan's ranking came from, in words."""
    if profile_path:
        return f"routing profile {profile_path}"
    if metadata.get(EXPERT_RANK_KEY) is not None:
        return "the synthetic file's skew metadata (strata.synth.expert_rank)"
    return "uniform ranks (no profile, no skew metadata)"


def read_prompt_lines(path: str | Path) -> list[tuple[int, str]]:
    """(line number from 1, prompt) for each non-empty line of a UTF-8 text file: a prompt the
    run refuses is named by its line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"--prompts {path}: cannot read it as UTF-8 text ({e})") from None
    prompts = [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not prompts:
        raise ProfileError(f"--prompts {path}: no prompts (one per line)")
    return prompts


def read_prompts(path: str | Path) -> list[str]:
    """One prompt per non-empty line of a UTF-8 text file."""
    return [p for _, p in read_prompt_lines(path)]


@dataclass(frozen=True, slots=True)
class Recorded:
    """What `record` ran: `tokens` counted (prompts and generated), and `cut_short`, how many
    prompts reached the end of the context before their `n_predict` tokens."""

    tokens: int
    cut_short: int


def record(engine, prompts: Iterable[Sequence[int]], counts: RoutingCounts, *,
           n_predict: int = 0) -> Recorded:
    """Run each tokenized prompt, whole, and up to `n_predict` greedy tokens after it through
    `engine`, whose callback feeds `counts`, as `strata generate` runs one: a prompt longer than
    the context is refused by the engine (ContextFullError), the generated tokens stop where
    the context ends."""
    n = short = 0
    for ids in prompts:
        ids = list(ids)
        engine.reset()
        logits = engine.prefill(ids)
        n += len(ids)
        for _ in range(n_predict):
            if engine.n_past >= engine.max_context:
                short += 1
                break
            logits = engine.decode_step(int(np.argmax(logits)))
            n += 1
    return Recorded(n, short)


def coverage_table(counts: np.ndarray, fractions: Sequence[float] = (0.25, 0.5)) -> np.ndarray:
    """Per layer, the share of routed tokens the hottest `fractions` of experts receive:
    float64 [n_layer, len(fractions)]."""
    c = np.sort(np.asarray(counts, np.float64), axis=1)[:, ::-1]
    tot = np.maximum(c.sum(axis=1, keepdims=True), 1)
    cum = np.cumsum(c, axis=1) / tot
    n_e = c.shape[1]
    cols = [cum[:, max(1, int(round(f * n_e))) - 1] for f in fractions]
    return np.stack(cols, axis=1)
