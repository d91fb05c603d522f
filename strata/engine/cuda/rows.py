"""`RowTable`: which sequence lives in which KV row of the batch engine, and what each row's KV
holds for the next prompt. Host bookkeeping only; the device work (copying a row's K/V and
state) is the two callables the engine gives it, so the rules are tested without a GPU.

Rows: a slot (the serve worker's name for a sequence) lives in a row; held sequences fill rows
0..n-1 before a step (`compact`), the last row's moving into each vacant one. A released row
keeps the tokens its KV holds (`kept`) until a move overwrites it, and a row keeps its
sequence's prompt and that prefill's logits (`prompts`) while its KV holds them, so a new
prompt takes the row, or a copy of the running row, that shares the most of it (`place`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from strata.engine.engine import ContextFullError, PromptRecord, reusable_prefix

# (src row, dst row, n tokens): the device copy of positions 0..n-1 of src's K/V into dst
CopyKv = Callable[[int, int, int], None]
# (src row, dst row, n tokens): src's sequence into dst (its K/V up to n, history, position)
MoveRow = Callable[[int, int, int], None]


class RowTable:
    """Slots to rows for `n_slots` rows; `copy_kv` and `move_row` do the device's part."""

    def __init__(self, n_slots: int, copy_kv: CopyKv, move_row: MoveRow):
        self.n_slots = n_slots
        self.copy_kv, self.move_row = copy_kv, move_row
        self.row_of: dict[int, int] = {}  # slot -> row
        self.slot_at: list[int | None] = []  # row -> slot (None: vacant until compacted)
        self.n_past = np.zeros(n_slots, np.int64)  # tokens in each row's KV
        # per row: the tokens whose K/V a released sequence left there (None: nothing to reuse)
        self.kept: list[list[int] | None] = [None] * n_slots
        # per row: its sequence's prompt and that prefill's logits, while the KV holds them
        self.prompts: list[PromptRecord | None] = [None] * n_slots

    @property
    def n_active(self) -> int:
        return len(self.row_of)

    def check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} out of range 0..{self.n_slots - 1}")

    def release(self, slot: int, tokens: Sequence[int] | None = None) -> None:
        """The slot's sequence is over; its row is refilled (by the last row's sequence) at
        the next `compact`, so sequences ending together move nothing. `tokens`: what the
        sequence fed (its prompt, then its tokens in order; any past what its KV holds are
        ignored): until a move refills the row, a later prompt sharing a prefix with them
        takes this row (`place`) and computes only past it (a chat's next turn)."""
        self.check_slot(slot)
        row = self.row_of.pop(slot, None)
        if row is None:
            return
        self.slot_at[row] = None
        n = int(self.n_past[row])
        self.kept[row] = ([int(t) for t in tokens[:n]]
                          if tokens is not None and len(tokens) >= n else None)
        record = self.prompts[row]
        if record is not None and not record.begins(self.kept[row]):
            self.prompts[row] = None  # nothing kept, or not fed from its prompt

    def forget(self) -> None:
        """Nothing any row's KV holds is reused (after a failed step: it may be half written)."""
        self.kept = [None] * self.n_slots
        self.prompts = [None] * self.n_slots

    def compact(self) -> None:
        """Held sequences into rows 0..n_active-1: the last row's moves into each vacant one."""
        rows = self.slot_at
        while rows and rows[-1] is None:
            rows.pop()
        for row in range(len(rows)):
            if row >= len(rows):
                break
            if rows[row] is None:
                self.move(len(rows) - 1, row)
                rows[row] = rows.pop()
                self.row_of[rows[row]] = row
                while rows and rows[-1] is None:
                    rows.pop()

    def move(self, src: int, dst: int) -> None:
        """Row src's sequence into row dst (what its KV holds, its record with it)."""
        n_tok = int(self.n_past[src])
        self.move_row(src, dst, n_tok)
        self.kept[src] = self.kept[dst] = None  # dst overwritten; src's tokens are the mover's
        self.prompts[dst], self.prompts[src] = self.prompts[src], None
        self.n_past[dst] = n_tok

    def place(self, slot: int, ids: np.ndarray,
              reuse: bool = True) -> tuple[int, int, PromptRecord | None]:
        """The row a new sequence of prompt `ids` takes in `slot`'s name (released before), how
        many of its tokens that row's KV then holds, and the record they came with
        (`reusable_prefix`: where they are all of `ids`, its logits). The vacant row whose kept
        tokens share the longest prefix with `ids` is used: a hole below the held rows is filled
        as it is; a row past them has its KV moved to the next row (a copy, far cheaper than
        the prefill); with none, the rows are compacted and the next one taken. Where a running
        sequence's prompt shares more (a request's `n` choices, one system prompt), the next
        row takes a copy of those positions' KV from its row. `reuse` False: nothing is taken."""
        held = len(self.slot_at)
        best, best_n = -1, 0  # a vacant row
        source, source_n = -1, 0  # a running sequence's slot
        for r in range(self.n_slots if reuse else 0):
            running = r < held and self.slot_at[r] is not None
            n = reusable_prefix(self.prompts[r], self.kept[r], ids, running=running)
            if running and n > source_n:
                source, source_n = self.slot_at[r], n
            elif not running and n > best_n:
                best, best_n = r, n
        if 0 <= best < held and best_n >= source_n:  # a hole: taken as it is
            row = best
            self.slot_at[row] = slot
        else:
            self.compact()  # moves held rows into holes only: a row past them keeps its KV
            row = len(self.slot_at)
            self.slot_at.append(slot)
            if source_n > best_n:
                src = self.row_of[source]
                self.copy_kv(src, row, source_n)
                self.prompts[row], best_n = self.prompts[src], source_n
            elif best > row:
                self.move(best, row)
        self.row_of[slot] = row
        self.kept[row] = None
        record, self.prompts[row] = self.prompts[row], None
        return row, best_n, record

    def rows_with_room(self, slots: Sequence[int], max_context: int) -> list[int]:
        """The rows of `slots`, each with room in its context for one more token."""
        rows = [self.row_of[s] for s in slots]
        full = [s for s, r in zip(slots, rows) if self.n_past[r] + 1 > max_context]
        if full:
            raise ContextFullError(f"slot {full[0]} has {max_context} tokens: the context "
                                   f"is full")
        return rows
