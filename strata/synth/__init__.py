"""The synthesizer: GGUF models of real shapes with random weights, a real tokenizer and a chosen
routing skew, written at disk speed (`strata synth`)."""

from strata.synth.cache import default_model_path
from strata.synth.config import PRESETS, SynthConfig, preset
from strata.synth.errors import SynthError
from strata.synth.mixes import MIXES
from strata.synth.writer import SynthReport, write_model

__all__ = ["MIXES", "PRESETS", "SynthConfig", "SynthError", "SynthReport", "default_model_path",
           "preset", "write_model"]
