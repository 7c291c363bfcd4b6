"""Model-wide tensors beyond the embedding, lm_head and final norm, as the architecture record lists them."""
from tpviz.archs import Names
from tpviz.plan.core import ParamPlan, norm, replicated


def extra_globals(spec, names: Names) -> list[ParamPlan]:
    """Learned position embeddings (GPT-2, GPTBigCode) and BLOOM's embedding norm."""
    plans = []
    if "positions" in spec.arch.extra:
        plans.append(replicated(names.embed.replace("wte", "wpe"), spec.max_positions, spec.hidden_size,
                                note="learned position embeddings: every rank holds them whole"))
    if "embed_norm" in spec.arch.extra:
        plans += norm("transformer.word_embeddings_layernorm", spec.hidden_size, bias=True)
    return plans
