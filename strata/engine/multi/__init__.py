"""The multi-GPU driver: a layer split's stages, one per GPU (`SplitModel`), threaded by
`SplitEngine` (the hidden state handed stage to stage, peer-to-peer or through pinned host
memory). The plan is `strata.plan.split`; each stage runs the single-GPU engine's own decode step
and prompt path over its layer range."""

from strata.engine.multi.engine import SplitEngine
from strata.engine.multi.model import SplitModel, stage_plan

__all__ = ["SplitEngine", "SplitModel", "stage_plan"]
