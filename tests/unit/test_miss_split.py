"""The hybrid miss path's split (`MissShare`): a fixed share over many layers, the rounding
carried between layers, the share from measured rates, bad shares refused."""

from __future__ import annotations

import numpy as np
import pytest

from strata.engine.cuda.miss_split import SHARE_MAX, SHARE_MIN, SHARE_START, MissShare


def test_fixed_share_is_kept_over_layers_by_carrying_the_rounding():
    s = MissShare(0.3)
    missed = np.array([9, 4, 7, 1, 12, 3, 5, 0])  # 8 misses a layer
    n_cpu = []
    for _ in range(40):
        cpu, gpu = s.pick(missed)
        assert cpu.size + gpu.size == 8 and not set(cpu) & set(gpu)
        np.testing.assert_array_equal(np.sort(np.r_[cpu, gpu]), np.arange(8))
        n_cpu.append(cpu.size)
    assert set(n_cpu) == {2, 3}  # 2.4 a layer: never further than the rounding
    assert sum(n_cpu) == 96 == round(0.3 * 8 * 40)
    assert s.n_cpu == 96 and s.n_gpu == 320 - 96


def test_edges_all_on_one_side_and_no_misses():
    for share, want in ((0.0, 0), (1.0, 5)):
        s = MissShare(share)
        cpu, gpu = s.pick(np.arange(5))
        assert cpu.size == want and gpu.size == 5 - want
    s = MissShare(0.5)
    cpu, gpu = s.pick(np.zeros(0, np.int64))
    assert cpu.size == gpu.size == 0 and s.carry == 0.0


def test_measured_share_balances_the_rates():
    s = MissShare()
    assert s.share == SHARE_START  # nothing measured yet
    s.record_cpu(10e9, 1.0)
    assert s.share == SHARE_START  # one side only
    s.record_gpu(30e9, 1.0)
    assert s.share == pytest.approx(0.25)  # 10 / (10 + 30): both finish together
    for _ in range(200):  # the GPU slows down: the rates follow the recent samples
        s.record_gpu(10e9, 1.0)
    assert s.share == pytest.approx(0.5, abs=0.01)
    s.record_cpu(0, 0.0)  # an empty sample changes nothing
    assert s.share == pytest.approx(0.5, abs=0.01)
    slow = MissShare()
    slow.record_cpu(1e6, 1.0)
    slow.record_gpu(50e9, 1.0)
    assert slow.share == SHARE_MIN  # kept measurable
    fast = MissShare()
    fast.record_cpu(50e9, 1.0)
    fast.record_gpu(1e6, 1.0)
    assert fast.share == SHARE_MAX
    summary = s.summary()
    assert summary["share_setting"] == "measured" and summary["cpu_gb_per_s"] == pytest.approx(
        10.0, rel=0.2)


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_bad_share_refused(bad):
    with pytest.raises(ValueError, match="fraction"):
        MissShare(bad)


def test_options_refuse_a_share_without_the_hybrid_path():
    from strata.engine.cuda.options import CudaEngineError, CudaOptions

    assert CudaOptions(miss_path="hybrid", miss_share=0.4).miss_share == 0.4
    with pytest.raises(CudaEngineError, match="--miss-share applies to --miss-path hybrid"):
        CudaOptions(miss_path="mapped", miss_share=0.4)
    with pytest.raises(CudaEngineError, match="0 to 1"):
        CudaOptions(miss_path="hybrid", miss_share=2.0)
    with pytest.raises(CudaEngineError, match="--miss-path 'both'"):
        CudaOptions(miss_path="both")
