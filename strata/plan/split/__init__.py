"""The multi-GPU layer split: contiguous layer ranges, one stage per GPU.

* `carve`: a stage's dense weights (its layers' tensors and the globals it uses), priced and laid
  out by one rule;
* `search`: the placement search (`--layer-split auto`) over every contiguous placement, scored
  by predicted time per token from each stage's compute and misses;
* `stage`: one GPU's plan over its own layers (arena, regions, stage cache, prompt path);
* `tiers`: helper tiers, the globally hottest unclaimed pairs in the VRAM stages leave over;
* `planner`: `plan_split(shape, devices, options, split)` tying them together.

Pure: numbers in, frozen plans out; no CUDA.
"""

from strata.plan.split.carve import (
           WeightCarve,
           stage_weight_names,
           stage_weights_layout,
)
from strata.plan.split.options import SplitOptions, parse_gpus, parse_layer_split
from strata.plan.split.planner import plan_split
from strata.plan.split.result import HelperTier, SplitPlan, Stage

__all__ = ["HelperTier", "SplitOptions", "SplitPlan", "Stage", "WeightCarve", "parse_gpus",
           "parse_layer_split", "plan_split", "stage_weight_names", "stage_weights_layout"]
