"""Where `write_model` / `strata synth` writes: through a symlink to its target (the link kept),
never over a FIFO, device or socket (the rename would replace the node with a regular file);
seeds the file cannot store are refused; errors name the output, and the default model's cache
folder that cannot be made is named with what to do."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from strata.cli.main import main
from strata.gguf import open_model
from strata.synth import PRESETS, SynthError, default_model_path, write_model
from strata.synth import writer as synth_writer

TINY = PRESETS["tiny"]


def _write(path, **kw):
    return write_model(path, TINY, header_only=True, progress=False, **kw)


def test_a_symlink_is_written_through(tmp_path, capsys):
    real, link = tmp_path / "real.gguf", tmp_path / "link.gguf"
    link.symlink_to(real)  # dangling: the target is made, as `>` would make it
    assert main(["synth", "tiny", "-o", str(link), "--quiet", "--header-only"]) == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.is_file() and open_model(link).shape.n_layer == 4
    assert f"wrote {link}" in capsys.readouterr().err.replace("\n", "")  # (rich wraps it)
    # an existing target is replaced, the link still kept
    _write(link, seed=5)
    assert link.is_symlink() and open_model(real).metadata.int("strata.synth.seed") == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.gguf", "real.gguf"]


def test_a_symlink_into_another_folder_renames_there(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    link = tmp_path / "a" / "m.gguf"
    link.symlink_to(tmp_path / "b" / "m.gguf")
    _write(link)
    assert link.is_symlink() and (tmp_path / "b" / "m.gguf").is_file()
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["m.gguf"]


def test_a_fifo_is_refused_and_kept(tmp_path, capsys):
    fifo = tmp_path / "out.gguf"
    os.mkfifo(fifo)
    assert main(["synth", "tiny", "-o", str(fifo), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: cannot write {fifo}: it is a FIFO, not a regular file\n"
    assert fifo.is_fifo() and [p.name for p in tmp_path.iterdir()] == ["out.gguf"]
    link = tmp_path / "to-fifo.gguf"  # through a link too
    link.symlink_to(fifo)
    with pytest.raises(SynthError, match="it is a FIFO"):
        _write(link)
    assert fifo.is_fifo() and link.is_symlink()


def test_a_socket_and_a_directory_are_refused(tmp_path, monkeypatch):
    path = tmp_path / "s.gguf"
    monkeypatch.chdir(tmp_path)  # bound by a relative name: AF_UNIX paths are short (~108)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind("s.gguf")
        with pytest.raises(SynthError, match="it is a socket, not a regular file"):
            _write(path)
    finally:
        s.close()
    link = tmp_path / "to-dir.gguf"
    link.symlink_to(tmp_path)
    with pytest.raises(SynthError, match="it is a directory"):
        _write(link)


@pytest.mark.parametrize("seed", [-1, 2 ** 32, 99999999999, 1.5, True])
def test_seeds_the_file_cannot_store_are_refused(tmp_path, seed):
    with pytest.raises(SynthError, match=r"seed must be an integer in 0\.\.4294967295"):
        _write(tmp_path / "m.gguf", seed=seed)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_refusing_the_file_is_named_with_the_output(tmp_path, monkeypatch, capsys):
    """The temporary file beside the output could not be made: the message names the output
    the user gave, and the folder that refused it."""
    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(synth_writer.gguf.GGUFWriter, "write_header_to_file", refuse)
    out = tmp_path / "x.gguf"
    assert main(["synth", "tiny", "-o", str(out), "--quiet"]) == 1
    assert capsys.readouterr().err == (f"error: cannot write {out}: Permission denied "
                                       f"(creating a file in {tmp_path})\n")
    assert list(tmp_path.iterdir()) == []


def test_a_cache_folder_that_cannot_be_made_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    afile = tmp_path / "afile"
    afile.write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(afile))
    with pytest.raises(SynthError) as e:
        default_model_path(progress=False)
    assert str(e.value) == (f"cannot use the cache folder {afile / 'strata'}: Not a directory "
                            f"(set XDG_CACHE_HOME to a writable folder, or pass -m FILE)")
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(afile))
    with pytest.raises(SynthError, match=r"\(set LOCALAPPDATA to a writable folder"):
        default_model_path(progress=False)
