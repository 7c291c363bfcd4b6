"""Gemma-3n's and Gemma-4's per-layer input embeddings (E2B, E4B), as vLLM 0.33 models/gemma3n.py and
gemma4.py build them: every token looks up hidden_size_per_layer_input values for each layer in one more
vocab-parallel table, adds a projection of its embedding (column-parallel, gathered), and each layer gates
them in with two replicated linears. Gemma-3n adds AltUp (altup_num_inputs streams of the hidden state:
the extra streams made and unmade by gathered column-parallel projections, mixed in each layer by small
replicated tables) and LAuReL (a low-rank residual beside attention: column- then row-parallel)."""
from tpviz.archs.names import Names
from tpviz.config.spec import ModelSpec
from tpviz.layers import VocabParallelEmbedding
from tpviz.plan.core import DT, FP32, PROBE, ParamPlan, Source, column, norm, param, replicated, row
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


STREAM_NOTE = ("AltUp: makes (or, before the final norm, unmakes) one of the extra hidden-state streams; "
               "column-parallel with gather_output, so each GPU all-gathers the others' rows")
LAUREL_NOTE = "LAuReL's low-rank residual beside attention: column-parallel (no gather), then row-parallel"


def altup_laurel(spec: ModelSpec, names: Names) -> list[ParamPlan]:
    """Gemma-3n: altup_projections and altup_unembed_projections (altup_num_inputs - 1 each), and in every
    layer AltUp's replicated tables (correction_coefs, prediction_coefs, modality_router, router_norm, and
    correct_output_scale, a float32 parameter) and LAuReL's linear_left, linear_right and post_laurel_norm."""
    n, hidden, rank = spec.altup_inputs, spec.hidden_size, spec.laurel_rank
    every, p = list(range(spec.num_hidden_layers)), names.layer
    base = names.embed.removesuffix("embed_tokens.weight")
    plans = [pl for table in ("altup_projections", "altup_unembed_projections") for i in range(n - 1)
             for pl in column(f"{base}{table}.{i}", hidden, hidden, "gate_up", None, False,
                              ("hidden_size", hidden), note=STREAM_NOTE)]
    a = f"{p}altup."
    plans += [replicated(f"{a}correction_coefs.weight", n, n, every),
              replicated(f"{a}prediction_coefs.weight", n * n, n, every),
              replicated(f"{a}modality_router.weight", n, hidden, every)]
    plans += norm(f"{a}router_norm", hidden, every)
    scale = replicated(f"{a}correct_output_scale", hidden, 1, every, bias=True,
                       note="float32 in vLLM whatever the model's dtype")
    scale.element_bytes = FP32
    plans.append(scale)
    plans += column(f"{p}laurel.linear_left", hidden, rank, "gate_up", every, False, ("laurel_rank", rank),
                    note=LAUREL_NOTE)
    plans += row(f"{p}laurel.linear_right", rank, hidden, "down_proj", every, False, ("laurel_rank", rank),
                 note=LAUREL_NOTE)
    return plans + norm(f"{p}laurel.post_laurel_norm", hidden, every)
