"""A real `strata serve` process for end-to-end tests: the tiny synthetic model on the CPU
backend, on a free port of 127.0.0.1, started from a JSON config file plus command-line flags,
and waited for until it prints READY."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

API_KEY = "test-key-123"
MODEL_NAME = "tiny"
READY_TIMEOUT_S = 300  # a cold numba cache compiles every kernel before READY

# A Qwen-style ChatML template (written for these tests): tools are listed in the system turn,
# calls are <tool_call> blocks, results come back inside <tool_response>.
TOOL_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- 'You may call these functions:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\nCall one as <tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}
{%- elif m.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (m.content or '') }}
{%- for call in m.tool_calls or [] %}
{{- '\\n<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif m.role != 'system' %}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def tiny_model(folder: Path) -> Path:
    """The tiny preset at Q8_0, written once per test session."""
    from strata.synth import preset, write_model

    path = folder / "serve-tiny.gguf"
    if not path.is_file():
        write_model(path, preset("tiny"), mix="Q8_0", seed=0, progress=False)
    return path


class ServeProcess:
    """`strata serve` as a subprocess; `url` once READY. Output is kept in `lines`."""

    def __init__(self, folder: Path, *, config: dict, args: list[str]):
        self.folder = folder
        cfg_path = folder / f"serve-{os.getpid()}-{id(self)}.json"
        cfg_path.write_text(json.dumps(config))
        cmd = [sys.executable, "-m", "strata.cli.main", "serve", "--config", str(cfg_path), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("STRATA_API_KEY", None)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("READY "):
                self.url = line.split()[1]
                self._ready.set()
        self._ready.set()  # the process ended

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> str:
        if not self._ready.wait(timeout) or self.url is None:
            self.stop()
            raise RuntimeError("strata serve never printed READY:\n" + "\n".join(self.lines))
        return self.url

    def wait_exit(self, timeout: float = 120) -> int:
        rc = self.proc.wait(timeout)
        self._ready.wait(5)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_server(folder: Path, **extra_config) -> ServeProcess:
    """The tests' usual server: config file with the model, key, name and knobs; the command
    line overrides the file's port (the file names a port the test never uses)."""
    model = tiny_model(folder)
    template = folder / "tool-template.jinja"
    template.write_text(TOOL_TEMPLATE)
    config = {"model": str(model), "port": 1, "api_key": API_KEY, "model_name": MODEL_NAME,
              "aliases": ["tiny-alias"], "batch": 4, "max_context": 1024,
              "max_body_bytes": 65536, "chat_template": str(template), "backend": "cpu",
              "log_level": "warning", **extra_config}
    server = ServeProcess(folder, config=config, args=["--port", "0"])
    server.wait_ready()
    return server


def wait_for(cond, timeout: float = 10.0, step: float = 0.02) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return True
        time.sleep(step)
    return False
