"""Where each checkpoint tensor loads in the live model, read off the plan the explorer draws, and each rank's
check that the parameters it built are the map on screen."""
from dataclasses import replace

from torch import nn

from tpviz.config.spec import ModelSpec
from tpviz.errors import WeightsError
from tpviz.plan import build_plan
from tpviz.plan.tensors import Tensor, fill, stacked, tensors
from tpviz.rules import RuleSet
from tpviz.trace.checkpoint import IGNORED
from tpviz.trace.tracer import trace_plan

# multimodal checkpoints (Gemma-3, Mistral-3): the text decoder's tensors under a language-model prefix
# (before and after transformers 4.52, as vLLM's hf_to_vllm_mapper reads them); the vision side is not run, so
# never read
TEXT_PREFIXES = {"language_model.model.": "model.", "model.language_model.": "model.",
                 "language_model.lm_head.": "lm_head."}
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                   "model.multi_modal_projector.")
# gpt-oss MXFP4 experts: `<weight>_blocks` / `<weight>_scales` (uint8) load as parts of <weight>, which the
# experts' loader dequantizes (gptoss.py); only these are read as packed integers, never silently as weights
MXFP4_PARTS = {"_blocks": "blocks", "_scales": "scales"}


def layer_of(name: str) -> int | None:
    """The decoder layer a checkpoint tensor belongs to (model.layers.N., also under a multimodal text
    prefix); None for the rest (embeddings, final norm, lm_head, vision tower)."""
    old = next((p for p in TEXT_PREFIXES if name.startswith(p)), None)
    parts = (name if old is None else TEXT_PREFIXES[old] + name[len(old):]).split(".")
    return (int(parts[2]) if len(parts) > 3 and parts[:2] == ["model", "layers"]
            and parts[2].isdigit() else None)


class LoadingMap:
    """Checkpoint tensor name -> (parameter, loaded_shard_id), read off the plan the explorer draws (its
    sources are vLLM's stacked_params_mapping as data); the multimodal wrappers' text prefixes and the vision
    tower's names are handled here. Stacked experts (gpt-oss) load into one parameter named as their tensor,
    MXFP4 blocks and scales as its parts, which the experts' loader dequantizes."""

    def __init__(self, spec: ModelSpec, rules: RuleSet | str = "vllm"):
        self.num_layers = spec.num_hidden_layers
        self.targets = {t.name: self._target(t) for t in tensors(build_plan(spec, rules))}

    @staticmethod
    def _target(t: Tensor) -> tuple[str, object]:
        if not stacked(t.plan, t.source):
            return t.param, t.shard_id
        part = next((p for suffix, p in MXFP4_PARTS.items() if t.name.endswith(suffix)), None)
        return (t.name[:-len("_blocks")] if part else t.name), part

    def target(self, name: str) -> tuple[str, object] | None:
        """Where a checkpoint tensor loads; None for what this model never reads (buffers, the vision tower,
        layers shrunk away). A name the plan lacks maps to itself, so the loader says it has no place."""
        if IGNORED.search(name) or name.startswith(VISION_PREFIXES):  # buffers, MTP heads, the tower
            return None
        old = next((p for p in TEXT_PREFIXES if name.startswith(p)), None)
        if old is not None:
            name = TEXT_PREFIXES[old] + name[len(old):]
        if (layer := layer_of(name)) is not None and layer >= self.num_layers:
            return None
        return self.targets.get(name, (name, None))


def check_against_map(model: nn.Module, tp_rank: int) -> int:
    """Each parameter this rank built against the shard map the explorer draws for the same model and tp: its
    local shape at this rank, read off the same plan's traced layers (experts cut 1 way under EP, where each
    is whole). One line names the first that differs; returns how many were checked. Stacked experts (gpt-oss)
    keep their own layout, which the loader checks tensor by tensor. In an SGLang layout each plan is traced
    at its role's width (Cuts), as the explorer draws it."""
    cfg, stage = model.cfg, model.stage
    params = dict(model.named_parameters())  # this stage's layers and this EP rank's experts only
    checked = 0
    for plan in build_plan(replace(cfg.spec, quant=None, quantization=""), cfg.rules):
        per_expert = plan.experts and plan.name.count("*") == 2
        if plan.experts and not per_expert:
            continue
        whole = plan.family == "experts" and stage.experts is not None and stage.cuts is None
        ways, rank = stage.cuts.of(plan.role) if stage.cuts else (1, 0) if whole else (model.tp_size, tp_rank)
        want = list(trace_plan(plan, ways)[1].local_shapes[rank])
        for layer in plan.layers if plan.layers is not None else [None]:
            for expert in range(plan.experts) if per_expert else [None]:
                name = fill(plan.name, layer, expert)
                if name in params and (have := list(params[name].shape)) != want:
                    raise WeightsError(f"rank {tp_rank}: {name} holds {have}, but the map draws "
                                       f"{want} for this rank: the live model and the "
                                       "explorer's plan disagree")
                checked += name in params
    return checked
