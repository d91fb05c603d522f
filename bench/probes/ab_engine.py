"""What the one-engine A/B probes share (imported from the probe's own folder): timing a prompt
a few times on a loaded engine, and writing the result with date, commit, device and command."""
import datetime
import json
import os
import sys
import time


def time_prompt(eng, prompt, reps: int) -> tuple[list[float], list[float]]:
    """(seconds of each prefill call, seconds of each whole prompt) over `reps` prompts from an
    empty context; the call returns once the host has queued the prompt."""
    calls, walls = [], []
    for _ in range(reps):
        eng.reset()
        eng.synchronize()
        t0 = time.perf_counter()
        eng.prefill(prompt)
        t1 = time.perf_counter()
        eng.synchronize()
        walls.append(time.perf_counter() - t0)
        calls.append(t1 - t0)
    return calls, walls


def write(out: str, script: str, **fields) -> None:
    """Write `fields` with the run's date, commit ($STRATA_COMMIT), device and command."""
    from numba import cuda
    dev = cuda.get_current_device().name
    body = {"date": datetime.date.today().isoformat(),
            "commit": os.environ.get("STRATA_COMMIT", ""),
            "device": dev.decode() if isinstance(dev, bytes) else str(dev),
            "command": f"python bench/probes/{script} " + " ".join(sys.argv[1:]), **fields}
    with open(out, "w") as f:
        json.dump(body, f, indent=1)


def finish(eng, out: str, script: str, same: bool, **fields) -> int:
    """Say whether the settings' logits agreed, write the result, close the engine's model;
    the probe's exit status (1 where the logits differed)."""
    print(f"last-position logits bit-identical across settings: {same}")
    write(out, script, logits_bit_identical=same, **fields)
    eng.m.close()
    return 0 if same else 1
