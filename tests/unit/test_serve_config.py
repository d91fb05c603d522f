"""`strata serve` knobs: defaults, the JSON config file, the command line winning over it."""

from __future__ import annotations

import json

import pytest

from strata.serve.config import ServeConfig, ServeConfigError, as_dict, build_config


def write(tmp_path, obj, name="serve.json"):
    path = tmp_path / name
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return str(path)


def test_cli_wins_over_file_over_defaults(tmp_path):
    path = write(tmp_path, {"model": "/m.gguf", "port": 9000, "batch": 4, "api-key": "k1",
                            "aliases": ["a", "b"]})
    cfg = build_config({"port": 7000, "batch": None, "host": None}, path)
    assert (cfg.port, cfg.batch, cfg.api_key, cfg.host) == (7000, 4, "k1", "127.0.0.1")
    assert cfg.aliases == ("a", "b")
    assert cfg.max_body_bytes == ServeConfig(model="x").max_body_bytes
    assert as_dict(cfg)["api_key"] == "***"


def test_relative_model_path_is_relative_to_the_file(tmp_path):
    cfg = build_config({}, write(tmp_path, {"model": "models/m.gguf"}))
    assert cfg.model == str((tmp_path / "models" / "m.gguf").resolve())


def test_api_key_from_environment_only_when_not_given(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_API_KEY", "from-env")
    assert build_config({"model": "m"}, None).api_key == "from-env"
    assert build_config({"model": "m", "api_key": "cli"}, None).api_key == "cli"


@pytest.mark.parametrize("content, needle", [
    ({"model": "m", "bach": 2}, "unknown knob 'bach'"),
    ({"model": "m", "port": "80"}, "port: expected an integer"),
    ({"model": "m", "batch": True}, "batch: expected an integer"),
    ({"model": "m", "aliases": "x"}, "aliases: expected an array of strings"),
    ({"model": "m", "host": None}, "host: must not be null"),
    ([1, 2], "expected a JSON object"),
    ("{oops", "not valid JSON"),
])
def test_bad_config_files_name_the_problem(tmp_path, content, needle):
    with pytest.raises(ServeConfigError, match=None) as e:
        build_config({}, write(tmp_path, content))
    assert needle in str(e.value)


def test_missing_file_and_missing_model(tmp_path):
    with pytest.raises(ServeConfigError, match="no such file"):
        build_config({}, str(tmp_path / "absent.json"))
    with pytest.raises(ServeConfigError, match="model: a GGUF file is required"):
        build_config({"port": 1}, None)


@pytest.mark.parametrize("kw, needle", [
    ({"port": 70000}, "port"), ({"batch": 0}, "batch"), ({"max_context": 1}, "max_context"),
    ({"max_queue": 0}, "max_queue"), ({"max_body_bytes": 10}, "max_body_bytes"),
    ({"max_tokens_limit": 0}, "max_tokens_limit"), ({"api_key": ""}, "api_key"),
    ({"log_level": "loud"}, "log_level"),
])
def test_each_knob_is_checked(kw, needle):
    with pytest.raises(ServeConfigError, match=needle):
        ServeConfig(model="m.gguf", **kw)


def test_url_brackets_ipv6():
    assert ServeConfig(model="m", host="::1", port=8080).url == "http://[::1]:8080"


def _parse(argv):
    import argparse
    import importlib

    p = argparse.ArgumentParser()
    importlib.import_module("strata.cli.serve").add_arguments(p)
    args = p.parse_args(argv)
    return {k: v for k, v in vars(args).items() if k not in ("config", "spec")}


def test_plan_knobs_from_the_file_and_the_command_line(tmp_path):
    from strata.plan.options import PlanOptions
    from strata.serve.config import plan_knobs_set
    from strata.serve.engines import plan_options

    path = write(tmp_path, {"model": "/m.gguf", "batch": 4, "kv": "int8", "expert-cache": "300",
                            "no_prefill_borrow": True, "max_context": 4096})
    cfg = build_config(_parse(["--gpu-mem", "24GiB", "--ring-mib", "64"]), path)
    assert (cfg.batch, cfg.kv, cfg.gpu_mem, cfg.ring_mib) == (4, "int8", "24GiB", 64)
    assert plan_knobs_set(cfg) == ["gpu_mem", "kv", "expert_cache", "ring_mib",
                                   "no_prefill_borrow"]
    opts = plan_options(cfg)  # per sequence: the engine multiplies by the batch
    assert opts == PlanOptions(max_context=4096, kv_type="int8", expert_cache=300, ring_mib=64,
                               prefill_borrow=False)
    cli = build_config(_parse(["-m", "/x.gguf", "--batch", "2", "--kv", "q4_0"]), path)
    assert (cli.batch, cli.kv, cli.expert_cache) == (2, "q4_0", "300")
    assert plan_knobs_set(ServeConfig(model="m")) == []
    # batch invariance: the flag, or the file's key (the CPU backend is told it ignores it)
    assert build_config(_parse(["--batch-invariant"]), path).batch_invariant is True
    inv = build_config(_parse([]), write(tmp_path, {"model": "/m.gguf", "batch_invariant": True},
                                         "inv.json"))
    assert inv.batch_invariant is True and plan_knobs_set(inv) == ["batch_invariant"]
    assert build_config(_parse([]), path).batch_invariant is False
    assert build_config(_parse(["--no-prefix-cache"]), path).no_prefix_cache is True
    assert build_config(_parse([]), path).no_prefix_cache is False


def test_bad_plan_knobs_are_named(tmp_path):
    from strata.plan.options import OptionError
    from strata.serve.engines import plan_options

    with pytest.raises(ServeConfigError, match="no_graph: expected true or false"):
        build_config({}, write(tmp_path, {"model": "m", "no_graph": "yes"}))
    with pytest.raises(OptionError, match="--expert-cache"):
        plan_options(ServeConfig(model="m", expert_cache="many"))
    with pytest.raises(OptionError, match="--kv"):
        plan_options(ServeConfig(model="m", kv="f8"))


@pytest.mark.parametrize("command", ["serve", "generate", "bench"])
def test_spec_is_refused_where_nothing_drafts(command, capsys):
    """--spec N would reserve VRAM for a draft nothing uses: the engine's subcommands refuse it
    by name; 0 is accepted, and `strata plan` still sizes the draft region."""
    import argparse
    import importlib

    from strata.plan.knobs import NO_DRAFT

    def parser():
        p = argparse.ArgumentParser(prog=f"strata {command}")
        importlib.import_module(f"strata.cli.{command}").add_arguments(p)
        return p

    base = ["-m", "/m.gguf"] + (["--prompt", "Hi"] if command == "generate" else [])
    with pytest.raises(SystemExit) as e:
        parser().parse_args(base + ["--spec", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--spec" in err and NO_DRAFT in err, err
    assert "--spec" not in parser().format_help()  # not offered where it cannot run
    assert parser().parse_args(base + ["--spec", "0"]).spec == 0

    plan = argparse.ArgumentParser()
    importlib.import_module("strata.cli.plan").add_arguments(plan)
    assert plan.parse_args(["-m", "/m.gguf", "--spec", "2"]).spec == 2
    assert "--spec" in plan.format_help()


def test_a_config_file_that_cannot_be_read_is_named(tmp_path):
    """The library call (not only the CLI's check before it): a folder, an unreadable file."""
    import os

    from strata.serve.config import ServeConfigError, read_config_file
    with pytest.raises(ServeConfigError, match="is a folder, not a file"):
        read_config_file(tmp_path)
    f = tmp_path / "serve.json"
    f.write_text("{}")
    f.chmod(0)
    try:
        if os.access(f, os.R_OK):  # root reads any file: nothing to refuse
            assert read_config_file(f) == {}
        else:
            with pytest.raises(ServeConfigError, match="cannot be read"):
                read_config_file(f)
    finally:
        f.chmod(0o644)
