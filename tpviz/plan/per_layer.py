"""Gemma-4's per-layer input embeddings (E2B, E4B), as vLLM 0.33 models/gemma4.py builds them: every token
looks up hidden_size_per_layer_input values for each layer in one more vocab-parallel table, adds a projection
of its embedding (column-parallel, gathered), and each layer gates them in with two replicated linears."""
from tpviz.archs.names import Names
from tpviz.config.spec import ModelSpec
from tpviz.layers import VocabParallelEmbedding
from tpviz.plan.core import DT, PROBE, ParamPlan, Source, column, norm, param, replicated
from tpviz.rules import RuleSet

TABLE_NOTE = ("every layer's per-layer input of each token (layers x hidden_size_per_layer_input), "
              "vocab-parallel as embed_tokens: a lookup, then an all-reduce")
PROJECTION_NOTE = ("the embedding's projection to every layer's per-layer input: column-parallel with "
                   "gather_output, so each GPU all-gathers the others' rows")


def per_layer_inputs(spec: ModelSpec, names: Names, rules: RuleSet) -> list[ParamPlan]:
    """embed_tokens_per_layer (VocabParallelEmbedding), per_layer_model_projection (ColumnParallelLinear),
    per_layer_projection_norm, and in every layer per_layer_input_gate and per_layer_projection
    (ReplicatedLinear) with post_per_layer_input_norm."""
    d, hidden, v = spec.per_layer_input, spec.hidden_size, spec.per_layer_vocab
    every, width = list(range(spec.num_hidden_layers)), spec.num_hidden_layers * spec.per_layer_input
    base = names.embed.removesuffix("embed_tokens.weight")  # the decoder's prefix ("model.")
    table = f"{base}embed_tokens_per_layer.weight"
    build = lambda tp, r: (lambda m: (m, m.weight))(VocabParallelEmbedding(v, PROBE, tp, r, rules=rules,
                                                                           dtype=DT))
    plans = [param(table, "embed", build, (v, width), [Source(table, (v, width))], note=TABLE_NOTE,
                   quantity=("vocab_size_per_layer_input", v))]
    plans += column(f"{base}per_layer_model_projection", hidden, width, "gate_up", None, False,
                    ("num_hidden_layers x hidden_size_per_layer_input", width), note=PROJECTION_NOTE)
    plans += norm(f"{base}per_layer_projection_norm", d)
    p = names.layer
    plans += [replicated(f"{p}per_layer_input_gate.weight", d, hidden, every),
              replicated(f"{p}per_layer_projection.weight", hidden, d, every)]
    return plans + norm(f"{p}post_per_layer_input_norm", hidden, every)
