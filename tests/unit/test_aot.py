"""The one-file build's pure parts: image choice per GPU, the bundle format, kernel keys, the
Windows/Linux answers (injected), and the frozen app's numba cache settings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from strata.aot import bundle as B
from strata.aot import numba_cache, platform
from strata.aot.identity import UnstableKeyError, kernel_key, signature_key

ALL_TAGS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_120", "compute_90"]


@pytest.mark.parametrize("cc, want", [
    ((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 7), "sm_86"), ((8, 9), "sm_89"),
    ((9, 0), "sm_90"), ((10, 0), "compute_90"), ((12, 0), "sm_120"), ((12, 1), "sm_120"),
    ((13, 0), "compute_90"), ((7, 5), None),
])
def test_choose_image_per_compute_capability(cc, want):
    assert B.choose_image(ALL_TAGS, cc) == want


def test_choose_image_prefers_newest_ptx_not_above_the_gpu():
    assert B.choose_image(["compute_80", "compute_90"], (9, 0)) == "compute_90"
    assert B.choose_image(["compute_80", "compute_90"], (8, 9)) == "compute_80"
    assert B.choose_image(["sm_90"], (8, 0)) is None


def test_bad_tag_is_refused():
    with pytest.raises(B.BundleError, match="bad image tag"):
        B.choose_image(["gfx_90"], (9, 0))


def _fields(i: int) -> dict:
    return {"kernel": f"m:k{i}:abc", "signature": "int64", "name": f"fam/k{i}",
            "symbol": f"_Z{i}", "cooperative": False}


def test_bundle_round_trip_and_image_for_gpu(tmp_path):
    path = tmp_path / "k.zip"
    images = {"sm_90": b"cubin90", "sm_80": b"cubin80", "compute_90": b"ptx\0"}
    n = B.write_bundle(path, [(_fields(0), images), (_fields(1), {"sm_80": b"x"})],
                       toolchain={"numba-cuda": "0.30.4"}, archs=["sm_80", "sm_90", "compute_90"])
    assert n == 2
    b = B.KernelBundle(path)
    assert len(b) == 2 and b.toolchain["numba-cuda"] == "0.30.4"
    e = b.lookup("m:k0:abc", "int64")
    assert e is not None and e.symbol == "_Z0"
    assert b.image(e, (9, 0)) == ("sm_90", b"cubin90")
    assert b.image(e, (8, 6)) == ("sm_80", b"cubin80")
    assert b.image(e, (10, 0)) == ("compute_90", b"ptx\0")
    assert b.lookup("m:k0:abc", "int32") is None
    with pytest.raises(B.BundleError, match="compute capability 9.0"):
        b.image(b.lookup("m:k1:abc", "int64"), (9, 0))


def test_bundle_errors_name_the_problem(tmp_path):
    with pytest.raises(B.BundleError, match="cannot read"):
        B.KernelBundle(tmp_path / "absent.zip")
    (tmp_path / "bad.zip").write_bytes(b"not a zip")
    with pytest.raises(B.BundleError, match="cannot read"):
        B.KernelBundle(tmp_path / "bad.zip")
    with pytest.raises(B.BundleError, match="has no image"):
        B.write_bundle(tmp_path / "e.zip", [(_fields(0), {})], toolchain={}, archs=[])


def _factory(n_tok, flag):
    def inner(x):
        return x + n_tok
    def kernel(x):
        return inner(x) if flag else x
    return kernel


def test_kernel_key_same_for_same_factory_arguments_and_differs_otherwise():
    a, b, c = _factory(2, True), _factory(2, True), _factory(3, True)
    assert a is not b
    assert kernel_key(a) == kernel_key(b)
    assert kernel_key(a) != kernel_key(c)
    assert kernel_key(a) != kernel_key(_factory(2, False))
    assert kernel_key(a).startswith(f"{__name__}:_factory.<locals>.kernel:")


def test_kernel_key_hashes_captured_arrays_by_content():
    def make(table):
        def k(i):
            return table[i]
        return k
    t = np.arange(4, dtype=np.uint32)
    assert kernel_key(make(t)) == kernel_key(make(t.copy()))
    assert kernel_key(make(t)) != kernel_key(make(t + 1))


def test_kernel_key_refuses_values_without_stable_text():
    obj = object()

    def k():
        return obj
    with pytest.raises(UnstableKeyError, match="no stable text"):
        kernel_key(k)


_SCALE = 2


def _helper(x):
    return x + 1


def _other_helper(x):
    return x - 1


def _kernel_with_globals(x):
    return _helper(x) * _SCALE


def test_kernel_key_follows_the_globals_a_kernel_names(monkeypatch):
    """A function or constant the kernel names at module level is compiled into it, so it is
    in the key: swapping either changes the key, putting it back restores it."""
    module, original = sys.modules[__name__], _helper
    key = kernel_key(_kernel_with_globals)
    monkeypatch.setattr(module, "_helper", _other_helper)
    assert kernel_key(_kernel_with_globals) != key
    monkeypatch.setattr(module, "_helper", original)
    assert kernel_key(_kernel_with_globals) == key
    monkeypatch.setattr(module, "_SCALE", 3)
    assert kernel_key(_kernel_with_globals) != key


def test_fused_moe_key_follows_its_grid_barrier(monkeypatch):
    """The fused MoE kernel calls the barrier as a module global of moe_fused: a new barrier
    alone must give the kernel a new key (a build reusing an older bundle's image would
    otherwise ship the old barrier)."""
    from strata.cuda_kernels import intrinsics, moe_fused
    from strata.cuda_kernels.lanes import LANE_FORMATS
    from gguf import GGMLQuantizationType as T
    lf = LANE_FORMATS[int(T.Q4_K)]
    key = kernel_key(moe_fused._fused(lf, lf, moe_fused.BLOCKS_AN_SM).py_func)
    monkeypatch.setattr(moe_fused, "grid_sync", intrinsics.warp_sum)  # any other device fn
    assert kernel_key(moe_fused._fused(lf, lf, moe_fused.BLOCKS_AN_SM).py_func) != key


def test_kernel_key_is_the_same_in_another_process():
    code = textwrap.dedent("""
        from strata.aot.identity import kernel_key, signature_key
        from strata.cuda_kernels import sampling
        from numba import types
        print(kernel_key(sampling.argmax_kernel.py_func))
        print(signature_key((types.float32[::1], types.int64)))
    """)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    outs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True, timeout=120).stdout for _ in range(2)]
    assert outs[0] == outs[1]
    key, sig = outs[0].splitlines()
    assert key.startswith("strata.cuda_kernels.sampling:argmax_kernel:")
    assert sig == "array(float32, 1d, C), int64"


def test_signature_key_joins_numba_type_names():
    from numba import types
    assert signature_key((types.uint8[::1], types.int32)) == "array(uint8, 1d, C), int32"


def test_windows_answers():
    assert platform.executable_name("win32") == "strata.exe"
    assert platform.executable_name("linux") == "strata"
    libs = platform.driver_libraries("win32")
    assert (libs.cuda, libs.nvml) == ("nvcuda.dll", "nvml.dll")
    assert platform.driver_libraries("linux").cuda == "libcuda.so.1"
    home = Path("C:/Users/ann")
    got = platform.user_cache_dir(platform="win32", environ={"LOCALAPPDATA": "D:/AppData"},
                                  home=home)
    assert got == Path("D:/AppData") / "strata" / "cache"
    assert platform.user_cache_dir(platform="win32", environ={}, home=home) == \
        home / "AppData" / "Local" / "strata" / "cache"


def test_linux_cache_folder_follows_xdg():
    home = Path("/home/ann")
    assert platform.user_cache_dir(platform="linux", environ={"XDG_CACHE_HOME": "/c"},
                                   home=home) == Path("/c/strata")
    assert platform.user_cache_dir(platform="linux", environ={}, home=home) == \
        home / ".cache" / "strata"


def test_user_cache_dir_is_the_default_models_folder():
    from strata.synth.cache import cache_dir
    assert platform.user_cache_dir() == cache_dir()


def test_load_driver_reports_the_loader_error():
    seen = []

    def missing(name):
        seen.append(name)
        raise OSError(f"{name}: not found")
    assert platform.load_driver(platform="win32", loader=missing) == \
        ("nvcuda.dll", "nvcuda.dll: not found")
    assert platform.load_driver(platform="linux", loader=lambda name: None) == \
        ("libcuda.so.1", None)
    assert seen == ["nvcuda.dll"]


def test_numba_cache_configure_frozen_and_source(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path), "LOCALAPPDATA": str(tmp_path)}
    assert numba_cache.configure(env, is_frozen=False) == "source"
    assert env["NUMBA_CACHE_DIR"] == str(numba_cache.source_cache_dir(environ=env))
    assert env["NUMBA_CACHE_DIR"].startswith(str(tmp_path))
    assert env["NUMBA_CACHE_DIR"].endswith(f"src-{numba_cache.source_digest()}")
    assert "NUMBA_CACHE_LOCATOR_CLASSES" not in env  # numba's own locators, under that folder
    env = {"XDG_CACHE_HOME": str(tmp_path), "LOCALAPPDATA": str(tmp_path)}
    assert numba_cache.configure(env, is_frozen=True) == "frozen"
    assert env["NUMBA_CACHE_DIR"] == str(numba_cache.numba_cache_dir(environ=env))
    assert env["NUMBA_CACHE_LOCATOR_CLASSES"] == numba_cache.LOCATOR
    for is_frozen in (False, True):
        mine = {"NUMBA_CACHE_DIR": "/mine", "NUMBA_CACHE_LOCATOR_CLASSES": "x.Mine"}
        numba_cache.configure(mine, is_frozen=is_frozen)
        assert mine == {"NUMBA_CACHE_DIR": "/mine", "NUMBA_CACHE_LOCATOR_CLASSES": "x.Mine"}


def test_frozen_locator_keeps_the_cache_across_unpack_folders(tmp_path):
    """Two runs of a one-file app unpack to different folders; the second must find the first's
    cache files (numba's own locators would look in a new folder)."""
    code = textwrap.dedent("""
        import sys, numba
        sys.frozen = True
        import numba.core.config as config
        from numba import njit
        @njit(cache=True)
        def twice(x):
            return 2 * x
        assert twice(21) == 42
        print(sum(twice.stats.cache_hits.values()), sum(twice.stats.cache_misses.values()))
    """)
    cache = tmp_path / "cache"
    outs = []
    for run in range(2):
        unpack = tmp_path / f"_MEI{run}"
        unpack.mkdir()
        (unpack / "app.py").write_text(code)
        env = {**os.environ, "NUMBA_CACHE_DIR": str(cache),
               "NUMBA_CACHE_LOCATOR_CLASSES": numba_cache.LOCATOR}
        outs.append(subprocess.run([sys.executable, str(unpack / "app.py")], env=env,
                                   capture_output=True, text=True, timeout=300, check=False))
    assert all(o.returncode == 0 for o in outs), outs[0].stderr[-2000:] + outs[1].stderr[-2000:]
    assert outs[0].stdout.split() == ["0", "1"]  # compiled and saved
    assert outs[1].stdout.split() == ["1", "0"]  # loaded from the first run's files
    assert any(cache.rglob("*.nbi"))


def test_selfcheck_is_hidden_and_passes_in_a_developer_install(capsys, monkeypatch):
    from strata.cli.main import main
    monkeypatch.delenv("STRATA_KERNEL_BUNDLE", raising=False)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "selfcheck" not in capsys.readouterr().out
    assert main(["selfcheck", "--gpu", "no"]) == 0
    out = capsys.readouterr().out
    for row in ("numba-cuda", "cuda.core", "kernel bundle", "cpu numba"):
        assert f"ok    {row}" in out, out


def test_frozen_locator_falls_back_when_the_cache_folder_cannot_be_written(tmp_path, monkeypatch):
    from numba.core import config

    from strata.aot import numba_locator as L
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the cache folder should be: not writable as a folder
    monkeypatch.setattr(config, "CACHE_DIR", str(blocker / "numba"))
    monkeypatch.setattr(L, "fallback_root", lambda: str(tmp_path / "fallback"))

    def f():
        return 1
    loc = L.FrozenAppCacheLocator.from_function(f, "/nonexistent/app.py")
    assert loc is not None
    assert loc.get_cache_path() == str(tmp_path / "fallback" / Path(*__name__.split(".")))
    assert loc.get_disambiguator() == str(f.__code__.co_firstlineno)


class _FakeNvml:
    """pynvml's driver-model query as Windows answers it."""

    class NVMLError(Exception):
        pass

    def __init__(self, model):
        self.model = model

    def nvmlDeviceGetCurrentDriverModel(self, handle):
        if self.model is None:
            raise self.NVMLError("not supported")
        return self.model


@pytest.mark.parametrize("model, want", [(0, "wddm"), (1, "tcc"), (2, "mcdm"), (None, "wddm")])
def test_windows_driver_model_from_nvml(monkeypatch, model, want):
    from strata.memory import probe
    monkeypatch.setattr(probe.sys, "platform", "win32")
    assert probe._driver_model(_FakeNvml(model), handle=object()) == want
    monkeypatch.setattr(probe.sys, "platform", "linux")
    assert probe._driver_model(_FakeNvml(model), handle=object()) == "linux"


def _sampling_bundle(path, tags, assembler):
    """A bundle of the sampling family's specializations under their real keys, images
    b"<name>/<tag>" for `tags`, made by `assembler`; returns its entries."""
    from strata.aot import build as aot_build

    entries = []
    for c in aot_build.registry("sampling"):
        fn, sig = c.build()
        fields = {"kernel": kernel_key(fn), "signature": signature_key(tuple(sig)),
                  "name": "old", "symbol": f"sym_{c.name}", "cooperative": False,
                  "options": B.options_key(c.options)}  # the sampler's launch bounds
        entries.append((fields, {t: f"{c.name}/{t}".encode() for t in tags}))
    B.write_bundle(path, entries, toolchain={"assembler": assembler}, archs=tags)
    return entries


def test_build_reuses_kernels_an_earlier_bundle_holds(tmp_path):
    """`--reuse`: specializations whose keys an earlier bundle holds are copied, not compiled
    (here every one is, so nothing is compiled and the simulator may stay on)."""
    from strata.aot import build as aot_build

    old = tmp_path / "old.zip"
    entries = _sampling_bundle(old, aot_build._archs(), aot_build.assembler())
    lines = []
    assert aot_build.build(str(tmp_path / "new.zip"), family="sampling", reuse=str(old),
                           log=lines.append) == 0
    assert "2 reused" in lines[-1], lines
    new = B.KernelBundle(tmp_path / "new.zip")
    e = new.lookup(entries[0][0]["kernel"], entries[0][0]["signature"])
    assert e.name == "sampling/argmax" and e.symbol == "sym_argmax"
    assert new.image(e, (9, 0)) == ("sm_90", b"argmax/sm_90")


def test_options_key_keeps_only_code_changing_non_defaults():
    assert B.options_key(None) == {}
    assert B.options_key({"debug": 0, "opt": True, "lto": True, "launch_bounds": None,
                          "link": ()}) == {}
    assert B.options_key({"launch_bounds": (128, 4), "fastmath": True}) == \
        {"launch_bounds": [128, 4], "fastmath": True}


def test_arch_list_narrows_the_images_and_refuses_unknown_ones():
    from strata.aot import build as aot_build

    assert aot_build.parse_archs(None) == (B.CUBIN_ARCHS, B.PTX_ARCH)
    assert aot_build.parse_archs("all") == (B.CUBIN_ARCHS, B.PTX_ARCH)
    assert aot_build.parse_archs("sm_90") == (((9, 0),), None)
    assert aot_build.parse_archs(" compute_90 , sm_86,sm_90,sm_86") == (((8, 6), (9, 0)), (9, 0))
    assert aot_build._archs(aot_build.parse_archs("sm_90,compute_90")) == ["sm_90", "compute_90"]
    for bad in ("sm_91", "compute_80", "sm90", ","):
        with pytest.raises(ValueError, match="--arch"):
            aot_build.parse_archs(bad)
    assert aot_build.main(["out.zip", "--arch", "sm_75"]) == 2


def test_build_for_one_arch_reuses_only_a_bundle_of_the_same_archs(tmp_path):
    """A narrowed build reuses an earlier bundle of exactly its images and writes only those."""
    from strata.aot import build as aot_build

    _sampling_bundle(tmp_path / "sm90.zip", ["sm_90"], aot_build.assembler())
    lines = []
    assert aot_build.build(str(tmp_path / "new.zip"), family="sampling", arch="sm_90",
                           reuse=str(tmp_path / "sm90.zip"), log=lines.append) == 0
    assert "2 reused" in lines[-1] and "sm_90," in lines[-1], lines
    new = B.KernelBundle(tmp_path / "new.zip")
    assert new.archs == ["sm_90"]
    e = next(x for x in new.entries.values() if x.name == "sampling/argmax")
    assert list(e.images) == ["sm_90"] and new.image(e, (9, 0)) == ("sm_90", b"argmax/sm_90")
    with pytest.raises(B.BundleError, match="compute capability 8.6"):
        new.image(e, (8, 6))
    # the full default set does not reuse a one-arch bundle (it would lack the other images)
    assert aot_build._reused(aot_build.registry("sampling"), str(tmp_path / "sm90.zip"),
                             aot_build._archs(), aot_build.assembler()) == {}


def test_build_says_when_cubins_would_come_from_nvjitlink_and_reuses_only_the_same_assembler(
        tmp_path, monkeypatch):
    """Without a ptxas the build warns (nvJitLink's relocatable cubins are slower) and records
    it; a bundle another assembler made is not reused (every kernel would compile again: here
    the simulator cannot, so the refusal shows as `_reused` returning nothing)."""
    from strata.aot import build as aot_build

    old = tmp_path / "old.zip"
    entries = _sampling_bundle(old, aot_build._archs(), "ptxas Cuda compilation tools")
    monkeypatch.setattr(aot_build, "_ptxas", lambda: None)
    assert aot_build.assembler() == "nvJitLink"
    assert aot_build._reused(aot_build.registry("sampling"), str(old), aot_build._archs(),
                             aot_build.assembler()) == {}
    lines = []
    monkeypatch.setattr(aot_build, "_reused", lambda *a: {
        i: (i, e[0], e[1], 0.0, "") for i, e in enumerate(entries)})
    assert aot_build.build(str(tmp_path / "new.zip"), family="sampling", reuse=str(old),
                           log=lines.append) == 0
    assert "no ptxas" in lines[0] and lines[-1].endswith("nvJitLink"), lines
    assert B.KernelBundle(tmp_path / "new.zip").toolchain["assembler"] == "nvJitLink"


@pytest.mark.skipif(os.name == "nt", reason="a shell script stands in for ptxas")
def test_wheel_ptxas_is_found_on_the_path_entries(tmp_path, monkeypatch):
    """The nvidia-cuda-nvcc wheel's ptxas (nvidia/cu13/bin under a sys.path entry) is found,
    also by `find` where no toolkit's is, and `version` reads its release line."""
    from strata.cuda_kernels import ptxas

    exe = tmp_path / "nvidia" / "cu13" / "bin" / "ptxas"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.9, V13.9.1'\n")
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere"), str(tmp_path)])
    assert ptxas.wheel_ptxas() == str(exe)
    monkeypatch.setattr(ptxas.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert ptxas.find() == str(exe)
    assert ptxas.version(str(exe)) == "Cuda compilation tools, release 13.9, V13.9.1"
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere")])
    assert ptxas.wheel_ptxas() is None
