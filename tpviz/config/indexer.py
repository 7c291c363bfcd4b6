"""DeepSeek Sparse Attention's lightning indexer, as vLLM 0.33 builds it (models/deepseek_v32/attention.py,
DeepseekV32Attention): which MLA layers hold one, and its dims. A layer without one reuses the top-k tokens
the last indexer chose (IndexCache), so it holds no indexer weights and no indexer cache."""
from dataclasses import replace

from tpviz.config.fields import read_int
from tpviz.config.kinds import Mixer
from tpviz.errors import ConfigError, MissingFieldError


def indexer_layers(cfg: dict, n: int) -> list[bool]:
    """Which of the n layers build an indexer: index_topk_pattern ("S" skips) when given, else every
    index_topk_freq-th layer counted from index_skip_topk_offset - 1 (every layer by default)."""
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise ConfigError(f"index_topk_pattern must be a string of F and S, got {str(pattern)[:40]}")
        return [i >= len(pattern) or pattern[i] != "S" for i in range(n)]
    freq = read_int(cfg, "index_topk_freq", default=1)
    offset = read_int(cfg, "index_skip_topk_offset", default=2, minimum=-(1 << 20))
    return [max(i - offset + 1, 0) % freq == 0 for i in range(n)]


def with_indexers(cfg: dict, mixers: list[Mixer]) -> list[Mixer]:
    """The MLA mixers with their indexers; a config whose own indexer_types (transformers' GlmMoeDsaConfig)
    disagrees with the layers vLLM builds one in is refused: the checkpoint would lack weights vLLM needs."""
    if not cfg.get("index_topk"):
        raise MissingFieldError("config is missing index_topk, the tokens DeepSeek Sparse Attention's "
                                "indexer selects (vLLM 0.33 builds its buffer from it)", "index_topk")
    for key in ("index_n_heads", "index_head_dim"):
        if cfg.get(key) is None:
            raise MissingFieldError(f"config is missing {key}, a dimension of the lightning indexer", key)
    if not cfg.get("q_lora_rank"):  # the index queries come from the q latent
        raise MissingFieldError("config is missing q_lora_rank, which DeepSeek Sparse Attention's indexer "
                                "reads its queries from", "q_lora_rank")
    heads, dim = read_int(cfg, "index_n_heads"), read_int(cfg, "index_head_dim")
    if dim % 128:  # the key cache stores one float32 scale per 128 values
        raise ConfigError(f"index_head_dim={dim} is not a multiple of 128, the indexer key cache's "
                          "quantization block")
    built = indexer_layers(cfg, len(mixers))
    types = cfg.get("indexer_types")
    if isinstance(types, list) and [t == "full" for t in types] != built:
        first = next((i for i, (t, b) in enumerate(zip(types, built)) if (t == "full") != b), len(built))
        raise ConfigError(f"indexer_types disagrees with index_topk_freq / index_skip_topk_offset / "
                          f"index_topk_pattern at layer {first}: vLLM 0.33 builds its indexers from those")
    topk = read_int(cfg, "index_topk")
    return [replace(m, index_topk=topk, **({"index_heads": heads, "index_dim": dim} if b else {}))
            if m.kind == "mla" else m for m, b in zip(mixers, built)]


def indexer_cache_bytes(index_dim: int) -> int:
    """Bytes per token of one layer's indexer key cache (DeepseekV32IndexerCache): the key in FP8 and one
    float32 scale per 128 values, as uint8, one head, whole on every GPU whatever --kv-cache-dtype says (0
    without an indexer)."""
    return index_dim + index_dim // 128 * 4
