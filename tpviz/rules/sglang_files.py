"""SGLang 0.5.23's model files as tpviz reads them: its model registry (which classes it builds natively, and
which it hands to its Transformers backend) and each file's Groups record (archs/*.py: the group every weight
is cut over, and what the file does otherwise than vLLM's)."""
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tpviz.rules.served import architecture

# configs/model_config.py mm_disabled_models: multimodal off unless --enable-multimodal (no tower is built)
MM_OFF = ("Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration",
          "Step3VLForConditionalGeneration")
# configs/model_config.py is_hybrid_swa_model (with SWA_SINK_ARCHS): the classes whose sliding layers get a
# pool of their own; every other model's sliding layers cache every token, as full attention does
HYBRID_SWA = ("Llama4ForConditionalGeneration", "GptOssForCausalLM", "Gemma4ForCausalLM",
              "Gemma4ForConditionalGeneration", "Step3p5ForCausalLM", "Step3p7ForConditionalGeneration",
              "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM")
@lru_cache(maxsize=1)
def sglang_registry() -> dict:
    """SGLang 0.5.23's model registry (sglang_registry.json, regenerated from the wheel by
    scripts/sglang_registry.py): its native classes, and the model types its own config classes rename."""
    return json.loads(Path(__file__).with_name("sglang_registry.json").read_text())


def native_classes() -> frozenset[str]:
    """The architecture classes SGLang 0.5.23 builds with a model file of its own."""
    return frozenset(sglang_registry()["models"])


def classes(cfg: dict) -> list[str]:
    """The config's `architectures` entries (none when it names none)."""
    archs = cfg.get("architectures")
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def mm_off(cfg: dict) -> bool:
    """Whether SGLang builds this checkpoint's text model alone by default (its first architecture)."""
    return architecture(cfg) in MM_OFF


def transformers_served(cfg: dict) -> str | None:
    """The config's class where SGLang builds none of its `architectures` natively and tries its Transformers
    backend (model_loader/utils.py get_model_architecture: any native entry wins; a model type SGLang's own
    config class renames counts as renamed), else None."""
    names = classes(cfg)
    renamed = sglang_registry()["renamed"].get(str(cfg.get("model_type", "")), [])
    return names[0] if names and not set(names + renamed) & native_classes() else None


@dataclass(frozen=True)
class Groups:
    """The group each weight of one model file is cut over (sglang/srt/models/<file>): 'tp' the whole stage,
    'attn_tp' the attention group (for the embedding: under attention DP), 'replicated' whole on every GPU,
    'switch' tp unless the layout's switch keeps it whole (--moe-dense-tp-size 1,
    SGLANG_SHARED_EXPERT_TP1)."""
    file: str
    attention: str = "tp"  # q/k/v/o (MLA: q_b, kv_b, o), and a linear-attention mixer's tables
    embed: str = "tp"  # 'dp_whole': tp, whole on every GPU under attention DP (qwen3_5.py's enable_tp=not dp)
    lm_head: str = "tp"  # 'attn_tp': the attention group under --enable-dp-lm-head; tied: the embedding's
    dense: str = "tp"
    shared: str = "tp"
    expert_limit: str = ""  # 'tp' or 'moe_tp': the model file refuses that width above the expert count
    # the model whose shared expert the file fuses into the MoE at --ep 1 on NVIDIA ("DeepSeek-V3": V3/R1's
    # 256 experts alone; "GLM-4.5": any), as one more routed slot cut like the experts (tp ways at ep 1)
    fuses_shared: str = ""
    head_every_stage: bool = False  # the lm_head is built on every pipeline stage (no is_last_rank guard)
    pp: bool = True  # False: the model's forward has no pp_proxy_tensors (model_runner.py asserts)
    # (class, why): a config of that class, which SGLang lets run under PP, would not be split by it
    pp_broken: tuple[str, str] = ()
    params: tuple[tuple[str, str], ...] = ()  # (vLLM's full parameter name, this file's) where they differ
    # the one ReplicatedLinear MLA's q_a_proj and kv_a_proj_with_mqa load into (deepseek_v2.py), where vLLM
    # merges them into fused_qkv_a_proj
    fused_a: str = ""
    deepstack_first: bool = False  # qwen3_vl.py asserts the first stage holds the layers deepstack feeds
    embed_every_stage: bool = False  # embed_tokens built with no first-stage guard (minimax_m2.py)
    reduces_apart: bool = False  # attention and MLP each all-reduce (commandr.py), where vLLM sums them first
    # a fused q/k/v regrouped at load into [q | k | v] (internlm2.py's wqkv: 'per_kv_group'), where vLLM
    # loads it as stored and regroups its output (Arch.regroups_qkv)
    qkv_order: str = ""
    note: str | None = None  # the file's own note, standing for the record's (vLLM's); '' drops that one
    router_in_model_dtype: bool = False  # the router (and its score bias) in the model dtype, vLLM's float32
    # what the file itself cannot build or run, (spec, layout) -> its refusal or None (archs/<family>.py)
    check: Callable | None = None


def record(arch) -> Groups | None:
    """An architecture record's SGLang model file (None: tpviz has not read one for it)."""
    return getattr(arch, "sglang", None)


def group_width(group: str, tp: int, attn_tp: int, switched: bool = False) -> int:
    return {"tp": tp, "attn_tp": attn_tp, "replicated": 1, "switch": 1 if switched else tp}[group]
