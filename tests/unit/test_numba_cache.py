"""The numba cache is keyed by the compiled sources: numba checks a cached function against its
own file only, so a change to a callee in another file must start a fresh folder."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from strata.aot import numba_cache

REPO = Path(__file__).resolve().parents[2]


def _copy_tree(dst: Path) -> Path:
    root = dst / "strata"
    for sub in numba_cache.NUMBA_SOURCE_DIRS:
        shutil.copytree(numba_cache.PACKAGE_ROOT / sub, root / sub,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (root / "serve").mkdir()
    (root / "serve" / "app.py").write_text("x = 1\n")
    return root


def test_the_digest_follows_every_compiled_source_and_nothing_else(tmp_path):
    root = _copy_tree(tmp_path)
    digest = numba_cache.source_digest(root)
    assert re.fullmatch(r"[0-9a-f]{16}", digest)
    assert digest == numba_cache.source_digest(numba_cache.PACKAGE_ROOT)  # the same bytes
    (root / "serve" / "app.py").write_text("x = 2\n")  # no numba code there
    assert numba_cache.source_digest(root) == digest
    simd8 = root / "engine" / "cpu" / "simd8.py"  # a callee of cached functions in other files
    simd8.write_text(simd8.read_text() + "\n# edited\n")
    edited = numba_cache.source_digest(root)
    assert edited != digest
    (root / "quant" / "new_format.py").write_text("")  # a new file counts too
    assert numba_cache.source_digest(root) not in (digest, edited)


def test_numba_cached_code_lives_only_in_the_digested_folders():
    """A cache=True function elsewhere would escape the digest (and could go stale)."""
    dirs = tuple(numba_cache.PACKAGE_ROOT / d for d in numba_cache.NUMBA_SOURCE_DIRS)
    found = []
    for top in (REPO / "strata", REPO / "cli", REPO / "cuda_kernels"):
        for path in top.rglob("*.py"):
            # a word of its own: `prefix_cache=True` (the serve worker's) is no numba option
            if re.search(r"\bcache\s*=\s*True", path.read_text(encoding="utf-8")):
                found.append(path)
    assert found, "the scan found no cached function at all"
    outside = [str(p.relative_to(REPO)) for p in found
               if not any(p.is_relative_to(d) for d in dirs)]
    assert not outside, f"numba-cached code outside {numba_cache.NUMBA_SOURCE_DIRS}: {outside}"


def test_a_source_run_marks_its_folder_and_removes_only_stale_other_states(tmp_path):
    import os
    import time
    env = {"XDG_CACHE_HOME": str(tmp_path), "LOCALAPPDATA": str(tmp_path)}
    base = numba_cache.numba_cache_dir(environ=env)
    day = 86400
    now = time.time()
    folders = {}
    for name, age_days in (("src-0000000000000old", 45), ("src-00000000000recent", 3),
                           ("keep-me", 400)):
        f = base / name
        (f / "sub").mkdir(parents=True)
        (f / "sub" / "x.nbi").write_bytes(b"\0")
        os.utime(f, (now - age_days * day, now - age_days * day))
        folders[name] = f
    stray = base / "src-file-not-folder"
    stray.write_text("")
    os.utime(stray, (now - 90 * day, now - 90 * day))
    assert numba_cache.configure(env, is_frozen=False) == "source"
    here = Path(env["NUMBA_CACHE_DIR"])
    assert here.is_dir() and now - here.stat().st_mtime < 60  # marked used
    assert not folders["src-0000000000000old"].exists()      # another state, unused 45 days
    assert folders["src-00000000000recent"].exists()          # used 3 days ago: kept
    assert folders["keep-me"].exists() and stray.exists()      # not a source state folder
    # an old folder of its own digest is marked, never removed
    os.utime(here, (now - 90 * day, now - 90 * day))
    assert numba_cache.prune_stale(here, now=now) == []
    assert here.is_dir() and now - here.stat().st_mtime < 60
    # the frozen app's cache is not pruned this way
    old = base / "src-00000000000000aa"
    old.mkdir()
    os.utime(old, (now - 90 * day, now - 90 * day))
    numba_cache.configure({"XDG_CACHE_HOME": str(tmp_path), "LOCALAPPDATA": str(tmp_path)},
                          is_frozen=True)
    assert old.exists()


def test_pruning_never_raises(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert numba_cache.prune_stale(blocker / "numba" / "src-x") == []  # cannot be made
