"""The CUDA batch engine's options (no GPU): the plan is asked for N per-sequence contexts, and
the batch size and every other CUDA knob are checked."""

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
    assert (opts.plan.batch, opts.plan.max_context, opts.plan.kv_resident) == (4, 32768, 32768)
    assert (opts.plan.kv_type, opts.gpu_mem) == ("int8", 1 << 34)
    assert batch_options(_model(40960), 2).plan.max_context == 2 * 32768
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
