"""Per-layer architecture: every decoder layer is a mixer and an FFN, read from the config's per-layer fields.

Each reader below turns one source of per-layer information (layer_types, hybrid_override_pattern,
block_configs, interleave steps, ...) into layer kinds. A combination tpviz does not model is refused
with one line naming the part, never guessed.
"""
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property

from tpviz.errors import ConfigError
from tpviz.config.fields import json_type

ATTENTION_KINDS = ("attention", "sliding_attention", "chunked_attention")
MIXER_KINDS = ATTENTION_KINDS + ("mla", "gated_deltanet", "mamba1", "mamba2", "short_conv", "kda", "none")
FFN_KINDS = ("dense", "moe", "none")
# a fixed state per sequence instead of a KV cache
STATEFUL = ("gated_deltanet", "mamba1", "mamba2", "short_conv", "kda")


@dataclass(frozen=True)
class Mixer:
    """What mixes tokens in one layer, with the dims its weights and cache need.

    Attention: heads, kv_heads, head_dim (+ window for sliding / chunked). Gated DeltaNet: heads = value
    heads of head_dim, groups = key heads of key_dim. Mamba2: heads of head_dim, groups = n_groups of
    state size. Short conv: conv_kernel only. Kimi Delta Attention (kda): heads of head_dim for q, k and v
    alike, conv_kernel. Mamba1: inner channels, state size, dt_rank, conv_kernel.
    """
    kind: str
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    groups: int = 0
    key_dim: int = 0
    state: int = 0
    conv_kernel: int = 0
    window: int = 0  # sliding window, or attention chunk, in tokens
    rope: bool = True
    output_gate: bool = False  # Qwen3-Next: q_proj also emits a sigmoid gate per head (twice as wide)
    head_gate: bool = False  # Step-3.5: g_proj makes one sigmoid gate per head from the layer input
    k_eq_v: bool = False  # Gemma-4 global layers: no v_proj on disk, k_proj is loaded as both K and V
    # Gemma-4's last num_kv_shared_layers: q_proj alone, attending over an earlier layer's KV cache; they
    # hold no KV heads (kv_heads 0) and cache nothing
    kv_shared: bool = False
    # Step3: q_proj projects to this low-rank width, replicated with k and v; wq then makes the heads
    q_rank: int = 0
    inner: int = 0  # Mamba1: its channels (mamba_expand x hidden_size), cut over tp
    dt_rank: int = 0  # Mamba1: the time-step rank x_proj projects to
    # Mamba2 without its gated norm's weight (Falcon-H1's mamba_rms_norm false), Mamba1 without dt / B / C
    # norm weights (mamba.py)
    no_norm: bool = False
    # a second mixer run on the same input, its output added to this one's (Falcon-H1's Mamba2 beside
    # attention); it reduces apart
    beside: "Mixer | None" = None
    # Zamba2: this attention is a shared block's, run before the layer's own mixer (`beside`), not beside it
    shared_block: bool = False
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): a lightning indexer of index_heads heads of index_dim
    # beside MLA, with a key cache of its own (config/indexer.py); 0: the layer builds none. index_topk: the
    # tokens each query's sparse MLA attends (every layer of such a model, with an indexer or not)
    index_heads: int = 0
    index_dim: int = 0
    index_topk: int = 0

    def __hash__(self) -> int:  # every group walk hashes each layer's mixer: the fields' hash, computed once
        if (h := self.__dict__.get("_hash")) is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:  # str hashes are salted per process: a pickled copy hashes anew
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def is_attention(self) -> bool:
        return self.kind in ATTENTION_KINDS

    @cached_property  # asked per layer by every group walk (the plan's, each rank's KV cache)
    def weights(self) -> "Mixer":
        """The part that decides the tensors: a sliding and a full attention layer of equal dims hold the
        same."""
        if self.is_attention:
            return replace(self, kind="attention", window=0, rope=True)
        return self

    @property
    def label(self) -> str:
        if self.shared_block:
            return f"shared block's attention, then {self.beside.label}"
        rope = ("" if self.rope else ", no RoPE") + (", KV shared" if self.kv_shared else "")
        return {"attention": f"full attention{rope}",
                "sliding_attention": f"sliding attention ({self.window}){rope}",
                "chunked_attention": f"chunked attention ({self.window}){rope}",
                "mla": "MLA attention" + (" + lightning indexer" if self.index_heads else ""),
                "gated_deltanet": "Gated DeltaNet", "mamba2": "Mamba2", "short_conv": "short conv",
                "kda": "Kimi Delta Attention", "mamba1": "Mamba1",
                "none": "no mixer"}[self.kind] + (f" ‖ {self.beside.label}" if self.beside else "")

    @property
    def parts(self) -> tuple["Mixer", ...]:
        """This mixer and the one beside it, if any."""
        return (self,) + ((self.beside,) if self.beside else ())

    def to_dict(self) -> dict:
        d = {**asdict(self), "beside": self.beside.to_dict() if self.beside else None}
        return {k: v for k, v in d.items()
                if v or k == "kind" or (k in ("rope", "kv_heads") and self.is_attention)}


@dataclass(frozen=True)
class Ffn:
    """The layer's feed-forward part: a dense MLP of `size`, or `experts` routed experts of `size` each."""
    kind: str
    size: int = 0
    experts: int = 0
    top_k: int = 0
    shared: int = 0  # shared-expert intermediate size, 0 when none

    @property
    def label(self) -> str:
        if self.kind == "dense":
            return f"dense MLP {self.size}"
        if self.kind == "moe":
            return f"MoE {self.experts}×{self.size}" + (f" + shared {self.shared}" if self.shared else "")
        return "no FFN"

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v or k == "kind"}


@dataclass(frozen=True)
class LayerSpec:
    mixer: Mixer
    ffn: Ffn

    @property
    def label(self) -> str:
        return f"{self.mixer.label} + {self.ffn.label}"

    def to_dict(self) -> dict:
        return {"mixer": self.mixer.to_dict(), "ffn": self.ffn.to_dict()}


def layer_list(cfg: dict, key: str, n: int, kinds: dict) -> list[str] | None:
    """cfg[key] as a list of n known kinds (None when absent), or one line naming what is wrong."""
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be a list with one entry per layer, got {json_type(value)}")
    if len(value) != n:
        raise ConfigError(f"{key} has {len(value)} entries but num_hidden_layers={n}")
    out = []
    for v in value:
        kind = kinds.get(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else None
        if kind is None:
            raise ConfigError(f"{key} entry {v!r} is not a layer kind tpviz knows "
                              f"({', '.join(map(str, kinds))})")
        out.append(kind)
    return out


def index_list(cfg: dict, key: str, n: int) -> list[int] | None:
    """cfg[key] as a list of layer indices in 0..n-1 (None when absent)."""
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ConfigError(f"{key}={str(value)[:60]} must be a list of layer indices")
    if any(not 0 <= i < n for i in value):
        raise ConfigError(f"{key} names a layer outside 0..{n - 1}")
    return value


def per_layer(cfg: dict, key: str, n: int, default):
    """A field that may be one value or a list with one value per layer (Hunyuan's moe_topk)."""
    value = cfg.get(key, default)
    if isinstance(value, list):
        if len(value) != n:
            raise ConfigError(f"{key} has {len(value)} entries but num_hidden_layers={n}")
        return value
    return [value] * n
