"""The normalized model spec: the numbers that decide a TP layout, under their Hugging Face names (read by
config/normalize.py)."""
from dataclasses import asdict, dataclass, field, fields, replace

from tpviz.archs import Arch, arch_of
from tpviz.config.kinds import ATTENTION_KINDS, Ffn, LayerSpec, Mixer
from tpviz.config.quant import Quant
from tpviz.config.tower import Tower, encoder_mode
from tpviz.errors import ConfigError

# plausibility limits on the large dims, far above any real model (vocab 262k, hidden 18k, 512 experts, 126
# layers):
# larger values mean a broken config, and they keep the cost of a map bounded (any config that passes maps in
# ~1 s)
LIMITS = {"vocab_size": 1 << 20, "hidden_size": 1 << 17, "num_experts": 1 << 14, "num_hidden_layers": 1 << 12}
SERVE_DTYPES = ("auto", "bfloat16", "float16", "float32")
KV_DTYPES = {"auto": "", "fp8": "float8_e4m3fn"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float64": 8}


@dataclass
class ModelSpec:
    """The numbers that decide a TP layout, under their Hugging Face names."""
    name: str
    model_type: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_hidden_layers: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v bias
    o_proj_bias: bool = False
    mlp_bias: bool = False  # gate/up/down biases (Llama's mlp_bias)
    qk_norm: bool = False
    qk_norm_full: bool = False  # OLMo-2/3: the q/k norms span the whole projection (all-gathered under TP)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    # the router holds e_score_correction_bias (DeepSeek noaux_tc, Nemotron-H)
    router_score_bias: bool = False
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    q_lora_rank: int = 0  # MLA (DeepSeek); kv_lora_rank > 0 means MLA
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    dtype: str = "bfloat16"  # as served (see served()); config_dtype is what the config says
    config_dtype: str = "bfloat16"
    kv_cache_dtype: str = ""  # "" : the model dtype; "float8_e4m3fn" for --kv-cache-dtype fp8
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    quantization: str = ""  # quant_method of a quantized checkpoint (fp8, mxfp4, ...)
    quant: Quant | None = None  # how its linear and expert weights are stored
    conv_bias: bool = False  # Mamba2 conv1d / LFM2 conv biases
    max_positions: int = 0  # learned position embeddings (GPT-2, GPTBigCode)
    # the longest context vLLM accepts (readers.max_model_len); 0: the config names none
    max_model_len: int = 0
    # recurrent (SSM) state dtype when it differs from the model's (Nemotron-H: float32)
    state_dtype: str = ""
    variant: str = ""  # a decoder variant that changes checkpoint names (Falcon)
    gated_mlp: bool = True  # SwiGLU gate/up; False: one up projection (GPT-2 c_fc, NeoX dense_h_to_4h)
    # Gemma-4's per-layer input embeddings (E2B, E4B): hidden_size_per_layer_input values a layer, looked up
    # in a table of vocab_size_per_layer_input rows; 0: none (in the JSON only when set)
    per_layer_input: int = 0
    per_layer_vocab: int = 0
    # Gemma-3n: AltUp's streams (altup_num_inputs) and LAuReL's rank; 0: none (in the JSON only when set)
    altup_inputs: int = 0
    laurel_rank: int = 0
    # Zamba2: num_mem_blocks shared transformer blocks, the rank of each hybrid layer's LoRA adapters, and
    # whether q/k/v have adapters too (gate_up always does); 0: none (in the JSON only when set)
    shared_blocks: int = 0
    adapter_rank: int = 0
    attention_adapters: bool = False
    layers: list[LayerSpec] = field(default_factory=list)
    tower: Tower | None = None  # a multimodal checkpoint's vision tower, when tpviz models it
    audio: Tower | None = None  # ... and its audio tower (config/tower_audio.py)
    notes: list[str] = field(default_factory=list)
    # the config as given (parsed JSON), read once per request: the live model's readers take the facts the
    # spec has no field for (RoPE scaling, soft-caps, routing groups) from it, never from the source again
    config: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def arch(self) -> Arch:
        """Everything tpviz knows about this model_type (tpviz.archs)."""
        return arch_of(self.model_type)

    @property
    def moe_layers(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if layer.ffn.kind == "moe"]

    @property
    def joint_reduce(self) -> bool:
        """Whether each layer sums its attention and MLP outputs before one all-reduce (its record says)."""
        return "*" in self.arch.joint_reduce or self.variant in self.arch.joint_reduce

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layers)

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if layer.mixer.kind in ATTENTION_KINDS + ("mla",)]

    def groups(self) -> list[tuple[LayerSpec, list[int]]]:
        """Layers with equal LayerSpecs, in order of first appearance."""
        out: dict[LayerSpec, list[int]] = {}
        for i, layer in enumerate(self.layers):
            out.setdefault(layer, []).append(i)
        return list(out.items())

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        """The inverse of dataclasses.asdict (a spec sent to spawned ranks) and of to_dict with the layers
        added back (a shard map's JSON): fields to_dict leaves out were falsy."""
        layers = [LayerSpec(_filled(Mixer, x["mixer"]), _filled(Ffn, x["ffn"])) for x in d.get("layers", [])]
        q = d.get("quant")
        quant = Quant(**{**{k: v for k, v in q.items() if k != "label"}, "ignore": tuple(q["ignore"]),
                         "block": tuple(q["block"]) if q.get("block") else None}) if q else None
        return cls(**{**{k: v for k, v in d.items() if k != "moe_layers"}, "layers": layers, "quant": quant,
                      "tower": Tower.from_dict(d.get("tower")), "audio": Tower.from_dict(d.get("audio"))})

    def first_layers(self, n: int) -> "ModelSpec":
        """The same model cut to its first n layers (the live check's shrink)."""
        return replace(self, num_hidden_layers=n, layers=self.layers[:n])

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def latent_cache(self) -> bool:
        """MLA run as MLA: the KV cache holds the latent, whole on every GPU (not MiniCPM3's per-head K/V)."""
        return self.is_mla and not self.arch.mla_as_attention

    @property
    def dense_layers(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if layer.ffn.kind == "dense"]

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def kv_bytes(self) -> int:
        """Bytes per cached value: the KV-cache dtype when one is chosen (fp8), else the model's."""
        return DTYPE_BYTES.get(self.kv_cache_dtype, self.dtype_bytes)

    def served(self, dtype: str = "auto", kv_cache_dtype: str = "auto",
               mm_encoder: str | None = None) -> "ModelSpec":
        """The spec as vLLM serves it: dtype 'auto' runs a float32 config in bfloat16; kv_cache_dtype 'fp8'
        stores the KV cache (and nothing else) in one byte per value; mm_encoder 'data' keeps the vision
        tower whole on every GPU, 'weights' splits it (--mm-encoder-tp-mode; None: as it is)."""
        if dtype not in SERVE_DTYPES or kv_cache_dtype not in KV_DTYPES:
            raise ConfigError(f"dtype={dtype!r} / kv_cache_dtype={kv_cache_dtype!r}: use dtype one of "
                              f"{', '.join(SERVE_DTYPES)} and kv_cache_dtype one of {', '.join(KV_DTYPES)}")
        if kv_cache_dtype == "fp8" and any(x.mixer.index_topk for x in self.layers):
            raise ConfigError("kv_cache_dtype='fp8' with DeepSeek Sparse Attention: vLLM 0.33 stores its "
                              "sparse MLA cache as fp8_ds_mla (656 bytes a token a layer) or as plain fp8 "
                              "(576) by the attention backend it picks for the GPU, which tpviz does not "
                              "model; use 'auto'")
        served = self.config_dtype if dtype == "auto" else dtype
        served = "bfloat16" if dtype == "auto" and served == "float32" else served
        tower, note = encoder_mode(self.tower, mm_encoder) if mm_encoder else (self.tower, "")
        return replace(self, dtype=served, kv_cache_dtype=KV_DTYPES[kv_cache_dtype], tower=tower,
                       notes=self.notes + [note] if note else self.notes)

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("layers", "quant", "config", "tower", "audio")
             and (v or k not in SET_ONLY)}
        for key in ("tower", "audio"):
            if tower := getattr(self, key):
                d[key] = tower.to_dict()
        d["moe_layers"] = self.moe_layers
        d["quant"] = self.quant.to_dict() if self.quant else None
        return d


SET_ONLY = ("per_layer_input", "per_layer_vocab", "altup_inputs", "laurel_rank", "shared_blocks",
            "adapter_rank", "attention_adapters")  # in the JSON when set


def _filled(cls, d: dict):
    """A Mixer or Ffn from a dict that may leave out its falsy fields (their to_dict does)."""
    return cls(**{f.name: type(f.default)() for f in fields(cls) if f.name != "kind"} | d)
