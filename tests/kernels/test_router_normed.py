"""The fused decode router (RMSNorm + router logits + softmax top-k in one launch) against a
float64 numpy reference, run twice to show its last-block counter resets, and its argument
checks (simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import reference
from strata.cuda_kernels.router_normed import router_normed, takes

EPS = 1e-6


def _rows(name, n_rows, n_cols, rng, *, x, ties=()):
    """(w [n_rows, row_bytes] u8, its float64 values per gguf-py): random normal rows, each
    (dst, src) of `ties` a copy of row src (bit-identical logits: a tie) leaning towards x so
    the tie lands in the top k."""
    vals = rng.standard_normal((n_rows, n_cols)) * (2 / np.sqrt(n_cols))  # logits ~ N(0, 4)
    for dst, src in ties:
        vals[src] += np.sign(x) / np.sqrt(n_cols)
        vals[dst] = vals[src]
    dtype = np.float32 if name == "F32" else np.float16
    w = np.ascontiguousarray(vals.astype(dtype)).view(np.uint8)  # [n_rows, row_bytes] u8
    return w, reference(name, w, n_cols)


def _ref(x, norm_w, w64, k, norm_topk):
    """(xn, logits, ids, weights) in float64: ties go to the lower expert id."""
    x = x.astype(np.float64)
    xn = x / np.sqrt(np.mean(x * x) + EPS) * norm_w.astype(np.float64)
    logits = w64 @ xn
    p = np.exp(logits - logits.max())
    p /= p.sum()
    ids = np.argsort(-logits, kind="stable")[:k]
    w = p[ids]
    return xn, logits, ids, (w / w.sum() if norm_topk else w)


def _outputs(n_cols, n_rows, k):
    """Poisoned outputs and a zeroed counter: normed [n_cols], logits [n_rows] f32, ids [k] i32,
    weights [k] f32, done [1] i32."""
    return dict(normed_out=np.full(n_cols, np.nan, np.float32),
                logits=np.full(n_rows, np.nan, np.float32), ids=np.full(k, -7, np.int32),
                weights=np.full(k, np.nan, np.float32), done=np.zeros(1, np.int32))


@pytest.mark.parametrize("name,n_rows,n_cols,k,norm_topk,ties", [
    ("F32", 128, 64, 8, True, ((9, 4), (70, 31))),  # the 30B's experts and k, two ties
    ("F16", 60, 64, 4, True, ((5, 2),)),  # an odd count of experts
    ("F16", 24, 128, 4, False, ()),  # weights not renormalised
    ("F32", 20, 1040, 8, True, ()),  # 260 chunks: three warps per row
    ("F32", 300, 64, 16, True, ((150, 3),)),  # more experts than the block's 32 threads, k 16
])
def test_matches_float64_and_reruns(name, n_rows, n_cols, k, norm_topk, ties):
    rng = np.random.default_rng(n_rows * 7 + n_cols)
    x = (rng.standard_normal(n_cols) * 4).astype(np.float32)  # [n_cols] f32, the residual
    w, w64 = _rows(name, n_rows, n_cols, rng, x=x, ties=ties)
    norm_w = rng.uniform(0.5, 1.5, n_cols).astype(np.float32)
    want_xn, want_logits, want_ids, want_w = _ref(x, norm_w, w64, k, norm_topk)
    for (dst, src) in ties:
        assert src < dst and src in want_ids and dst in want_ids  # the tie is really picked
    out = _outputs(n_cols, n_rows, k)
    first = None
    for run in range(2):  # the second launch meets the counter the first one left
        if run:
            for key in ("normed_out", "logits", "weights"):
                out[key][:] = np.nan
            out["ids"][:] = -7
        router_normed(x, norm_w, w, ggml_type=name, eps=EPS, norm_topk=norm_topk, **out)
        assert out["done"][0] == 0, "the last block must reset the counter"
        np.testing.assert_allclose(out["normed_out"], want_xn, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(out["logits"], want_logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out["ids"], want_ids)
        np.testing.assert_allclose(out["weights"], want_w, rtol=1e-5, atol=1e-8)
        got = {key: v.copy() for key, v in out.items()}
        if first is None:
            first = got
        else:
            for key in got:
                np.testing.assert_array_equal(got[key], first[key], err_msg=key)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # 0/0 weights, simulated
def test_nan_logits_keep_ids_in_range():
    n_rows, n_cols, k = 12, 32, 4
    w = np.full((n_rows, n_cols), np.nan, np.float32).view(np.uint8)
    out = _outputs(n_cols, n_rows, k)
    router_normed(np.ones(n_cols, np.float32), np.ones(n_cols, np.float32), w, ggml_type="F32",
                  eps=EPS, **out)
    assert ((out["ids"] >= 0) & (out["ids"] < n_rows)).all(), out["ids"]
    np.testing.assert_array_equal(out["ids"], np.arange(k))  # all -inf: ties to the lower ids
    assert out["done"][0] == 0


def test_nan_logits_are_never_picked_over_real_ones():
    n_rows, n_cols, k = 40, 32, 8
    rng = np.random.default_rng(5)
    vals = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    nan_rows = [0, 7, 13, 21, 22, 39]
    vals[nan_rows] = np.nan
    x = rng.standard_normal(n_cols).astype(np.float32)
    norm_w = np.ones(n_cols, np.float32)
    _, logits, _, _ = _ref(x, norm_w, np.nan_to_num(vals.astype(np.float64), nan=0.0), k, True)
    logits[nan_rows] = -np.inf
    want = np.argsort(-logits, kind="stable")[:k]
    out = _outputs(n_cols, n_rows, k)
    router_normed(x, norm_w, vals.view(np.uint8), ggml_type="F32", eps=EPS, **out)
    np.testing.assert_array_equal(out["ids"], want)
    p = np.exp(logits[want] - logits[want[0]])
    np.testing.assert_allclose(out["weights"], p / p.sum(), rtol=1e-5)


def _args(n_rows=16, n_cols=32, k=4, name="F32"):
    w = np.zeros((n_rows, n_cols), np.float32 if name == "F32" else np.float16).view(np.uint8)
    return dict(x=np.ones(n_cols, np.float32), norm_w=np.ones(n_cols, np.float32), w=w,
                ggml_type=name, eps=EPS, **_outputs(n_cols, n_rows, k))


@pytest.mark.parametrize("change,message", [
    (dict(ggml_type="Q8_0"), "F32 or F16 router rows, got Q8_0"),
    (dict(eps=0.0), "eps must be > 0"),
    (dict(x=np.ones(32, np.float64)), "x: dtype float64"),
    (dict(x=np.ones((1, 32), np.float32)), r"x: shape \(1, 32\)"),
    (dict(x=np.ones(30, np.float32), norm_w=np.ones(30, np.float32),
          normed_out=np.ones(30, np.float32)), "30 columns"),
    (dict(norm_w=np.ones(31, np.float32)), "norm_w: shape"),
    (dict(normed_out=np.ones(16, np.float32)), "normed_out: shape"),
    (dict(logits=np.ones(513, np.float32)), r"n_expert in 1..512"),
    (dict(logits=np.ones(3, np.float32)), r"k in 1..3 \(3 experts\)"),
    (dict(ids=np.zeros(17, np.int32), weights=np.zeros(17, np.float32)), "k in 1..16"),
    (dict(ids=np.zeros(4, np.int64)), "ids: dtype int64"),
    (dict(weights=np.zeros(5, np.float32)), "weights: shape"),
    (dict(done=np.zeros(1, np.uint32)), "done: dtype uint32"),
    (dict(done=np.zeros((1, 1), np.int32)), "done: shape"),
    (dict(w=np.zeros(100, np.uint8)), r"w: 100 bytes, F32 \[16, 32\] needs 2048"),
])
def test_refuses_bad_arguments(change, message):
    args = _args()
    args.update(change)
    with pytest.raises(ValueError, match=message):
        router_normed(args.pop("x"), args.pop("norm_w"), args.pop("w"), **args)


def test_refuses_x_as_its_own_output():
    args = _args()
    x = args.pop("x")
    args["normed_out"] = x
    with pytest.raises(ValueError, match="normed_out must not be x"):
        router_normed(x, args.pop("norm_w"), args.pop("w"), **args)


def test_takes_float_rows_of_whole_chunks_only():
    assert takes("F32", 2048) and takes("F16", 2048) and takes("F32", 12)
    assert not takes("F16", 12) and not takes("Q8_0", 2048) and not takes("BF16", 2048)


@pytest.mark.parametrize("n_rows,k,order", [
    (128, 8, "last_group"),  # the k best all in one group of 32: the others' candidates lose
    (96, 16, "first_group"),  # k = 16 from group 0, the other groups' 16 candidates each lose
    (70, 8, "equal"),  # every logit equal: ties to the lower ids, across groups
    (128, 8, "interleaved"),  # equal pairs straddling groups (e and e + 32)
])
def test_group_ranking_against_arranged_logits(n_rows, k, order):
    """route_block ranks within groups of 32, then the groups' k best among themselves: logits
    arranged so that one group holds every pick, all tie, or ties cross groups."""
    n_cols = 32
    a = np.linspace(-3, 3, n_rows)  # distinct, rising with the id
    if order == "last_group":
        a = a[::-1].copy()
        a[-32:] += 10  # the last group (ids 96..127) holds the top
    elif order == "first_group":
        a[:32] = 10 + a[:32]
    elif order == "equal":
        a[:] = 0.5
    else:
        a = np.round(a, 1)
        a[32:64] = a[:32]  # expert e + 32 ties expert e
    vals = np.zeros((n_rows, n_cols), np.float32)
    vals[:, 0] = a  # logit r = a[r] * xn[0], xn[0] = 1 (x and norm_w all ones)
    x = np.ones(n_cols, np.float32)
    _, logits, want_ids, want_w = _ref(x, np.ones(n_cols, np.float32),
                                       vals.astype(np.float64), k, True)
    out = _outputs(n_cols, n_rows, k)
    router_normed(x, np.ones(n_cols, np.float32), vals.view(np.uint8), ggml_type="F32", eps=EPS,
                  **out)
    np.testing.assert_array_equal(out["ids"], want_ids)
    np.testing.assert_allclose(out["weights"], want_w, rtol=1e-5)


def test_route_false_writes_the_logits_only():
    """route=False (the MoE routes the logits): normed_out and logits as ever; ids, weights and
    the counter untouched (no block counts, none routes)."""
    n_rows, n_cols, k = 40, 64, 4
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(n_cols) * 4).astype(np.float32)
    w, w64 = _rows("F32", n_rows, n_cols, rng, x=x)
    norm_w = rng.uniform(0.5, 1.5, n_cols).astype(np.float32)
    want_xn, want_logits, _, _ = _ref(x, norm_w, w64, k, True)
    out = _outputs(n_cols, n_rows, k)
    out["done"][0] = 5  # a count the kernel must leave alone
    router_normed(x, norm_w, w, ggml_type="F32", eps=EPS, route=False, **out)
    np.testing.assert_allclose(out["normed_out"], want_xn, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(out["logits"], want_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["ids"], -7)
    assert np.isnan(out["weights"]).all() and out["done"][0] == 5
