"""Per-layer composition, KV cache, recurrent state and parameter counts of the hybrid and classic presets.

Every expectation is derived here from the raw preset config (tpviz.config.sources.presets()) with the config
rules of vLLM 0.33 written out by hand (see /tmp/research/perlayer.md §1-7, §13), never with tpviz's own
readers:
  KV per token per layer per rank = 2 * kv_heads_per_rank * head_dim * dtype bytes, kv_heads_per_rank = max(1,
  kv/tp) (gpt-oss: kv/tp); sliding/chunked layers are listed apart with their window; MLA = kv_lora_rank +
  rope dim, every rank. GDN state: conv (2*nk*dk + nv*dv)/tp x (K-1), recurrent (nv/tp) x dv x dk; Mamba2:
  conv (h*p + 2*G*N)/tp x (K-1), SSM (h/tp) x p x N (float32 for nemotron_h); short conv: (conv_dim/tp) x
  (L_cache-1).
"""
import copy

import pytest

from tpviz import shard_map
from tpviz.config.sources import presets
from tpviz.config.normalize import normalize

P = presets()
DT = {"bfloat16": 2, "float16": 2, "float32": 4}
ATTN = ("attention", "sliding_attention", "chunked_attention")


def text(cfg: dict) -> dict:
    return {**cfg, **cfg["text_config"]} if isinstance(cfg.get("text_config"), dict) else cfg


# as vLLM's dtype=auto serves it: no dtype (gpt2) or float32 (starcoderbase) -> bf16
def nbytes(c: dict) -> int:
    return min(DT[str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")], 2)


def att(kind, kv, d, w=0):
    return (kind, kv, d, w)


def expected_layers(key: str) -> list[tuple[tuple, tuple]]:
    """[(mixer, ffn)] per layer: mixer = (attention kind, kv heads, head_dim, window) or (kind,);
    ffn = (kind, size[, experts])."""
    c = text(P[key])
    mt = c["model_type"]
    n = c.get("num_hidden_layers") or c.get("n_layer")
    h = c.get("hidden_size") or c.get("n_embd")
    heads = c.get("num_attention_heads") or c.get("n_head")
    kv = c.get("num_key_value_heads") or heads
    d = c.get("head_dim") or c.get("attention_head_dim") or h // heads
    # no layer_types: every full_attention_interval-th layer is full attention; MoE everywhere
    if mt == "qwen3_next":
        k = c["full_attention_interval"]
        moe = ("moe", c["moe_intermediate_size"], c["num_experts"])
        return [(att("attention", kv, d) if (i + 1) % k == 0 else ("gated_deltanet",),
                 moe if i not in c["mlp_only_layers"] and (i + 1) % c["decoder_sparse_step"] == 0 else
                 ("dense", c["intermediate_size"])) for i in range(n)]
    if mt == "qwen3_5_text":  # layer_types; qwen3_5_text: every FFN dense
        return [(att("attention", kv, d) if t == "full_attention" else ("gated_deltanet",),
                 ("dense", c["intermediate_size"])) for t in c["layer_types"]]
    if mt == "nemotron_h":  # one char per layer: M Mamba2, * attention, - MLP, E MoE
        table = {"M": (("mamba2",), ("none",)), "*": (att("attention", kv, d), ("none",)),
                 "-": (("none",), ("dense", c["intermediate_size"])),
                 "E": (("none",), ("moe", c.get("moe_intermediate_size"), c.get("n_routed_experts")))}
        return [table[ch] for ch in c["hybrid_override_pattern"]]
    if mt == "nemotron-nas":
        out = []
        for b in c["block_configs"]:
            a, f = b["attention"], b["ffn"]
            size = int(2 * round(f["ffn_mult"], 6) * h / 3) if not f["no_op"] else 0
            size += -size % 256
            out.append((("none",) if a["no_op"] else att("attention", heads // a["n_heads_in_group"], d),
                        ("none",) if f["no_op"] else ("dense", size)))
        return out
    # NoPE every 4th layer (HF default): full attention; RoPE layers: chunked local attention
    if mt == "llama4_text":
        step = c["interleave_moe_layer_step"]
        return [(att("attention", kv, d) if (i + 1) % 4 == 0 else att("chunked_attention", kv, d,
                                                                      c["attention_chunk_size"]),
                 ("moe", c["intermediate_size"], c["num_local_experts"]) if (i + 1) % step == 0 else
                 ("dense", c["intermediate_size_mlp"])) for i in range(n)]
    if mt == "gemma3_text":
        p = c["sliding_window_pattern"]
        return [(att("attention", kv, d) if (i + 1) % p == 0 else att("sliding_attention", kv, d,
                                                                      c["sliding_window"]),
                 ("dense", c["intermediate_size"])) for i in range(n)]
    if mt == "gemma4_text":  # full layers: global_head_dim, and (K = V) num_global_key_value_heads
        full = att("attention", c["num_global_key_value_heads"] if c["attention_k_eq_v"] else kv,
                   c["global_head_dim"])
        ffn = ("moe", c["moe_intermediate_size"], c["num_experts"]) if c.get("num_experts") else \
            ("dense", c["intermediate_size"])  # 26B-A4B: every layer's MLP with experts beside it
        return [(full if t == "full_attention" else att("sliding_attention", kv, d, c["sliding_window"]),
                 ffn) for t in c["layer_types"]]
    if mt == "gpt_oss":  # vLLM: even layers sliding, odd full; MoE everywhere
        return [(att("sliding_attention", kv, d, c["sliding_window"]) if i % 2 == 0
                 else att("attention", kv, d),
                 ("moe", c["intermediate_size"], c["num_local_experts"])) for i in range(n)]
    if mt == "lfm2":
        size = int(c["block_ffn_dim_multiplier"] * int(2 * c["block_ff_dim"] / 3))
        size = -(-size // c["block_multiple_of"]) * c["block_multiple_of"]
        return [(att("attention", kv, d) if t == "full_attention" else ("short_conv",), ("dense", size))
                for t in c["layer_types"]]
    # classic decoders: multi-query (falcon-7b, starcoder) keep one KV head; bloom / NeoX / gpt2 are
    # multi-head
    kv = 1 if c.get("multi_query") else heads
    return [(att("attention", kv, d), ("dense", c.get("intermediate_size") or c.get("n_inner") or 4 * h))] * n


PRESETS = ["Qwen/Qwen3-Next-80B-A3B-Thinking", "Qwen/Qwen3.5-9B",
           "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
           "nvidia/Nemotron-H-56B-Base-8K", "nvidia/Llama-3_3-Nemotron-Super-49B-v1",
           "meta-llama/Llama-4-Scout-17B-16E-Instruct", "google/gemma-3-27b-it", "google/gemma-4-31B-it",
           "google/gemma-4-26B-A4B-it",
           "openai/gpt-oss-20b", "openai/gpt-oss-120b", "LiquidAI/LFM2.5-VL-1.6B", "tiiuae/falcon-7b",
           "bigscience/bloom-560m", "EleutherAI/pythia-1.4b", "openai-community/gpt2",
           "bigcode/starcoderbase-1b"]
TPS = {"tiiuae/falcon-7b": (1,), "openai/gpt-oss-120b": (1, 4, 8),
       "Qwen/Qwen3-Next-80B-A3B-Thinking": (1, 4, 16), "meta-llama/Llama-4-Scout-17B-16E-Instruct": (1, 8),
       "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (1, 4, 8)}


def group_layers(m) -> list[tuple[tuple, tuple]]:
    """The shard map's layer groups, back to one (mixer, ffn) per layer in the same form as
    expected_layers."""
    out = {}
    for g in m.groups:
        mx, f = g.mixer, g.ffn
        mixer = (mx["kind"], mx["kv_heads"], mx["head_dim"],
                 mx.get("window", 0)) if mx["kind"] in ATTN else (mx["kind"],)
        ffn = {"dense": ("dense", f.get("size")),
               "moe": ("moe", f.get("size"), f.get("experts"))}.get(f["kind"], (f["kind"],))
        for i in g.layers:
            assert i not in out, f"layer {i} in two groups"
            out[i] = (mixer, ffn)
    return [out[i] for i in sorted(out)]


@pytest.mark.parametrize("key", PRESETS)
def test_layer_composition(key):
    want = expected_layers(key)
    m = shard_map(key, 1)
    assert group_layers(m) == want
    assert [(l.mixer.kind, l.ffn.kind) for l in normalize(P[key]).layers] == [(a[0], b[0]) for a, b in want]
    assert m.model.num_hidden_layers == len(want)


def _indices(key, pred):
    return [i for i, (mx, f) in enumerate(expected_layers(key)) if pred(mx, f)]


def test_layer_indices_spelled_out():
    """A few compositions written as plain index lists, as a check on expected_layers itself."""
    assert (_indices("Qwen/Qwen3-Next-80B-A3B-Thinking", lambda mx, f: mx[0] == "attention")
            == list(range(3, 48, 4)))
    assert _indices("Qwen/Qwen3.5-9B", lambda mx, f: mx[0] == "attention") == list(range(3, 32, 4))
    assert _indices("google/gemma-3-27b-it", lambda mx, f: mx[0] == "attention") == list(range(5, 62, 6))
    assert (_indices("google/gemma-4-31B-it", lambda mx, f: mx == ("attention", 4, 512, 0))
            == list(range(5, 60, 6)))
    assert (_indices("meta-llama/Llama-4-Scout-17B-16E-Instruct", lambda mx, f: mx[0] == "attention")
            == list(range(3, 48, 4)))
    assert _indices("openai/gpt-oss-20b", lambda mx, f: mx[0] == "sliding_attention") == list(range(0, 24, 2))
    assert _indices("LiquidAI/LFM2.5-VL-1.6B", lambda mx, f: mx[0] == "attention") == [2, 5, 8, 10, 12, 14]
    nano = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
    assert _indices(nano, lambda mx, f: mx[0] == "attention") == [5, 12, 19, 26, 33, 42]
    assert len(_indices(nano, lambda mx, f: mx[0] == "mamba2")) == len(_indices(nano,
                                                                                lambda mx, f: f[0]
                                                                                == "moe")) == 23
    h56 = "nvidia/Nemotron-H-56B-Base-8K"
    assert [len(_indices(h56, lambda mx, f, k=k: mx[0] == k)) for k in ("mamba2", "attention",
                                                                        "none")] == [54, 10, 54]
    sup = expected_layers("nvidia/Llama-3_3-Nemotron-Super-49B-v1")
    # 31 no-op attentions
    assert sum(mx[0] == "none" for mx, _ in sup) == 31 and all(f[0] == "dense" for _, f in sup)
    # ffn_mult 2.625: int(2*2.625*8192/3) = 14336
    assert sup[0] == (("attention", 8, 128, 0), ("dense", 14336))


def expected_caches(cfg: dict, layers, tp: int) -> tuple[int, list[dict], int]:
    """(full KV bytes per token, windowed entries, state bytes per sequence) on one rank."""
    c, b = text(cfg), nbytes(text(cfg))
    full, windowed, state = 0, {}, 0
    for mx, _ in layers:
        kind = mx[0]
        if kind in ATTN:
            kvr = mx[1] // tp if c["model_type"] == "gpt_oss" else max(1, mx[1] // tp)
            per = 2 * kvr * mx[2] * b
            if kind == "attention":
                full += per
            else:
                e = windowed.setdefault((kind, mx[3]),
                                        {"kind": kind, "window": mx[3], "layers": 0, "bytes_per_token": 0})
                e["layers"] += 1
                e["bytes_per_token"] += per
        elif kind == "gated_deltanet":
            nk, dk, nv, dv = (c[f"linear_{x}"] for x in ("num_key_heads", "key_head_dim", "num_value_heads",
                                                         "value_head_dim"))
            # Qwen3.5: vLLM reads mamba_ssm_dtype
            ssm = DT[c["mamba_ssm_dtype"]] if c.get("mamba_ssm_dtype") else b
            state += ((2 * nk * dk + nv * dv) // tp * (c["linear_conv_kernel_dim"] - 1) * b + nv
                      // tp * dv * dk * ssm)
        elif kind == "mamba2":
            hh, p, g, ns = c["mamba_num_heads"], c["mamba_head_dim"], c["n_groups"], c["ssm_state_size"]
            g = g if g % tp == 0 else tp  # vLLM: a single group is replicated to every rank
            ssm = DT[c.get("mamba_ssm_cache_dtype", "float32")]
            state += (hh * p + 2 * g * ns) // tp * (c["conv_kernel"] - 1) * b + hh // tp * p * ns * ssm
        elif kind == "short_conv":
            state += c.get("conv_dim", c["hidden_size"]) // tp * (c["conv_L_cache"] - 1) * b
    return full, list(windowed.values()), state


CASES = [(k, tp) for k in PRESETS for tp in TPS.get(k, (1, 4))]


@pytest.mark.parametrize("key, tp", CASES)
def test_kv_cache_per_rank(key, tp):
    full, windowed, _ = expected_caches(P[key], expected_layers(key), tp)
    m = shard_map(key, tp)
    for r in m.ranks:
        assert r.kv_cache_bytes_per_token == full, r.rank
        assert sorted(r.kv_cache_windowed, key=str) == sorted(windowed, key=str), r.rank
    r = m.ranks[-1]
    for ctx in (1, 100, 5000, 200_000):  # windows cap the sliding / chunked part
        assert r.cache_bytes(ctx) - r.state_bytes_per_sequence == full * ctx + sum(
            w["bytes_per_token"] * min(ctx, w["window"]) for w in windowed)


STATEFUL = [k for k in PRESETS
            if any(mx[0] in ("gated_deltanet", "mamba2", "short_conv") for mx, _ in expected_layers(k))]
@pytest.mark.parametrize("key, tp", [(k, tp) for k, tp in CASES if k in STATEFUL])
def test_state_per_rank(key, tp):
    _, _, state = expected_caches(P[key], expected_layers(key), tp)
    assert state > 0
    assert {r.state_bytes_per_sequence for r in shard_map(key, tp).ranks} == {state}


def test_stateless_presets_have_no_state():
    for key in set(PRESETS) - set(STATEFUL):
        assert shard_map(key, 1).ranks[0].state_bytes_per_sequence == 0, key


def test_qwen35_state_without_mamba_ssm_dtype():
    """With its mamba_ssm_dtype removed, Qwen3.5-9B keeps both GDN states in bf16, and tpviz counts them
    right."""
    c = text(P["Qwen/Qwen3.5-9B"])
    no_ssm = copy.deepcopy(P["Qwen/Qwen3.5-9B"])
    del no_ssm["text_config"]["mamba_ssm_dtype"]
    for tp in (1, 4):
        _, _, state = expected_caches(no_ssm, expected_layers("Qwen/Qwen3.5-9B"), tp)
        assert shard_map(no_ssm, tp).ranks[0].state_bytes_per_sequence == state == 24 * (
            8192 // tp * 3 * 2 + 32 // tp * 128 * 128 * 2)
    assert c["mamba_ssm_dtype"] == "float32"


def test_mamba2_single_group_replicated():
    """n_groups=1 at tp 4: B and C go whole to every rank, so the conv state has 2*N channels per group
    copy."""
    cfg = copy.deepcopy(P["nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"])
    cfg["n_groups"] = 1
    layers = expected_layers("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    for tp in (1, 4):
        _, _, state = expected_caches(cfg, layers, tp)
        assert state == 23 * ((64 * 64 + 2 * (1 if tp == 1 else tp) * 128) // tp * 3 * 2 + 64
                              // tp * 64 * 128 * 4)
        assert shard_map(cfg, tp).ranks[0].state_bytes_per_sequence == state


def test_mla_latent_cache_on_every_rank():
    c = P["deepseek-ai/DeepSeek-V3"]
    for tp in (1, 8):
        r = shard_map("deepseek-ai/DeepSeek-V3", tp).ranks[-1]
        assert r.kv_cache_bytes_per_token == c["num_hidden_layers"] * (c["kv_lora_rank"]
                                                                       + c["qk_rope_head_dim"]) * 2
        assert r.kv_cache_windowed == [] and r.state_bytes_per_sequence == 0
