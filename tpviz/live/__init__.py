"""Run live: a real TP forward pass over spawned ranks (or torchrun), checked against a single device."""
from tpviz.live.check.compare import FP32_TOL, NOISE_MULTIPLE
from tpviz.live.check.verify import prepare, verify
from tpviz.live.errors import LiveError, RankFailure
from tpviz.live.check.inject import INJECTIONS, Injection
from tpviz.live.model.config import LiveConfig
from tpviz.live.model.causal_lm import LiveForCausalLM
from tpviz.live.check.results import Environment, LayerDiff, RankReport, VerifyResult
from tpviz.live.run.runner import choose_backend
from tpviz.live.load.random_weights import random_checkpoint
from tpviz.live.load.source import ModelSource, resolve_model
from tpviz.live.load.weights import load_weights

__all__ = ["verify", "prepare", "FP32_TOL", "NOISE_MULTIPLE", "LiveError", "RankFailure", "INJECTIONS",
           "Injection", "LiveConfig", "LiveForCausalLM", "Environment", "LayerDiff",
           "RankReport", "VerifyResult",
           "choose_backend", "ModelSource", "random_checkpoint", "resolve_model", "load_weights"]
