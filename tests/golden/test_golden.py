"""Behaviour kept: every preset's and shared config's map (tp 1, 2, 8, 16, every rule set) equals the dump
taken before the redesign, except the changes listed in CHANGED (each named in the commit that made it)."""
import gzip
import json

from tests.golden.dump import (DEPLOY_DUMP, DUMP, LAYOUTS, LIVE_DUMP, SHARED, cases, deploy_cases,
                               live_cases, models, one, refused)

# case key -> why its map may differ from the dump (behaviour the redesign changed on purpose)
FALCON_LENGTH = ("falcon-7b's config leaves max_position_embeddings out; transformers' "
                 "FalconConfig, which vLLM reads it with, defaults it to 2048, now its max_model_len")
CHANGED: dict[str, str] = {f"preset:tiiuae/falcon-7b|{rules}|1": FALCON_LENGTH
                           for rules in ("vllm", "vllm-0.28", "nano-vllm")}
MERGED = "one warning names both expert projections that take the same FP8 fallback (gate_proj and down_proj)"
CHANGED.update({key: MERGED for key in ("preset:Qwen/Qwen3-235B-A22B-FP8|vllm|8",
                                        "preset:Qwen/Qwen3-235B-A22B-FP8|vllm|16",
                                        "preset:Qwen/Qwen3-30B-A3B-FP8|vllm|8",
                                        "preset:Qwen/Qwen3-30B-A3B-FP8|layout 2,1,2,False")})

FUSED_A = ("q_a_proj and kv_a_proj_with_mqa load into vLLM's one replicated fused_qkv_a_proj (kv from row "
           "1536, its scales from row 12), as deepseek_v2.py's mla_params_mapping does (issue 25)")
CHANGED.update({f"preset:deepseek-ai/DeepSeek-V3|{rules}|{tp}": FUSED_A
                for rules in ("vllm", "vllm-0.28", "nano-vllm") for tp in (1, 2, 8, 16)})
SCORE_BIAS = ("the router's e_score_correction_bias is float32, as deepseek_v2.py's DeepseekV2MoE builds it "
              "and the checkpoints store it (issue 25)")
CHANGED.update({key: f"{FUSED_A}; {SCORE_BIAS}" for key in CHANGED if key.startswith("preset:deepseek-ai/")})
CHANGED.update({key: SCORE_BIAS for key in (
    *(f"preset:deepseek-ai/DeepSeek-V3|layout {lay}" for lay in ("2,2,1,False", "2,1,2,False", "2,2,2,True",
                                                                "4,1,2,True")),
    *(f"plan deepseek-ai/DeepSeek-V3|{rules}" for rules in ("vllm", "vllm-0.28", "nano-vllm")))})

TOWER = ("its vision tower is mapped as vLLM 0.33's qwen3_vl.py splits it, on the first pipeline stage "
         "(issue 25)")
CHANGED.update({f"preset:Qwen/Qwen3.5-9B|{rules}|{tp}": TOWER  # nano-vllm refuses tp 8 and 16 as before
                for rules in ("vllm", "vllm-0.28", "nano-vllm") for tp in (1, 2, 8, 16)
                if rules != "nano-vllm" or tp < 8})
CHANGED.update({f"preset:Qwen/Qwen3.5-9B|layout {lay}": TOWER for lay in ("2,2,1,False", "2,1,2,False")})
SIGLIP = ("its SigLIP tower and projector are mapped as vLLM 0.33's siglip.py and gemma3_mm.py build them "
          "(issue 25)")
CHANGED.update({f"preset:google/gemma-3-27b-it|{rules}|{tp}": SIGLIP
                for rules in ("vllm", "vllm-0.28", "nano-vllm") for tp in (1, 2, 8, 16)})
CHANGED.update({f"preset:google/gemma-3-27b-it|layout {lay}": SIGLIP
                for lay in ("2,2,1,False", "2,1,2,False")})
CHANGED["preset:google/gemma-3-27b-it|live"] = "Run live says its vision tower is not run (issue 25)"
GEMMA4_TOWER = ("its vision tower and embed_vision are mapped as vLLM 0.33's gemma4_mm.py builds them "
                "(transformers' Gemma4VisionModel, whole on every GPU), on the first pipeline stage "
                "(issue 25)")
CHANGED.update({f"preset:google/gemma-4-31B-it|{rules}|{tp}": GEMMA4_TOWER  # nano-vllm refuses 8 and 16
                for rules in ("vllm", "vllm-0.28", "nano-vllm") for tp in (1, 2, 8, 16)
                if rules != "nano-vllm" or tp < 8})
CHANGED["preset:google/gemma-4-31B-it|layout 2,1,2,False"] = GEMMA4_TOWER
EVERY_STAGE = ("vLLM's model file builds embed_tokens on every pipeline stage (no is_first_rank guard): each "
               "stage after the first holds its slice of the table too, and the layout says so")


def every_stage_cases() -> dict[str, str]:
    """The pp > 1 layouts (those not refused) of the models whose vLLM model file builds embed_tokens on every
    stage."""
    from tpviz.config.sources import load_spec
    from tpviz.deploy.deployment import deploy
    from tpviz.rules import Layout
    changed = {}
    for name, source in models().items():
        spec = load_spec(source)
        for tp, pp, dp, ep in LAYOUTS:
            if spec.arch.embed_every_stage and pp > 1 and "refused" not in refused(
                    lambda: deploy(spec, Layout(tp, pp, dp, ep), "vllm").to_dict()):
                changed[f"{name}|layout {tp},{pp},{dp},{ep}"] = EVERY_STAGE
    # the 8-GPU plans that rank a pp > 1 layout: less room for the KV cache, or the layout's note
    changed.update({f"plan {m}|{rules}": EVERY_STAGE for m in ("Qwen/Qwen3-30B-A3B", "google/gemma-2-9b-it")
                    for rules in ("vllm", "vllm-0.28")})
    return changed


LLAMA4 = ("its vision tower, adapter and projector are mapped as vLLM 0.33's mllama4.py builds them, and its "
          "decoder under its checkpoint's names (feed_forward, router, fused experts) (issue 25)")
CHANGED.update({f"preset:meta-llama/Llama-4-Scout-17B-16E-Instruct|{rules}|{tp}": LLAMA4  # 40 heads: no tp 16
                for rules in ("vllm", "vllm-0.28", "nano-vllm") for tp in (1, 2, 8)})
CHANGED.update({f"preset:meta-llama/Llama-4-Scout-17B-16E-Instruct|layout {lay}": LLAMA4
                for lay in ("2,2,1,False", "2,1,2,False", "2,2,2,True", "4,1,2,True")})

# notes reworded since the dump: (old text, new text, why), applied to the dump before comparing
REWORDED = [("its tensors are stored under a language-model prefix (e.g. language_model.model.*) and the "
             "vision tower is not split",
             "the vision tower (and any projector or audio tower) is left out of the map and of every memory "
             "figure, and its own TP split is not drawn",
             "vLLM splits vision towers too: the note no longer says a tower is not split (issue 25)")]
KIMI_LIVE = "Kimi-K2.5's decoder runs live as DeepSeek-V3's: the live check lists kimi_k25 (issue 25)"
REWORDED += [("deepseek_v3, deepseek_v2, gpt_oss", "deepseek_v3, deepseek_v2, kimi_k25, gpt_oss", KIMI_LIVE),
             ("deepseek_v3, deepseek_v2 only (shared experts: qwen2_moe, deepseek_v3, deepseek_v2)",
              "deepseek_v3, deepseek_v2, kimi_k25 only (shared experts: qwen2_moe, deepseek_v3, deepseek_v2, "
              "kimi_k25)", KIMI_LIVE)]
KIMI_VL_LIVE = "Kimi-VL's decoder runs live as DeepSeek-V3's, as Kimi-K2.5's: the list names it (issue 25)"
REWORDED += [("deepseek_v2, kimi_k25, gpt_oss", "deepseek_v2, kimi_k25, kimi_vl, gpt_oss", KIMI_VL_LIVE),
             ("kimi_k25 only (shared experts: qwen2_moe, deepseek_v3, deepseek_v2, kimi_k25)",
              "kimi_k25, kimi_vl only (shared experts: qwen2_moe, deepseek_v3, deepseek_v2, kimi_k25, "
              "kimi_vl)",
              KIMI_VL_LIVE)]


def load(path) -> dict:
    text = gzip.decompress(path.read_bytes()).decode()
    for old, new, _ in REWORDED:
        text = text.replace(old, new)
    return json.loads(text)


def first_difference(a, b, path: str = "") -> str | None:
    """Where two JSON values first differ, as a path and both values."""
    number = (int, float)
    if all(isinstance(x, number) and not isinstance(x, bool) for x in (a, b)):
        return None if a == b else f"{path}: {a} != {b}"  # JSON has one number type: 0 and 0.0 are equal
    if type(a) is not type(b):
        return f"{path}: {str(a)[:200]} != {str(b)[:200]}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'the dump' if k in a else 'the code'}"
            if (d := first_difference(a[k], b[k], f"{path}.{k}")) is not None:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b))
                     if (d := first_difference(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path}: {str(a)[:300]} != {str(b)[:300]}"


# vLLM 0.33 (and 0.28) builds a Mamba2 mixer's A and Gated DeltaNet's A_log in float32 (mamba_mixer2.py,
# qwen_gdn_linear_attn.py), as the oracle found (bench/vllm_oracle.py): 2 bytes more per head per layer
FP32_A = "A_log held in float32 (issue 25)"
_A_TPS = {  # (vllm, vllm-0.28, nano-vllm): the tps where the plan is valid, so its bytes changed
    "Qwen/Qwen3-Next-80B-A3B-Thinking": ((1, 2, 8, 16), (1, 2, 8, 16), (1, 2)),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ((1, 2, 8), (1, 2, 8), (1, 2)),
    "nvidia/Nemotron-H-56B-Base-8K": ((1, 2, 8), (1, 2, 8), (1, 2, 8))}
for _m, _tps in _A_TPS.items():
    CHANGED.update({f"preset:{_m}|{r}|{tp}": FP32_A for r, ts in zip(("vllm", "vllm-0.28", "nano-vllm"), _tps)
                    for tp in ts})
    CHANGED.update({f"preset:{_m}|layout {lay}": FP32_A for lay in ("2,1,2,False", "4,1,2,True")
                    if not (_m.endswith("56B-Base-8K") and lay.startswith("4"))})


# presets added after the dump (each tested against its real checkpoint index instead)
ADDED = ("preset:internlm/internlm2-chat-7b|", "preset:ibm-granite/granite-3.1-1b-a400m-instruct|",
         "preset:microsoft/Phi-tiny-MoE-instruct|", "preset:baidu/ERNIE-4.5-0.3B-PT|",
         "preset:Qwen/Qwen2.5-VL-7B-Instruct|", "preset:allenai/olmOCR-7B-0225-preview|",
         "preset:nvidia/Cosmos-Reason2-8B|", "preset:THUDM/chatglm3-6b|",
         "preset:microsoft/phi-2|", "preset:HuggingFaceTB/SmolLM3-3B|",
         "preset:CohereForAI/c4ai-command-r-v01|", "preset:LGAI-EXAONE/EXAONE-4.0-32B|",
         "preset:CohereLabs/c4ai-command-r7b-12-2024|", "preset:MiniMaxAI/MiniMax-M2|",
         "preset:baidu/ERNIE-4.5-21B-A3B-PT|", "preset:LiquidAI/LFM2-8B-A1B|",
         "preset:ibm-granite/granite-4.0-h-tiny|")
ADDED += ("preset:mistralai/Mistral-Small-3.1-24B-Instruct-2503|",  # vision towers (issue 25)
          "preset:Qwen/Qwen3-VL-30B-A3B-Instruct|", "preset:zai-org/GLM-4.5V|")
ADDED += ("preset:zai-org/GLM-4.5-Air|", "preset:zai-org/GLM-4.7|", "preset:THUDM/GLM-4-9B-0414|",  # GLM
          "preset:zai-org/GLM-4.7-Flash|")
ADDED += ("preset:moonshotai/Kimi-K2.5|",)  # Kimi-K2.5 (issue 25)
ADDED += ("preset:moonshotai/Kimi-VL-A3B-Instruct|",)  # Kimi-VL (issue 25)
ADDED += ("preset:google/gemma-4-26B-A4B-it|",)  # Gemma-4 MoE (issue 25)
ADDED += ("preset:openbmb/MiniCPM-V-2_6|", "preset:openbmb/MiniCPM-V-4_5|",  # MiniCPM-V (issue 25)
          "preset:openbmb/MiniCPM-V-4.6|")
ADDED += ("preset:OpenGVLab/InternVL3-1B|",)  # InternVL's tower (issue 25)
ADDED += ("preset:moonshotai/Kimi-Linear-48B-A3B-Instruct|",)  # Kimi-Linear (issue 25)
ADDED += ("preset:deepseek-ai/DeepSeek-V3.2|",)  # DeepSeek Sparse Attention (issue 25)
ADDED += ("preset:ByteDance-Seed/Seed-OSS-36B-Instruct|",  # the Transformers backend's (issue 25)
          "preset:allenai/OLMo-1B-hf|")
ADDED += ("preset:ai21labs/AI21-Jamba-Mini-1.5|",  # Mamba1 and parallel Mamba2 hybrids (issue 25)
          "preset:tiiuae/Falcon-H1-0.5B-Instruct|")
ADDED += ("preset:openbmb/MiniCPM-2B-sft-bf16|",)  # MiniCPM (issue 25)
ADDED += ("preset:llava-hf/llava-onevision-qwen2-7b-ov-hf|", "preset:facebook/cwm|",  # presets (issue 25)
          "preset:stepfun-ai/step3|", "preset:deepseek-ai/DeepSeek-V2-Lite-Chat|")
ADDED += ("preset:meta-llama/Llama-4-Maverick-17B-128E-Instruct|",  # the largest VLMs (issue 25)
          "preset:Qwen/Qwen3-VL-235B-A22B-Instruct|")
ADDED += ("preset:zai-org/GLM-5|",)  # GLM-MoE-DSA (issue 25)
ADDED += ("preset:deepseek-ai/DeepSeek-OCR|",)  # DeepSeek-OCR's DeepEncoder (issue 25)
ADDED += ("preset:tencent/Hunyuan-A13B-Instruct|",)
ADDED += ("preset:mistralai/Mamba-Codestral-7B-v0.1|",)  # pure Mamba2 (issue 25)
ADDED += ("preset:tiiuae/falcon-mamba-7b|", "preset:state-spaces/mamba-2.8b-hf|")  # pure Mamba1 (issue 25)
# LLaVA (text sizes left to the class), audio towers, Qwen2.5-Omni's thinker, and presets for architectures
# mapped before without one (issue 25)
ADDED += tuple(f"preset:{k}|" for k in (
    "llava-hf/llava-1.5-7b-hf", "llava-hf/llava-v1.6-mistral-7b-hf", "mistral-community/pixtral-12b",
    "Qwen/Qwen2-Audio-7B", "Qwen/Qwen2.5-Omni-7B", "Qwen/Qwen2.5-Omni-3B", "Qwen/Qwen3.5-35B-A3B",
    "google/vaultgemma-1b", "arcee-ai/AFM-4.5B", "tencent/Hy-MT2-7B", "bigcode/starcoder2-3b",
    "allenai/OLMo-2-1124-7B", "google/gemma-2b", "OpenGVLab/InternVL3-1B-hf",
    "zai-org/GLM-4.1V-9B-Thinking", "allenai/Olmo-3-1025-7B", "allenai/FlexOlmo-7x7B-1T",
    "inceptionai/Jais-2-8B-Chat", "Qwen/Qwen3-Omni-30B-A3B-Instruct", "google/gemma-3-4b-it",
    "openbmb/MiniCPM3-4B"))
ADDED += ("preset:google/gemma-3n-E2B-it|", "preset:google/gemma-3n-E4B-it|")  # Gemma-3n (issue 25)
ADDED += ("preset:THUDM/glm-4-9b-chat-hf|",)  # GLM-4-hf on the Transformers backend (issue 25)
ADDED += ("preset:stepfun-ai/Step-3.5-Flash|",)  # Step-3.5 (issue 25)
ADDED += ("preset:stepfun-ai/Step-3.7-Flash|",)  # Step-3.7, its tower left out (issue 25)
ADDED += ("preset:Zyphra/Zamba2-2.7B|",)  # Zamba2's shared blocks (issue 25)


def compare(golden: dict, now: dict) -> None:
    """Every case equals its dump, except those CHANGED lists (which must differ)."""
    differ = []
    assert all(k.startswith(ADDED) for k in set(now) - set(golden)), sorted(set(now) - set(golden))[:5]
    for key, value in now.items():
        if key not in golden:
            continue
        value = json.loads(json.dumps(value))  # tuples as lists, as the dump holds them
        if key in CHANGED:
            assert value != golden[key], f"{key} is listed as changed ({CHANGED[key]}) but equals the dump"
        elif (d := first_difference(golden[key], value)) is not None:
            differ.append(f"{key}: {d}")
    assert not differ, f"{len(differ)} cases differ from the dump:\n" + "\n".join(differ[:20])


def test_every_map_is_kept():
    keys = [key for key, *_ in cases()]
    if not SHARED.is_dir():
        assert all(k.startswith("preset:") for k in keys)
    compare(load(DUMP), {key: one(source, tp, rules) for key, source, tp, rules in cases()})


def test_every_layout_and_plan_is_kept():
    CHANGED.update(every_stage_cases())
    compare(load(DEPLOY_DUMP), {key: refused(f) for key, f in deploy_cases()})


def test_every_live_model_is_kept():
    compare(load(LIVE_DUMP), {key: refused(f) for key, f in live_cases()})
