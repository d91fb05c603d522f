"""The decode profiler splits the matvecs by the weight they multiply (stand-in launchers)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def test_profile_units_split_matvecs_by_weight_role(monkeypatch):
    import strata.engine.cuda.decode as decode_mod
    from strata.engine.cuda.profile import profile_step, profile_table

    launched: list[str] = []
    monkeypatch.setattr(decode_mod, "matvec", lambda w, t, x, y, **kw: launched.append(y.size))
    monkeypatch.setattr(decode_mod, "route", lambda *a, **kw: launched.append("route"))
    shape = SimpleNamespace(n_head=4, head_dim=8, n_head_kv=2, n_embd=24, n_expert=6,
                            n_vocab=50)
    y = {n: np.zeros(n, np.float32) for n in (32, 16, 24, 6, 50)}

    class Step:
        m = SimpleNamespace(stream="s", shape=shape)

        def record(self, stream, mode):
            for _ in range(2):  # two layers
                for n in (32, 16, 16, 24, 6):  # q, k, v, attn_output, router
                    decode_mod.matvec("w", 12, "x", y[n])
                decode_mod.route("logits")
            decode_mod.matvec("w", 14, "x", y[50], accumulate=False)

    def capture(record, stream):
        launched.clear()
        record(stream)
        return SimpleNamespace(n_nodes=len(launched), launched=list(launched))

    prof = profile_step(Step(), reps=1, capture=capture, timer=lambda g, st, reps: g.n_nodes)
    assert prof["step"]["nodes"] == 13
    assert {k: v["nodes"] for k, v in prof.items() if k != "step"} == {
        "matvec q": 2, "matvec k/v": 4, "matvec attn_output": 2, "matvec router": 2,
        "route": 2, "matvec head": 1}
    lines = profile_table(prof).splitlines()
    assert "matvec k/v" in lines[1] and "us/kernel" in lines[1]
