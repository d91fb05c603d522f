"""The CUDA batch engine without a GPU: its options (the plan is asked for batch N of one
per-sequence context; the batch size and every other CUDA knob are checked) and its slot/row
bookkeeping."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from strata.engine.cuda.batch import BatchOptions, batch_options, default_context
from strata.engine.cuda.options import CudaEngineError
from strata.plan.options import PlanOptions


def _model(n_ctx_train: int) -> SimpleNamespace:
    """What the options read of a model file: its training context."""
    return SimpleNamespace(shape=SimpleNamespace(n_ctx_train=n_ctx_train))


def test_the_plan_holds_n_contexts():
    opts = batch_options(_model(40960), 4, PlanOptions(max_context=8192, kv_resident=8192,
                                                       kv_type="int8"), gpu_mem=1 << 34)
    assert (opts.plan.batch, opts.plan.max_context, opts.plan.kv_resident) == (4, 8192, 8192)
    assert (opts.plan.kv_type, opts.gpu_mem) == ("int8", 1 << 34)
    assert batch_options(_model(40960), 2).plan.max_context == 32768
    assert default_context(_model(1024)) == 1024
    assert default_context(_model(0)) == 32768


@pytest.mark.parametrize("batch, needle", [(9, "1 to 8"), (0, "--batch")])
def test_batch_size_is_checked(batch, needle):
    with pytest.raises(Exception, match=needle):
        BatchOptions(plan=PlanOptions(batch=batch))


def test_other_knobs_are_checked_as_for_one_sequence():
    assert BatchOptions(plan=PlanOptions(batch=8)).plan.batch == 8
    with pytest.raises(CudaEngineError, match="--gpu-mem"):
        BatchOptions(plan=PlanOptions(batch=2), gpu_mem=-1)


def _rows(n_slots: int):
    """The batch engine's slot/row bookkeeping (`RowTable`); device moves are recorded, not
    made."""
    from strata.engine.cuda.rows import RowTable

    moves = []
    eng = RowTable(n_slots, copy_kv=lambda src, dst, n_tok: moves.append(("copy", src, dst, n_tok)),
                   move_row=lambda src, dst, n_tok: moves.append((src, dst)))
    return eng, moves


def _hold(eng, slot, n_past):
    eng.row_of[slot] = len(eng.slot_at)
    eng.slot_at.append(slot)
    eng.n_past[eng.row_of[slot]] = n_past


def test_rows_are_refilled_by_the_last_only_when_needed():
    eng, moves = _rows(4)
    for slot, n in ((3, 10), (0, 20), (2, 30), (1, 40)):  # rows 0..3
        _hold(eng, slot, n)
    eng.release(0)  # row 1
    eng.release(1)  # row 3, the last: nothing to move
    assert eng.n_active == 2 and moves == []
    eng.compact()
    assert moves == [(2, 1)]  # slot 2 (row 2) into row 1
    assert eng.row_of == {3: 0, 2: 1} and eng.slot_at == [3, 2]
    assert eng.n_past[1] == 30
    for slot in (3, 2):
        eng.release(slot)
    eng.compact()
    assert eng.slot_at == [] and moves == [(2, 1)]  # leaving together moves nothing
    with pytest.raises(IndexError, match="slot 4"):
        eng.release(4)


def test_a_released_row_keeps_the_tokens_its_kv_holds():
    """`release(slot, tokens)` keeps the first n_past of them (what the row's KV holds: a
    finished sequence's last token is fed only by a step run ahead); fewer than that, or none,
    keep nothing; the next prompt reuses the longest shared prefix, never its last token."""
    import numpy as np

    from strata.engine.engine import common_prefix

    eng, _ = _rows(3)
    _hold(eng, 2, 6)
    _hold(eng, 1, 4)
    eng.release(2, tokens=[9, 8, 7, 6, 5, 4, 3])  # row 0: 6 positions
    eng.release(1, tokens=[1, 2, 3])  # row 1: 4 positions, only 3 tokens known
    assert eng.kept[:2] == [[9, 8, 7, 6, 5, 4], None]
    ids = np.array([9, 8, 7, 1, 2], np.int32)
    assert common_prefix(eng.kept[0], ids) == 3
    assert common_prefix([9, 8, 7, 6, 5, 4], np.array([9, 8, 7, 6], np.int32)) == 3
    assert common_prefix([4], np.array([5, 4], np.int32)) == 0
    assert common_prefix(None, [1, 2]) == 0 and common_prefix([1, 2], [1, 2, 3]) == 2


def test_a_new_prompt_takes_the_vacant_row_that_holds_its_prefix():
    """The vacant row whose kept tokens share the longest prefix with the prompt: a hole among
    the rows is taken as it is (no move); a row past the held ones has its KV moved to the next
    row; with none, the next row after compaction, reusing nothing."""
    import numpy as np

    eng, moves = _rows(4)
    for slot in range(4):
        _hold(eng, slot, 3)
    eng.release(1, tokens=[7, 7, 7])  # row 1
    eng.release(3, tokens=[5, 6, 9])  # row 3
    assert eng.place(3, np.array([5, 6, 1, 2], np.int32))[:2] == (3, 2)
    assert eng.place(1, np.array([7, 7, 7, 8], np.int32))[:2] == (1, 3)
    assert moves == [] and eng.kept == [None] * 4 and eng.slot_at == [0, 1, 2, 3]
    # held: row 0 only; row 2 keeps [4, 4, 4] past it
    eng, moves = _rows(4)
    _hold(eng, 0, 3)
    eng.kept[2], eng.n_past[2] = [4, 4, 4], 3
    assert eng.place(1, np.array([4, 4, 9], np.int32))[:2] == (1, 2)
    assert moves == [(2, 1)] and eng.row_of[1] == 1 and eng.kept[1] is None
    assert eng.place(2, np.array([1, 2], np.int32))[:2] == (2, 0)  # nothing shared


def test_a_running_rows_prompt_is_copied_where_it_shares_more():
    """A held row lends the positions of its prompt (not those past it): the new row after
    compaction takes a copy of them where they share more than any vacant row's kept tokens
    (a tie keeps the vacant row: no copy); a prompt equal to a recorded one comes with its
    record (its logits), from a held row or from a vacant row that kept it."""
    import numpy as np

    from strata.engine.engine import PromptRecord

    eng, moves = _rows(4)
    _hold(eng, 0, 9)  # row 0: prompt [1, 2, 3, 4], then 5 generated positions
    eng.prompts[0] = PromptRecord.of([1, 2, 3, 4], np.arange(5.0))
    row, n, record = eng.place(1, np.array([1, 2, 3, 4], np.int32))
    assert (row, n, moves) == (1, 4, [("copy", 0, 1, 4)])  # all of it: the second choice
    np.testing.assert_array_equal(record.logits, np.arange(5.0))
    assert eng.prompts[1] is None  # the prefill records its own
    moves.clear()
    row, n, record = eng.place(2, np.array([1, 2, 3, 4, 5, 6], np.int32))
    assert (row, n) == (2, 4) and moves == [("copy", 0, 2, 4)]  # its prompt only
    moves.clear()
    eng.n_past[2] = 6  # what the prefill leaves
    eng.release(2, tokens=[1, 2, 3, 4, 5, 6, 7])  # row 2 vacant, keeping [1..6]
    row, n, _ = eng.place(3, np.array([1, 2, 3, 4, 9, 9], np.int32))
    assert (row, n) == (2, 4) and moves == []  # a tie with the held prompt: the hole, as is
    eng.n_past[2] = 6
    eng.prompts[2] = PromptRecord.of([1, 2, 3, 4, 9, 9], np.ones(5))
    eng.release(3, tokens=[1, 2, 3, 4, 9, 9, 7])
    row, n, record = eng.place(3, np.array([1, 2, 3, 4, 9, 9], np.int32))
    assert (row, n) == (2, 6) and record.logits.tolist() == [1.0] * 5  # the same prompt again
    assert moves == []
    # a vacant row's record is dropped where what it fed did not start with its prompt
    eng.n_past[2] = 6
    eng.prompts[2] = PromptRecord.of([1, 2], np.ones(5))
    eng.release(3, tokens=[7] * 8)
    assert eng.prompts[2] is None and eng.kept[2] == [7] * 6
    # reuse off: nothing found, nothing copied
    moves.clear()
    eng.release(1)
    assert eng.place(1, np.array([1, 2, 3, 4], np.int32), reuse=False)[1:] == (0, None)
