"""The towers vLLM 0.33 builds as transformers' own modules (config/tower_hf.py): their tensors are read off
the transformers class itself, built from the sub-config on the meta device as AutoModel.from_config builds
it (one block, since every block holds the same tensors), so the names and shapes are the ones vLLM loads.
All of it is whole on every GPU: an nn.Linear as gemma4_mm.py swaps it (ReplicatedLinear) or as
gemma3n_mm.py leaves it, every other tensor as its module holds it. The embedders are vLLM layers."""
import json
from functools import lru_cache
from math import prod

import torch

from tpviz.config.hf import quiet
from tpviz.config.tower import Tower
from tpviz.config.tower_hf import LAYOUT
from tpviz.errors import ConfigError
from tpviz.layers import VocabParallelEmbedding
from tpviz.plan.core import DT, PROBE, ParamPlan, Source, norm, param, replicated, row
from tpviz.plan.tower_minicpm import whole


@lru_cache(maxsize=16)
def module_tensors(kind: str, config: str) -> tuple[tuple[str, tuple, str, bool], ...]:
    """(name, shape, owning module's class, owned by an nn.Linear) of every tensor the transformers class
    stores (its state_dict: parameters and persistent buffers), built with one block."""
    import transformers  # start-up: loaded when a transformers-built tower is first planned, not on import
    at = LAYOUT[kind]
    sub = {k: v for k, v in json.loads(config).items() if k != "model_type"}
    sub[at.depth] = 1
    try:
        with quiet(), torch.device("meta"):
            model = transformers.AutoModel.from_config(getattr(transformers, at.config_class)(**sub))
    except Exception as e:  # transformers' own checks of the sub-config, in its words
        raise ConfigError(f"{at.key}: transformers' {at.config_class.removesuffix('Config')} cannot be "
                          f"built from it ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})")
    modules = dict(model.named_modules())
    return tuple((name, tuple(t.shape), type(owner := modules[name.rpartition(".")[0]]).__name__,
                  isinstance(owner, torch.nn.Linear)) for name, t in model.state_dict().items())


def _plan(name: str, shape: tuple, owner: str, linear: bool, swapped: bool) -> ParamPlan:
    """One tensor held whole: a linear's weight or bias as ReplicatedLinear (swapped) or nn.Linear, a
    scalar (a clipped linear's bounds) as one value, the rest as its module holds it."""
    if linear:
        plan = replicated(name, shape[0], shape[1] if len(shape) > 1 else 1, bias=len(shape) == 1)
    elif not shape:
        plan = replicated(name, 1, 1, bias=True)
        plan.sources[0].disk = ()
    elif len(shape) > 2 and "Conv" not in owner:  # a table (Gemma-4's [2, positions, width]): rows x width
        plan = replicated(name, prod(shape[:-1]), shape[-1])
        plan.sources[0].disk = shape
    else:
        plan = whole(name, shape)
    if not (linear and swapped):
        plan.layer_class = f"nn.{owner}" if owner in vars(torch.nn) else owner
    return plan


def hf_tower(t: Tower) -> tuple[list[ParamPlan], list[ParamPlan]]:
    """(per-block plans, once-per-tower plans) of the tower itself, named under its prefix."""
    one = f"{t.block_path}.0."
    blocks, once = [], []
    for name, shape, owner, linear in module_tensors(t.kind, t.hf_config):
        block = name.startswith(one)
        plan = _plan(f"{t.prefix}{name.replace(one, t.block_path + '.*.', 1) if block else name}", shape,
                     owner, linear, t.kind.startswith("gemma4"))
        (blocks if block else once).append(plan)
    return blocks, once


def gemma4_embedder(t: Tower) -> list[ParamPlan]:
    """Gemma4MultimodalEmbedder: embedding_projection (ReplicatedLinear) from the tower's output width
    (output_proj_dims, else hidden_size) to the decoder's; its two RMSNorms hold no weight."""
    width = json.loads(t.hf_config).get("output_proj_dims") or t.hidden
    return [replicated(f"{t.projector}embedding_projection.weight", t.out_hidden, width)]


def gemma3n_embedder(t: Tower, rules) -> list[ParamPlan]:
    """Gemma3nMultimodalEmbedder: embedding, a VocabParallelEmbedding of the tower's vocab_size rows;
    hard_embedding_norm and soft_embedding_norm; embedding_projection, a RowParallelLinear whose full-width
    input each GPU cuts itself (input_is_parallel=False); embedding_post_projection_norm holds no weight."""
    vocab, p = json.loads(t.hf_config).get("vocab_size"), t.projector
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise ConfigError(f"audio_config: vocab_size {vocab!r} is not a positive integer")
    table = f"{p}embedding.weight"
    build = lambda tp, r: (lambda m: (m, m.weight))(VocabParallelEmbedding(vocab, PROBE, tp, r, rules=rules,
                                                                           dtype=DT))
    plans = [param(table, "embed", build, (vocab, t.hidden), [Source(table, (vocab, t.hidden))],
                   note="the audio vocabulary, vocab-parallel as embed_tokens",
                   quantity=("audio_config.vocab_size", vocab))]
    plans += [pl for n in ("hard_embedding_norm", "soft_embedding_norm") for pl in norm(f"{p}{n}", t.hidden)]
    return plans + row(f"{p}embedding_projection", t.hidden, t.out_hidden, "audio", None, False,
                       ("audio_config.hidden_size", t.hidden),
                       note="input_is_parallel=False: each GPU cuts its columns of the full-width input")


def gemma4_vision(spec, t: Tower, rules) -> tuple[list[ParamPlan], list[ParamPlan], list[ParamPlan]]:
    blocks, once = hf_tower(t)
    return blocks, [], once + gemma4_embedder(t)


def gemma4_audio(spec, t: Tower, rules) -> tuple[list[ParamPlan], list[ParamPlan]]:
    blocks, once = hf_tower(t)
    return blocks, once + gemma4_embedder(t)


def gemma3n_audio(spec, t: Tower, rules) -> tuple[list[ParamPlan], list[ParamPlan]]:
    blocks, once = hf_tower(t)
    return blocks, once + gemma3n_embedder(t, rules)
