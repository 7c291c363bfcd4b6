"""Run live: a real TP forward pass over spawned ranks (or torchrun), checked against a single device."""
from tpviz.live.check import FP32_TOL, NOISE_MULTIPLE, prepare, verify
from tpviz.live.errors import LiveError, RankFailure
from tpviz.live.inject import INJECTIONS, Injection
from tpviz.live.model import LiveConfig, LiveForCausalLM
from tpviz.live.results import Environment, LayerDiff, RankReport, VerifyResult
from tpviz.live.runner import choose_backend
from tpviz.live.random_weights import random_checkpoint
from tpviz.live.source import ModelSource, resolve_model
from tpviz.live.weights import load_weights

__all__ = ["verify", "prepare", "FP32_TOL", "NOISE_MULTIPLE", "LiveError", "RankFailure", "INJECTIONS",
           "Injection", "LiveConfig", "LiveForCausalLM", "Environment", "LayerDiff", "RankReport", "VerifyResult",
           "choose_backend", "ModelSource", "random_checkpoint", "resolve_model", "load_weights"]
