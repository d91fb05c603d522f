"""`ServeConfig`: every knob of `strata serve`, from defaults, a JSON file, and the command line.

The config file is one JSON object whose keys are the long option names, with `_` or `-`
(``{"model": "m.gguf", "port": 8080, "batch": 4, "api_key": "..."}``). The command line wins
over the file, the file over the defaults. An unknown key or a wrong type is an error naming it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from strata.errors import StrataError
from strata.plan.options import MIN_CONTEXT
from strata.serve.response_store import DEFAULT_MIB

DEFAULT_MAX_BODY_BYTES = 8 << 20


class ServeConfigError(StrataError):
    """A bad knob: in the config file or on the command line."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """The server's knobs. `model` is the GGUF path; `batch` is how many sequences decode
    together (one slot each); `max_context` caps each sequence (None: the engine's default).
    The CUDA backend's plan knobs (`kv` .. `profile`, `gpu_mem`, `no_graph`) mean what they mean
    for `strata plan` / `generate`, per sequence, and so do the layer split's (`gpus` ..
    `handoff`); `batch_invariant` is the batched engine's (see the field); the CPU backend
    reads none of them."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    backend: str = "auto"
    api_key: str | None = None
    model_name: str | None = None
    aliases: tuple[str, ...] = ()
    # browser origins allowed to call the server besides this machine's (`*`: any)
    cors_origins: tuple[str, ...] = ()
    batch: int = 1
    max_context: int | None = None
    max_queue: int = 256
    # a finished request's KV is kept for the next prompt that starts the same (its slot's)
    no_prefix_cache: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # the Responses API's stored responses and the conversations, in memory, each store up to
    # this (least recently used leave first; 0: none)
    response_store_mib: int = DEFAULT_MIB
    max_tokens_limit: int | None = None
    chat_template: str | None = None
    # a thinking model's <think> block: "auto" returns it apart (reasoning_content, thinking
    # blocks, reasoning items); "none" leaves it in the answer's text
    reasoning: str = "auto"
    log_level: str = "info"
    gpu_mem: str | None = None
    no_graph: bool = False
    # one sequence's tokens do not depend on the others decoded beside it (CUDA, one GPU): a
    # step of one sequence runs the batched kernels' float32 path, not the fused single step
    batch_invariant: bool = False
    # prompts (or a turn's new tokens) of up to this many run as decode steps (CUDA; 0: never;
    # None: the plan's estimate, `strata.engine.cuda.prompt_steps`)
    prompt_steps: int | None = None
    kv: str = "f16"
    kv_resident: int | None = None
    prefill: str = "auto"
    expert_cache: str = "auto"
    vram_reserve_mib: int | None = None
    ring_mib: int | None = None
    no_prefill_borrow: bool = False
    embd_on_gpu: bool = False
    lend_pct: int | None = None
    lend_floor_slots: int | None = None
    profile: str | None = None
    # a layer split (`strata.engine.multi`): only where `gpus` names several GPUs or `gpu_mem`
    # gives several sizes; one sequence at a time (batch 1)
    gpus: str | None = None
    layer_split: str = "auto"
    cover_b: float | None = None
    no_helper_tiers: bool = False
    no_carve: bool = False
    stage_cache: str | None = None
    gpu_bandwidth: str | None = None
    handoff: str = "auto"

    def __post_init__(self) -> None:
        if not self.model:
            raise ServeConfigError("model: a GGUF file is required (-m FILE)")
        if not 0 <= self.port <= 65535:
            raise ServeConfigError(f"port: {self.port} is not a TCP port (0-65535; 0 picks one)")
        if self.batch < 1:
            raise ServeConfigError(f"batch: must be at least 1, got {self.batch}")
        if self.max_context is not None and self.max_context < MIN_CONTEXT:  # every command's
            raise ServeConfigError(f"max_context: must be at least {MIN_CONTEXT} (a prompt token "
                                   f"and the token it generates), got {self.max_context}")
        if self.max_queue < 1:
            raise ServeConfigError(f"max_queue: must be at least 1, got {self.max_queue}")
        if self.max_body_bytes < 1024:
            raise ServeConfigError(f"max_body_bytes: must be at least 1024, got "
                                   f"{self.max_body_bytes}")
        if self.response_store_mib < 0:
            raise ServeConfigError(f"response_store_mib: must be 0 or more (0: none kept), got "
                                   f"{self.response_store_mib}")
        if self.max_tokens_limit is not None and self.max_tokens_limit < 1:
            raise ServeConfigError(f"max_tokens_limit: must be at least 1, got "
                                   f"{self.max_tokens_limit}")
        if self.prompt_steps is not None and self.prompt_steps < 0:
            raise ServeConfigError(f"prompt_steps: must be 0 or more (0: never), got "
                                   f"{self.prompt_steps}")
        if self.api_key is not None and not self.api_key:
            raise ServeConfigError("api_key: must not be empty (leave it out to disable auth)")
        for origin in self.cors_origins:
            if origin != "*" and not (origin.startswith(("http://", "https://"))
                                      and "/" not in origin.split("://", 1)[1]):
                raise ServeConfigError(f"cors_origins: {origin!r} is not an origin (scheme://"
                                       f"host[:port], no path; or * for any)")
        if self.reasoning not in ("auto", "none"):
            raise ServeConfigError(f"reasoning: {self.reasoning!r} is not one of auto, none")
        if self.log_level not in ("critical", "error", "warning", "info", "debug"):
            raise ServeConfigError(f"log_level: {self.log_level!r} is not one of critical, "
                                   f"error, warning, info, debug")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def _field_types() -> dict[str, Any]:
    return {f.name: f.type for f in fields(ServeConfig)}


def _check_type(key: str, value: Any, declared: str) -> Any:
    if value is None:
        if "None" not in declared:
            raise ServeConfigError(f"{key}: must not be null")
        return None
    if declared.startswith("bool"):
        if not isinstance(value, bool):
            raise ServeConfigError(f"{key}: expected true or false, got {value!r}")
    elif declared.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ServeConfigError(f"{key}: expected an integer, got {value!r}")
    elif declared.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ServeConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    elif declared.startswith("str"):
        if not isinstance(value, str):
            raise ServeConfigError(f"{key}: expected a string, got {value!r}")
    elif declared.startswith("tuple"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ServeConfigError(f"{key}: expected an array of strings, got {value!r}")
        return tuple(value)
    return value


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The knobs in a JSON config file, keys normalised to field names and types checked."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ServeConfigError(f"config file {str(p)!r}: no such file") from None
    except IsADirectoryError:
        raise ServeConfigError(f"config file {str(p)!r} is a folder, not a file") from None
    except OSError as e:  # unreadable: permissions, a device that fails
        raise ServeConfigError(f"config file {str(p)!r} cannot be read: "
                               f"{e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ServeConfigError(f"config file {str(p)!r} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ServeConfigError(f"config file {str(p)!r}: expected a JSON object of knobs")
    types = _field_types()
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in types:
            raise ServeConfigError(f"config file {str(p)!r}: unknown knob {key!r} (known: "
                                   f"{', '.join(sorted(types))})")
        out[name] = _check_type(name, value, str(types[name]))
    if "model" in out and out["model"] and not Path(out["model"]).is_absolute():
        out["model"] = str((p.parent / out["model"]).resolve())  # relative to the file
    return out


def build_config(cli: dict[str, Any], config_file: str | None, *,
                 default_model: Callable[[], str] | None = None) -> ServeConfig:
    """Defaults, then the file's knobs, then every CLI value that was given (not None);
    `default_model()` names the model when neither gives one."""
    merged: dict[str, Any] = read_config_file(config_file) if config_file else {}
    for key, value in cli.items():
        if value is not None and key in _field_types():
            merged[key] = tuple(value) if isinstance(value, list) else value
    if merged.get("api_key") is None and os.environ.get("STRATA_API_KEY"):
        merged["api_key"] = os.environ["STRATA_API_KEY"]
    if not merged.get("model") and default_model is not None:
        merged["model"] = default_model()
    if not merged.get("model"):
        raise ServeConfigError("model: a GGUF file is required (-m FILE, or \"model\" in "
                               "the config file)")
    return ServeConfig(**merged)


SPLIT_KNOBS = ("gpus", "layer_split", "cover_b", "no_helper_tiers", "no_carve", "stage_cache",
               "gpu_bandwidth", "handoff")
PLAN_KNOBS = ("gpu_mem", "no_graph", "batch_invariant", "prompt_steps", "kv", "kv_resident", "prefill",
              "expert_cache", "vram_reserve_mib", "ring_mib", "no_prefill_borrow", "embd_on_gpu",
              "lend_pct", "lend_floor_slots", "profile") + SPLIT_KNOBS


def plan_knobs_set(config: ServeConfig) -> list[str]:
    """The CUDA plan knobs given a value other than their default (for the CPU backend's note)."""
    defaults = ServeConfig(model="-")
    return [k for k in PLAN_KNOBS if getattr(config, k) != getattr(defaults, k)]


def as_dict(config: ServeConfig) -> dict[str, Any]:
    """The knobs as a config file would hold them (the API key masked)."""
    d = dataclasses.asdict(config)
    if d["api_key"] is not None:
        d["api_key"] = "***"
    d["aliases"] = list(d["aliases"])
    d["cors_origins"] = list(d["cors_origins"])
    return d
