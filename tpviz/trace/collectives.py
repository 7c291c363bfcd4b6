"""The collectives of a TP forward pass and the bytes each moves, read off the shard map's layers.

A ring all-reduce over tp GPUs sends 2 (tp - 1) / tp of the tensor from every GPU; how the lm_head's
vocabulary blocks are joined is the rule set's (vLLM all-gathers them, nano-vllm gathers them to GPU 0).
"""
from collections import Counter
from dataclasses import dataclass

from tpviz.plan import arch_names
from tpviz.rules import RuleSet
from tpviz.trace.shardmap import ShardMap


@dataclass
class Collective:
    """One kind of communication in a forward pass."""
    op: str
    where: str
    count: int  # times per forward pass
    bytes_per_token: int  # size of the reduced / gathered tensor, per token, per occurrence
    # bytes per token each GPU sends for one occurrence (ring all-reduce, gather to rank 0)
    sent_per_rank: float

    @property
    def total_per_token(self) -> int:
        """Bytes per token over the whole forward pass."""
        return self.count * self.bytes_per_token


def _layers_of(m: ShardMap, families: tuple[str, ...], layer_class: str = "RowParallelLinear") -> set[int]:
    layers = set()
    for p in m.params:
        if p.family in families and p.layer_class == layer_class and p.split_dim is not None:
            layers.update(p.run_layers or [])
    return layers


def collectives(m: ShardMap) -> list[Collective]:
    """Collectives per forward pass: all-reduce after o_proj and down_proj, the embedding all-reduce, the
    lm_head logits (all-gathered by vLLM, gathered to GPU 0 by nano-vllm) and OLMo-2/3's q/k all-gathers."""
    tp, b = m.tp_size, m.model_dtype_bytes
    if tp == 1:
        return []
    hidden = m.model.hidden_size * b
    ring = 2 * (tp - 1) / tp  # a ring all-reduce sends this fraction of the tensor from every GPU
    # every mixer's out-projection reduces
    mixers = _layers_of(m, ("o_proj", "linear_attn", "mamba1", "mamba", "conv"))
    mlps = _layers_of(m, ("down_proj", "experts"))  # a MoE layer reduces routed + shared experts once
    joint = m.rules.joint_reduce(m.model)  # Falcon, Cohere: attention + MLP summed, reduced once per layer
    # Falcon-H1: the Mamba2 beside each layer's attention reduces its out_proj apart
    beside = sum(1 for i in mixers if m.model.layers[i].mixer.beside)
    attn, mlp = len(mixers) + beside, len(mlps - mixers if joint else mlps)
    vocab_param = next((p for p in m.params if p.family == "lm_head"), None) or next(
        p for p in m.params if p.family == "embed")
    padded_vocab = vocab_param.local_shapes[0][0] * tp
    logits = padded_vocab * b
    return [
        Collective("all-reduce", "after o_proj / out_proj and down_proj together (attention + MLP summed "
                   "first)" if joint else "after o_proj / out_proj (the mixer's output, row-parallel)", attn,
                   hidden, ring * hidden),
        Collective("all-reduce", "after down_proj (MLP / MoE output, row-parallel)", mlp,
                   hidden, ring * hidden),
        *norm_collectives(m.model, tp),
        *mixer_collectives(m.model, tp),
        *mlp_gather_collectives(m.model, tp),
        *adapter_collectives(m.model, tp),
        *shared_collectives(m.model, tp),
        Collective("all-reduce", "after embed_tokens (each GPU looks up only its vocab rows)", 1,
                   hidden, ring * hidden),
        *per_layer_collectives(m.model, tp),
        *altup_laurel_collectives(m.model, tp),
        logits_collective(logits, tp, m.rules),
    ]


def _picked(spec, layers) -> list:
    """The layers (indices; every layer when None) a stage's collectives are counted over."""
    return [spec.layers[i] for i in (range(spec.num_hidden_layers) if layers is None else layers)]


def logits_collective(logits: int, tp: int, rules: RuleSet) -> Collective:
    """The lm_head's logits (`logits` bytes per sampled token, padded vocab): vLLM's LogitsProcessor
    all-gathers them (Platform.use_all_gather, CUDA); nano-vllm's ParallelLMHead gathers them to GPU 0."""
    if rules.logits == "gather":
        return Collective("gather",
                          "lm_head logits to GPU 0 (each GPU has its vocab block; per sampled token)", 1,
                          logits, logits / tp)
    return Collective("all-gather",
                      "lm_head logits to every GPU (each GPU has its vocab block; per sampled token)",
                      1, logits, logits * (tp - 1) / tp)


def per_layer_collectives(spec, tp: int) -> list[Collective]:
    """Gemma-4's per-layer inputs, on the first stage: embed_tokens_per_layer all-reduces each token's
    lookup (VocabParallelEmbedding) and per_layer_model_projection all-gathers its rows (gather_output), both
    layers x hidden_size_per_layer_input values a token."""
    if tp == 1 or not spec.per_layer_input:
        return []
    size = spec.num_hidden_layers * spec.per_layer_input * spec.dtype_bytes
    return [Collective("all-reduce", "after embed_tokens_per_layer (each GPU looks up only its vocab rows)",
                       1, size, 2 * (tp - 1) / tp * size),
            Collective("all-gather", "after per_layer_model_projection (gather_output: every GPU needs every "
                       "layer's input)", 1, size, (tp - 1) / tp * size)]


def altup_laurel_collectives(spec, tp: int, layers=None) -> list[Collective]:
    """Gemma-3n: LAuReL's linear_right all-reduces in every layer (of `layers`) (row-parallel), and each of
    AltUp's altup_num_inputs - 1 stream projections, made after the embedding and unmade before the final
    norm, all-gathers its rows (gather_output). The all-reduce first, the gathers second."""
    if tp == 1 or not spec.altup_inputs:
        return []
    hidden = spec.hidden_size * spec.dtype_bytes
    count = spec.num_hidden_layers if layers is None else len(layers)
    return [Collective("all-reduce", "after laurel.linear_right (LAuReL's low-rank residual, row-parallel)",
                       count, hidden, 2 * (tp - 1) / tp * hidden),
            Collective("all-gather", "after altup_projections and altup_unembed_projections (gather_output: "
                       "every GPU needs each extra stream whole)", 2 * (spec.altup_inputs - 1), hidden,
                       (tp - 1) / tp * hidden)]


def mlp_gather_collectives(spec, tp: int, layers=None) -> list[Collective]:
    """A dense MLP whose gate_up_proj gathers its output (GLM-4 on vLLM 0.33's Transformers backend:
    colwise_gather_output): every layer of `layers` all-gathers 2 x intermediate values a token."""
    if tp == 1 or not spec.arch.mlp_gather:
        return []
    picked = _picked(spec, layers)
    sizes = Counter(2 * layer.ffn.size * spec.dtype_bytes for layer in picked if layer.ffn.kind == "dense")
    return [Collective("all-gather", "after gate_up_proj (gather_output: every GPU needs all of gate | up "
                       "before down_proj)", count, size, (tp - 1) / tp * size)
            for size, count in sizes.items()]


def adapter_collectives(spec, tp: int, layers=None) -> list[Collective]:
    """Zamba2: each hybrid layer of `layers` runs LoRA adapters whose A all-gathers its adapter_rank outputs
    (gather_output=True): one on gate_up, and one each on q, k and v with attention adapters."""
    hybrid = sum(1 for layer in _picked(spec, layers) if layer.mixer.beside)
    count = hybrid * (1 + 3 * spec.attention_adapters)
    if tp == 1 or not spec.shared_blocks or not count:
        return []
    size = spec.adapter_rank * spec.dtype_bytes
    return [Collective("all-gather", "after each LoRA adapter's A (gather_output: B reads all adapter_rank "
                       "values)", count, size, (tp - 1) / tp * size)]


def shared_collectives(spec, tp: int, layers=None) -> list[Collective]:
    """A shared MLP that all-reduces apart from the experts beside it (Granite-4 hybrids: vLLM 0.33's
    GraniteMoeSharedMLP output_linear reduces, and so does the FusedMoE), over `layers` (every layer by
    default)."""
    picked = _picked(spec, layers)
    count = sum(1 for layer in picked if layer.ffn.kind == "moe" and layer.ffn.shared)
    if tp == 1 or not spec.arch.shared_reduce or not count:
        return []
    hidden = spec.hidden_size * spec.dtype_bytes
    down = arch_names(spec).shared_down  # Granite-4's output_linear, Gemma-4's MLP down_proj
    return [Collective("all-reduce", f"after the shared MLP's {down} (reduced apart from the experts)",
                       count, hidden, 2 * (tp - 1) / tp * hidden)]


def mixer_collectives(spec, tp: int, layers=None) -> list[Collective]:
    """All-reduces inside a mixer, over `layers` (every layer by default): Mamba1's x_proj is row-parallel
    (vLLM 0.33 MambaMixer), so each layer sums every GPU's dt | B | C (dt_rank + 2 x state values a token)
    before dt_proj."""
    if tp == 1:
        return []
    picked = _picked(spec, layers)
    sizes = Counter((mx.dt_rank + 2 * mx.state) * spec.dtype_bytes
                    for layer in picked for mx in layer.mixer.parts if mx.kind == "mamba1")
    return [Collective("all-reduce", "after Mamba1's x_proj (dt, B and C of every GPU's channels summed)",
                       count, size, 2 * (tp - 1) / tp * size) for size, count in sizes.items()]


def norm_collectives(spec, tp: int, layers=None) -> list[Collective]:
    """The collectives of norms whose span crosses the tp cut, over `layers` (indices; every layer by
    default). OLMo-2/3 norm q and k over all heads, so each attention layer all-gathers both first (vLLM
    0.33's TP-aware RMSNorm; the nano-vllm layers do the same): each GPU sends its heads' slice to the others.
    A Mamba2 gated norm over one group all-reduces each token's fp32 sum of squares (vLLM 0.33
    Mixer2RMSNormGated.forward_native); MiniMax-M2's q/k norms all-reduce two fp32 variances per token."""
    if tp == 1:
        return []
    picked = _picked(spec, layers)
    attention = sum(1 for layer in picked if layer.mixer.is_attention)
    mamba = sum(1 for layer in picked for mx in layer.mixer.parts  # none without its weight (Falcon-H1)
                if mx.kind == "mamba2" and mx.groups == 1 and not mx.no_norm)
    share, b = (tp - 1) / tp, spec.dtype_bytes
    out = [Collective("all-gather",
                      f"{what} before its norm over all heads (OLMo: each GPU holds its heads' slice)",
                      attention, size, size * share)
           for what, size in (("q", spec.num_attention_heads * spec.head_dim * b),
                              ("k",
                               spec.num_key_value_heads * spec.head_dim * b))] if spec.qk_norm_full else []
    if spec.arch.qk_norm == "tp" and attention:  # MiniMax-M2: q and k variances, fp32, in one all-reduce
        out.append(Collective("all-reduce", "q and k norms' per-token variances (each norm spans every GPU's "
                              "heads; vLLM 0.33 minimax_rms_norm)", attention, 8, 2 * share * 8))
    if mamba:
        out.append(Collective("all-reduce",
                              "Mamba2 gated norm's sum of squares (its one group spans every GPU)",
                              mamba, 4, 2 * share * 4))
    return [c for c in out if c.count]
