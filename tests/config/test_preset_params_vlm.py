"""Parameter counts of the vision-language presets by hand (LLaVA-1.5, LLaVA-NeXT, Pixtral-12B, InternVL3,
GLM-4.1V), tower and decoder, from the raw config numbers (never with tpviz's own readers)."""
from tpviz import shard_map
from tests.config.test_preset_layers import P
from tests.config.test_preset_params import tower_block


def params_llava_clip(c):
    """LLaVA-1.5 as stored: LlamaConfig's default decoder (text_config leaves its sizes to the class: 4096
    wide, 32 layers and heads, 11008 MLP), all of CLIP ViT-L's blocks with its class token, position table and
    both layer norms, and the two-layer projector."""
    v, V = c["vision_config"], c["text_config"]["vocab_size"]
    h, i, n = 4096, 11008, 32
    text = 2 * V * h + h + n * (4 * h * h + 3 * h * i + 2 * h)
    w, p, f = v["hidden_size"], v["patch_size"], v["intermediate_size"]
    block = 4 * (w * w + w) + 2 * (2 * w) + (w * f + f) + (f * w + w)
    tower = (w + 3 * p * p * w + ((v["image_size"] // p) ** 2 + 1) * w + 2 * w
             + v["num_hidden_layers"] * block + 2 * w)
    return text + tower + (w * h + h) + (h * h + h), block + 2 * w


def test_llava_1_5_is_the_release_less_what_vllm_skips():
    """llava-hf/llava-1.5-7b-hf holds 7,063,427,072 values (its hub page's 7.06B); vLLM 0.33's llava.py builds
    CLIP up to vision_feature_layer -2, so the map lacks the last block and post_layernorm."""
    stored, skipped = params_llava_clip(P["llava-hf/llava-1.5-7b-hf"])
    assert stored == 7_063_427_072
    assert shard_map("llava-hf/llava-1.5-7b-hf", 1).total_weight_bytes == (stored - skipped) * 2  # float16


def params_llava_next_mistral(c):
    """LLaVA-NeXT (Mistral-7B) as stored: MistralConfig's defaults for the sizes its text_config leaves out
    (4096 wide, 32 layers of 32 heads of 128) with its 8 KV heads and 14336 MLP; CLIP ViT-L/336 whole, the
    projector and image_newline."""
    V, (h, n, kv) = c["text_config"]["vocab_size"], (4096, 32, 8 * 128)
    i = c["text_config"]["intermediate_size"]
    text = 2 * V * h + h + n * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h)
    v = c["vision_config"]
    w, p, f = v["hidden_size"], v["patch_size"], v["intermediate_size"]
    block = 4 * (w * w + w) + 2 * (2 * w) + (w * f + f) + (f * w + w)
    tower = (w + 3 * p * p * w + ((v["image_size"] // p) ** 2 + 1) * w + 2 * w
             + v["num_hidden_layers"] * block + 2 * w)
    return text + tower + (w * h + h) + (h * h + h) + h, block + 2 * w


def params_pixtral_12b(c):
    """Pixtral-12B: Mistral-NeMo's decoder (32 heads of 128, MistralConfig's default count),
    PixtralVisionConfig's default tower (24 blocks of 1024, 16 heads, gated MLP 4096, RMS norms, an unbiased
    16 x 16 patch conv and ln_pre), and llava.py's biased projector 1024 -> 5120 -> 5120."""
    t = c["text_config"]
    V, h, n, i = t["vocab_size"], t["hidden_size"], t["num_hidden_layers"], t["intermediate_size"]
    q, kv = 32 * t["head_dim"], t["num_key_value_heads"] * t["head_dim"]
    text = 2 * V * h + h + n * (2 * h * q + 2 * h * kv + 3 * h * i + 2 * h)
    w, f, p = 1024, 4096, c["vision_config"]["patch_size"]
    tower = 3 * p * p * w + w + 24 * (4 * w * w + 3 * w * f + 2 * w)
    return text + tower + (w * h + h) + (h * h + h)


def test_llava_next_and_pixtral_presets_by_hand():
    """llava-v1.6-mistral-7b-hf: 7,566,747,648 values stored (its hub page's 7.57B), of which llava_next.py
    skips CLIP's last block and post_layernorm; Pixtral-12B: 12,682,739,712 (the card's 12B decoder + 0.4B
    encoder), every block built (vision_feature_layer -1)."""
    stored, skipped = params_llava_next_mistral(P["llava-hf/llava-v1.6-mistral-7b-hf"])
    assert stored == 7_566_747_648
    assert shard_map("llava-hf/llava-v1.6-mistral-7b-hf", 1).total_weight_bytes == (stored - skipped) * 2
    assert params_pixtral_12b(P["mistral-community/pixtral-12b"]) == 12_682_739_712
    assert shard_map("mistral-community/pixtral-12b", 1).total_weight_bytes == 12_682_739_712 * 2


def test_internvl3_hf_is_its_published_count():
    """InternVL3-1B-hf: InternViT-300M (24 biased blocks of 1024 with layer-scale vectors, a class token and
    position table), the LayerNorm-then-two-linear projector over 4 x 1024 and a Qwen2-0.5B-like decoder,
    untied: 938,193,024 parameters, a count pinned to the -hf revision."""
    c = P["OpenGVLab/InternVL3-1B-hf"]
    t, v = c["text_config"], c["vision_config"]
    h, V, n, i = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"], t["intermediate_size"]
    kv = t["num_key_value_heads"] * h // t["num_attention_heads"]
    text = 2 * V * h + h + n * (h * h + h + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h)
    w, f, p = v["hidden_size"], v["intermediate_size"], v["patch_size"][0]
    block = tower_block(w, f) + 2 * w  # and lambda_1 / lambda_2, its layer-scale vectors
    tower = v["num_hidden_layers"] * block + w + 3 * p * p * w + w + ((448 // p) ** 2 + 1) * w
    wide = 4 * w
    projector = 2 * wide + wide * h + h + h * h + h
    assert text + tower + projector == 938_193_024
    assert shard_map("OpenGVLab/InternVL3-1B-hf", 1).total_weight_bytes == 938_193_024 * 2


def test_glm41v_is_its_published_size():
    """GLM-4.1V-9B-Thinking: 10.3B in the MiniCPM-V 4.5 report's table (no exact count published)."""
    assert round(shard_map("zai-org/GLM-4.1V-9B-Thinking", 1).total_weight_bytes / 2e9, 1) == 10.3
