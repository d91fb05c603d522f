"""Which GPUs `strata generate` / `strata bench` use (strata.engine.multi.request): --gpus,
one or several --gpu-mem sizes, the split-only flags refused on one GPU, noted on the CPU
backend, bad values refused on every backend."""

from __future__ import annotations

import argparse

import pytest

from strata.engine.multi.request import GpuRequest, gpu_request, split_flags_given
from strata.errors import StrataError
from strata.plan.split.knobs import add_split_knobs

GiB = 1 << 30


def args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--gpu-mem")
    add_split_knobs(p)
    return p.parse_args(list(argv))


def test_default_is_every_visible_gpu():
    r = gpu_request(args(), 2)
    assert r.devices == (0, 1) and r.gpu_mem == (None, None) and r.is_split
    assert r.split.cuts is None and r.split.helper_tiers and r.split.carve
    one = gpu_request(args("--gpu-mem", "8GiB"), 1)
    assert one.devices == (0,) and one.gpu_mem == (8 * GiB,) and not one.is_split
    assert one.split is None


def test_sizes_pick_gpus_and_apply_per_gpu():
    r = gpu_request(args("--gpu-mem", "8GiB,6GiB"), 4)
    assert r.devices == (0, 1) and r.gpu_mem == (8 * GiB, 6 * GiB)
    r = gpu_request(args("--gpus", "3,1", "--gpu-mem", "8GiB"), 4)
    assert r.devices == (3, 1) and r.gpu_mem == (8 * GiB, 8 * GiB)
    r = gpu_request(args("--gpus", "2,0", "--gpu-mem", "8GiB,4GiB", "--layer-split", "7",
                         "--cover-b", "2", "--no-helper-tiers", "--no-carve",
                         "--stage-cache", "3,4", "--handoff", "host"), 3)
    assert r.gpu_mem == (8 * GiB, 4 * GiB)
    assert (r.split.cuts, r.split.cover_b, r.split.helper_tiers, r.split.carve,
            r.split.stage_cache, r.split.handoff) == ((7,), 2.0, False, False, (3, 4), "host")
    assert gpu_request(args(), 2).split.handoff == "auto"
    assert gpu_request(args("--gpus", "1"), 2).devices == (1,)


@pytest.mark.parametrize("argv, n, message", [
    (("--gpus", "0,2"), 2, "--gpus 0,2: no GPU 2 .this process sees 2 GPUs"),
    (("--gpus", "0,0"), 2, "distinct"),
    (("--gpu-mem", "8GiB,8GiB,8GiB"), 2, "3 sizes for 2 GPUs"),
    (("--gpus", "0,1", "--gpu-mem", "8GiB,8GiB,8GiB"), 4, "3 sizes for the 2 GPUs of --gpus"),
    (("--gpu-mem", "8 parsecs"), 2, "--gpu-mem"),
    (("--layer-split", "3"), 1, "--layer-split: a layer split's flags, and GPU 0 runs every"),
    (("--gpus", "1", "--no-helper-tiers", "--cover-b", "2"), 2,
     "--cover-b, --no-helper-tiers: a layer split's flags, and GPU 1"),
    (("--gpus", "0", "--handoff", "host"), 2, "--handoff: a layer split's flags, and GPU 0"),
    (("--layer-split", "3,2"), 2, "strictly increasing"),
    (("--cover-b", "0"), 2, "--cover-b must be in"),
    ((), 0, "no CUDA GPU"),
])
def test_bad_combinations_are_refused(argv, n, message):
    with pytest.raises(StrataError, match=message):  # OptionError, SizeError
        gpu_request(args(*argv), n)


def test_split_flags_given_ignores_defaults():
    assert split_flags_given(args()) == []
    assert split_flags_given(args("--layer-split", "AUTO", "--handoff", "auto")) == []
    assert split_flags_given(args("--layer-split", "4", "--no-carve")) == ["--layer-split",
                                                                           "--no-carve"]


def test_request_is_consistent():
    with pytest.raises(ValueError, match="2 GPUs with 1 VRAM caps"):
        GpuRequest((0, 1), (None,), None)
    with pytest.raises(ValueError, match="split knobs go with several GPUs"):
        GpuRequest((0,), (None,), gpu_request(args(), 2).split)


def test_generate_on_the_cpu_notes_the_split_flags(tmp_models, capsys):
    from helpers.engine_models import model_path
    from strata.cli.main import main

    path = str(model_path(tmp_models, "Q8_0"))
    rc = main(["generate", "-m", path, "--prompt-tokens", "1,2,3", "-n", "2",
               "--temperature", "0", "--backend", "cpu", "--gpus", "0,1", "--no-helper-tiers",
               "--max-context", "64", "--json"])
    assert rc == 0
    assert ("note: --gpus, --no-helper-tiers: the layer split runs on the CUDA engine; the cpu "
            "backend runs every layer on the CPU") in capsys.readouterr().err


def test_generate_and_bench_refuse_bad_split_flags_on_every_backend(tmp_models, capsys):
    from helpers.engine_models import model_path
    from strata.cli.main import main

    path = str(model_path(tmp_models, "Q8_0"))
    assert main(["generate", "-m", path, "--prompt-tokens", "1", "--backend", "cpu",
                 "--layer-split", "x"]) != 0
    assert "--layer-split 'x': expected whole numbers" in capsys.readouterr().err
    assert main(["bench", "--backend", "cpu", "--stage-cache", "-1"]) != 0
    assert "--stage-cache: slot counts must be >= 0" in capsys.readouterr().err


def test_bench_cuda_checks_the_gpus_it_is_given(capsys):
    from strata.cli.main import main

    # the simulator shows one GPU: a split over two is refused before anything loads
    assert main(["bench", "--backend", "cuda", "-m", "x.gguf", "--gpus", "0,1"]) != 0
    assert "--gpus 0,1: no GPU 1 (this process sees 1 GPU)" in capsys.readouterr().err
    assert main(["bench", "--backend", "cuda", "-m", "x.gguf", "--layer-split", "2"]) != 0
    assert "runs every layer alone" in capsys.readouterr().err


def test_a_host_link_copies_through_its_portable_staging_buffer():
    """`--handoff host`: source -> pinned staging -> destination (the simulator's one device
    stands in for both GPUs); a copy larger than the staging buffer is refused."""
    import numpy as np
    from numba import cuda

    from strata.engine.multi.handoff import Link

    link = Link(0, 0, cuda.stream(), cuda.stream(), max_bytes=64, handoff="host")
    assert link.how == "pinned host" and Link(0, 0, 0, 0, max_bytes=64).how == "same device"
    src = cuda.to_device(np.arange(16, dtype=np.float32).reshape(2, 8))  # [2, 8] f32
    dst = cuda.device_array((2, 8), np.float32)
    link.copy(dst, src)
    link._sync()
    np.testing.assert_array_equal(dst.copy_to_host(), src.copy_to_host())
    np.testing.assert_array_equal(link._stage.view(np.float32), np.arange(16))
    with pytest.raises(ValueError, match="through a 64 B staging buffer"):
        link.copy(cuda.device_array(17, np.float32), cuda.device_array(17, np.float32))
    with pytest.raises(ValueError, match="handoff 'peer'"):
        Link(0, 0, 0, 0, max_bytes=4, handoff="peer")
    with pytest.raises(StrataError, match="--handoff 'peer': expected auto or host"):
        from strata.plan.split import SplitOptions
        SplitOptions(handoff="peer")
