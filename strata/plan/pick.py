"""The token choice's geometry, which the plan sizes its scratch by: the sampler takes the logits
in chunks of PICK_CHUNK, one block each, and keeps at most PICK_KMAX candidates of each chunk
for the last block's merge (`strata.cuda_kernels.sampling`), and, for a top-p or min-p cut
over every token, each chunk's largest logit and mass."""

from __future__ import annotations

PICK_CHUNK = 4096  # logits a sampler block stages and sorts (a power of two)
PICK_KMAX = 256    # the most candidates top-k keeps (top_k 0 or larger: the 256 largest)
# a row's float settings: temperature, top_p, min_p, repeat, presence and frequency penalties
PICK_FPARAMS = 6
# a row's integer settings: seed, top_k, penalty window, logit-bias entries in use
PICK_IPARAMS = 4
# logit-bias entries a row's table holds ((token id, bias) pairs: 8 KiB a row)
PICK_MAX_BIAS = 1024


def pick_cand_len(n_vocab: int) -> int:
    """Floats of a sampler row's candidate values: each block's PICK_KMAX best, then each
    block's (largest logit, mass) for top-p / min-p over every token."""
    return pick_blocks(n_vocab) * (PICK_KMAX + 2)


def pick_blocks(n_vocab: int) -> int:
    """Blocks of a sampler launch over `n_vocab` logits."""
    if n_vocab < 1:
        raise ValueError(f"n_vocab must be positive, got {n_vocab}")
    return -(-n_vocab // PICK_CHUNK)
