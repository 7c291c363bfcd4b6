"""Vision towers (plan/tower.py) against what transformers' own model classes write and what vLLM 0.33's model
files do: names and shapes of a tiny transformers-built checkpoint, the split of heads and MLP rows, the heads
limit on tp and --mm-encoder-tp-mode data, and where a pipeline keeps the tower."""
import pytest
import torch
import transformers

from tpviz import shard_map
from tpviz.cli.main import main
from tpviz.config.sources import load_spec, presets
from tpviz.deploy.deployment import deploy
from tpviz.errors import ConfigError, TPSizeError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.rules import Layout
from tpviz.trace.shardmap import numel
from tests.helpers.errors import one_line

TEXT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=512)
TINY = {  # one per tower family: its wrapper's class and a config transformers builds small
    "Qwen2VLForConditionalGeneration": dict(
        model_type="qwen2_vl", text_config=dict(model_type="qwen2_vl_text", **TEXT),
        vision_config=dict(depth=2, embed_dim=32, num_heads=4, mlp_ratio=2, hidden_size=64)),
    "Qwen2_5_VLForConditionalGeneration": dict(
        model_type="qwen2_5_vl", text_config=dict(model_type="qwen2_5_vl_text", **TEXT),
        vision_config=dict(depth=2, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=64,
                           fullatt_block_indexes=[1])),
    "Qwen3VLForConditionalGeneration": dict(
        model_type="qwen3_vl", text_config=dict(model_type="qwen3_vl_text", head_dim=16, **TEXT),
        vision_config=dict(depth=3, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=64,
                           num_position_embeddings=16, deepstack_visual_indexes=[0, 1])),
}


def written(hf_class: str) -> dict[str, tuple]:
    """Every parameter a tiny model of this class saves, with its shape (built on the meta device)."""
    config = transformers.AutoConfig.for_model(**TINY[hf_class])
    with torch.device("meta"):
        model = getattr(transformers, hf_class)(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


@pytest.mark.parametrize("hf_class", sorted(TINY))
def test_the_map_names_and_shapes_what_transformers_writes(hf_class):
    """transformers 4.52+ writes model.visual.* and model.language_model.*: every tensor matches, the
    tower's too."""
    saved = written(hf_class)
    m = shard_map(TINY[hf_class], 2, tensor_names=set(saved), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    planned = {t.name: t.shape for t in tensors(build_plan(m.model))}
    tower = {n[n.index("visual."):]: s for n, s in saved.items() if "visual." in n}
    assert tower and {n: planned[n] for n in tower} == tower


def test_the_old_layout_checks_too():
    """Checkpoints saved before transformers 4.52 keep the tower at visual.*: the same names match."""
    saved = {n.replace("model.visual.", "visual.").replace("model.language_model.", "model."): s
             for n, s in written("Qwen2_5_VLForConditionalGeneration").items()}
    m = shard_map(TINY["Qwen2_5_VLForConditionalGeneration"], 1, tensor_names=set(saved))
    assert m.checkpoint["verified"] and any(n.startswith("visual.blocks.") for n in saved)
    extra = shard_map(TINY["Qwen2_5_VLForConditionalGeneration"], 1, tensor_names=set(saved) | {
        "visual.blocks.0.attn.q_norm.weight"}).checkpoint
    assert not extra["verified"] and extra["missing_in_map"] == ["visual.blocks.*.attn.q_norm.weight"]


def test_qwen2_5_vl_splits_whole_vision_heads_and_mlp_rows():
    """qwen2_5_vl.py: QKVParallelLinear over 16 vision heads of 80 (q/k/v each 1280 rows), proj, gate/up and
    down as the text layers, the merger's mlp.0 column- and mlp.2 row-parallel; the conv patch embedding
    whole."""
    m = shard_map("Qwen/Qwen2.5-VL-7B-Instruct", 4)
    qkv = m.tensor("visual.blocks.*.attn.qkv.weight")
    assert qkv.blocks == 32 and qkv.shape == [3840, 1280]
    assert [(p.start, p.stop) for p in qkv.rank_pieces(1)] == [(320, 640), (1600, 1920), (2880, 3200)]
    proj = m.tensor("visual.blocks.*.attn.proj.weight")
    assert proj.split_dim == 1 and [(p.start, p.stop) for p in proj.rank_pieces(3)] == [(960, 1280)]
    assert m.tensor("visual.blocks.*.mlp.gate_proj.weight").rank_pieces(2)[0].start == 2 * 855
    assert m.tensor("visual.merger.mlp.2.weight").split_dim == 1
    assert m.tensor("visual.patch_embed.proj.weight").split_dim is None
    assert m.tensor("visual.blocks.*.attn.proj.bias").layer_class == "RowParallelLinear"


def test_qwen2_vl_cuts_its_plain_qkv_in_even_rows():
    """qwen2_vl.py builds qkv as a plain ColumnParallelLinear (3 * embed_dim rows cut in tp blocks; its
    forward all-gathers and re-cuts q, k and v), so GPU 0 of 2 holds all of q and half of k, not heads of
    each."""
    m = shard_map("allenai/olmOCR-7B-0225-preview", 2)
    qkv = m.tensor("visual.blocks.*.attn.qkv.weight")
    assert [(p.start, p.stop) for p in qkv.rank_pieces(0)] == [(0, 1920)]
    assert qkv.layer_class == "ColumnParallelLinear" and [s[0] for s in qkv.sections] == ["q", "k", "v"]


def test_vision_heads_limit_tp_unless_the_encoder_runs_data_parallel():
    """Cosmos-Reason2 (Qwen3-VL): 32 text heads split 32 ways, 16 vision heads do not; vLLM's attention
    divides them and fails. With --mm-encoder-tp-mode data every GPU holds the whole tower and tp 32 maps."""
    with pytest.raises(TPSizeError) as e:
        shard_map("nvidia/Cosmos-Reason2-8B", 32)
    assert one_line(e.value) and "vision_config.num_heads=16" in str(e.value)
    assert "--mm-encoder-tp-mode data" in str(e.value)
    m = shard_map(load_spec("nvidia/Cosmos-Reason2-8B").served(mm_encoder="data"), 32)
    tower = [t for t in m.tensors if t.tower]
    assert tower and all(t.split_dim is None for t in tower)
    biases = m.tensor("visual.blocks.*.attn.proj.bias")  # whole layers: every GPU adds its own bias
    assert biases.layer_class.endswith("(disable_tp)")
    assert any("every GPU holds the whole vision tower" in n for n in m.model.notes)
    whole = sum(p.count * numel(p.shape) for p in m.params if p.tower)
    assert m.ranks[31].weight_bytes_by_family["vision"] == whole * 2


def test_a_vision_mlp_that_tp_does_not_divide_names_its_key():
    """Qwen2.5-VL-7B's vision MLP is 3420 wide: 3420 / 8 is no whole number of rows."""
    spec = load_spec({**presets()["Qwen/Qwen2.5-VL-7B-Instruct"], "num_attention_heads": 32,
                      "num_key_value_heads": 8})
    with pytest.raises(TPSizeError, match="intermediate_size=3420 is not divisible by tp_size=8"):
        shard_map(spec, 8)


def test_the_first_pipeline_stage_holds_the_tower():
    """vLLM 0.33 builds a tower on the first stage alone (_mark_tower_model under Model Runner V2)."""
    spec = load_spec("Qwen/Qwen2.5-VL-7B-Instruct")
    d = deploy(spec, Layout(1, 2), "vllm")
    m = shard_map(spec, 1)
    tower = sum(p.count * numel(p.shape) for p in m.params if p.tower) * 2
    text_first = deploy(load_spec({k: v for k, v in presets()["Qwen/Qwen2.5-VL-7B-Instruct"].items()
                                   if k != "vision_config"} | {"model_type": "qwen2"}), Layout(1, 2), "vllm")
    assert d.gpus[0].weight_bytes - text_first.gpus[0].weight_bytes == tower
    assert d.gpus[1].weight_bytes == text_first.gpus[1].weight_bytes


def test_the_cli_takes_the_encoder_mode(capsys):
    assert main(["map", "nvidia/Cosmos-Reason2-8B", "--tp", "32", "--mm-encoder-tp-mode", "data"]) == 0
    out = capsys.readouterr().out
    assert "visual.blocks.*.attn.qkv.weight" in out and "every GPU holds the whole vision tower" in out
    assert main(["map", "nvidia/Cosmos-Reason2-8B", "--tp", "32"]) == 2
    assert "vision_config.num_heads=16" in capsys.readouterr().err


def test_a_broken_vision_config_is_one_line():
    cfg = {**presets()["Qwen/Qwen2.5-VL-7B-Instruct"]}
    cfg["vision_config"] = {**cfg["vision_config"], "num_heads": "sixteen"}
    with pytest.raises(ConfigError) as e:
        load_spec(cfg)
    assert one_line(e.value) and "num_heads" in str(e.value)
    cfg["vision_config"] = {**cfg["vision_config"], "num_heads": 3}
    with pytest.raises(ConfigError, match="not divisible by 3 heads"):
        load_spec(cfg)


def test_gemma3_siglip_tower_and_its_projector():
    """siglip.py: q/k/v stored apart load into one QKVParallelLinear over 16 heads, out_proj row-parallel,
    fc1 / fc2; gemma3_mm.py's projector is a plain parameter, whole on every GPU. Its class has no data mode,
    so a tp above 16 vision heads fails whatever the flag (vLLM falls back to weights)."""
    m = shard_map("google/gemma-3-27b-it", 8)
    q = m.tensor("vision_tower.vision_model.encoder.layers.*.self_attn.q_proj.weight")
    assert q.blocks == 27 and q.shard_id == "q"
    assert [(p.start, p.stop) for p in q.rank_pieces(1)] == [(144, 288)]
    assert m.tensor("multi_modal_projector.mm_input_projection_weight").split_dim is None
    assert m.tensor("vision_tower.vision_model.encoder.layers.*.mlp.fc2.weight").split_dim == 1
    spec = load_spec("google/gemma-3-27b-it").served(mm_encoder="data")
    assert spec.tower.data_parallel is False and any("falls back to weights" in n for n in spec.notes)
    with pytest.raises(TPSizeError) as e:
        shard_map(spec, 32)
    assert "vision_config.num_attention_heads=16" in str(e.value)
    assert "has no --mm-encoder-tp-mode data" in str(e.value)


def test_sglang_rules_leave_the_tower_out_and_say_so():
    m = shard_map("Qwen/Qwen3-VL-30B-A3B-Instruct", 4, "sglang")
    assert not any(t.tower for t in m.tensors)
    assert any("SGLang's split of the vision tower" in w for w in m.warnings)
    # Gemma-3: SGLang builds no tower unless --enable-multimodal, which the map says instead
    m = shard_map("google/gemma-3-27b-it", 4, "sglang")
    assert not any(t.tower for t in m.tensors)
    assert any("builds no vision tower for this model unless --enable-multimodal" in w for w in m.warnings)


def test_mistral3_pixtral_tower_and_projector():
    """pixtral.py: q/k/v stored apart into one QKVParallelLinear over 16 heads of 64, o_proj row-parallel,
    gate/up merged; mistral3.py's patch merger (a plain nn.Linear) whole, linear_1 column- and linear_2
    row-parallel. Mistral3ForConditionalGeneration has no data mode: vLLM falls back to weights."""
    m = shard_map("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 4)
    k = m.tensor("vision_tower.transformer.layers.*.attention.k_proj.weight")
    assert k.blocks == 24 and k.shard_id == "k"
    assert [(p.start, p.stop) for p in k.rank_pieces(2)] == [(512, 768)]
    assert m.tensor("vision_tower.transformer.layers.*.feed_forward.up_proj.weight").split_dim == 0
    assert m.tensor("multi_modal_projector.patch_merger.merging_layer.weight").shape == [1024, 4096]
    assert m.tensor("multi_modal_projector.patch_merger.merging_layer.weight").split_dim is None
    assert m.tensor("multi_modal_projector.linear_2.weight").split_dim == 1
    assert m.tensor("vision_tower.patch_conv.weight").split_dim is None
    spec = load_spec("mistralai/Mistral-Small-3.1-24B-Instruct-2503").served(mm_encoder="data")
    assert spec.tower.data_parallel is False and any("falls back to weights" in n for n in spec.notes)
    with pytest.raises(TPSizeError) as e:
        shard_map(spec, 32)
    assert one_line(e.value) and "vision_config.num_attention_heads=16" in str(e.value)


def test_mistral3_builds_the_tower_up_to_its_feature_layer():
    """mistral3.py builds blocks only up to vision_feature_layer (its loader skips the rest)."""
    cfg = {**presets()["mistralai/Mistral-Small-3.1-24B-Instruct-2503"], "vision_feature_layer": -3}
    assert load_spec(cfg).tower.depth == 22
    assert load_spec({**cfg, "vision_feature_layer": [3, -2]}).tower.depth == 23
    for bad in (24, "last", True):
        with pytest.raises(ConfigError) as e:
            load_spec({**cfg, "vision_feature_layer": bad})
        assert one_line(e.value) and "vision_feature_layer" in str(e.value)


def test_llama4_tower_adapter_and_projector():
    """mllama4.py: biased q/k/v into one QKVParallelLinear over 16 heads of 88, the unfold patch embedding
    column-parallel, the adapter's fc1 column and fc2 row; under data mode everything is whole except the
    projector's linear_1, which vLLM builds without disable_tp."""
    m = shard_map("meta-llama/Llama-4-Scout-17B-16E-Instruct", 8)
    q = m.tensor("vision_model.model.layers.*.self_attn.q_proj.bias")
    assert q.blocks == 34 and [(p.start, p.stop) for p in q.rank_pieces(1)] == [(176, 352)]
    assert m.tensor("vision_model.patch_embedding.linear.weight").shape == [1408, 588]
    assert m.tensor("vision_model.patch_embedding.linear.weight").split_dim == 0
    assert m.tensor("vision_model.positional_embedding_vlm").shape == [577, 1408]
    assert m.tensor("vision_model.vision_adapter.mlp.fc2.weight").split_dim == 1
    spec = load_spec("meta-llama/Llama-4-Scout-17B-16E-Instruct").served(mm_encoder="data")
    d = shard_map(spec, 8)
    assert d.tensor("vision_model.model.layers.*.self_attn.q_proj.weight").split_dim is None
    assert d.tensor("vision_model.vision_adapter.mlp.fc1.weight").split_dim is None
    assert d.tensor("multi_modal_projector.linear_1.weight").split_dim == 0


def test_llama4_vision_heads_limit_tp_unless_data_parallel():
    """16 vision heads: a tp of 32 fails in vLLM's attention unless the encoder runs data-parallel (the text
    decoder of this config allows it: 32 heads, 8 KV heads)."""
    cfg = presets()["meta-llama/Llama-4-Scout-17B-16E-Instruct"]
    cfg = {**cfg, "text_config": {**cfg["text_config"], "num_attention_heads": 64, "head_dim": 80}}
    with pytest.raises(TPSizeError) as e:
        shard_map(cfg, 32)
    assert one_line(e.value) and "vision_config.num_attention_heads=16" in str(e.value)
    assert "--mm-encoder-tp-mode data" in str(e.value)
    assert shard_map(load_spec(cfg).served(mm_encoder="data"), 32).tensor(
        "vision_model.model.layers.*.self_attn.o_proj.weight").split_dim is None


@pytest.mark.parametrize("preset,key,value,words", [
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", "num_attention_heads", "16", "num_attention_heads"),
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", "hidden_size", 1000, "not divisible by 16 heads"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "projector_output_dim", 2048, "projector_input_dim=4096"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "multi_modal_projector_bias", "no", "not true or false"),
])
def test_a_bad_vision_config_is_one_line(preset, key, value, words):
    cfg = presets()[preset]
    with pytest.raises(ConfigError) as e:
        load_spec({**cfg, "vision_config": {**cfg["vision_config"], key: value}})
    assert one_line(e.value) and words in str(e.value) and "vision_config" in str(e.value)


def test_qwen3_vl_moe_splits_each_expert_and_refuses_what_it_cannot():
    """At tp 4 each expert's gate and up rows are cut in four (192 of 768 each); vLLM's MoE block refuses a
    tp above the 128 experts; a quantized checkpoint's fused expert scales are not modelled: one line."""
    m = shard_map("Qwen/Qwen3-VL-30B-A3B-Instruct", 4)
    gate_up = m.tensor("model.layers.*.mlp.experts.gate_up_proj")
    assert gate_up.shape == [1536, 2048] and [(p.start, p.stop) for p in gate_up.rank_pieces(1)] == [
        (192, 384), (960, 1152)]
    assert m.tensor("model.layers.*.mlp.experts.down_proj").split_dim == 1
    assert m.tensor("visual.blocks.*.attn.qkv.weight").blocks == 27
    cfg = {**presets()["Qwen/Qwen3-VL-30B-A3B-Instruct"], "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128]}}
    with pytest.raises(ConfigError) as e:
        load_spec(cfg)
    assert one_line(e.value) and "fused experts (experts.gate_up_proj" in str(e.value)


def test_qwen3_vl_moe_vision_heads_and_data_mode(capsys):
    """The 30B-A3B at tp 32: 32 text heads and 128 experts allow it, the 16 vision heads do not, unless the
    encoder runs data-parallel (qwen3_vl_moe.py's class supports it)."""
    assert main(["map", "Qwen/Qwen3-VL-30B-A3B-Instruct", "--tp", "32"]) == 2
    assert "vision_config.num_heads=16" in capsys.readouterr().err
    assert main(["map", "Qwen/Qwen3-VL-30B-A3B-Instruct", "--tp", "32", "--mm-encoder-tp-mode", "data"]) == 0
    assert "every GPU holds the whole vision tower" in capsys.readouterr().out
    assert main(["map", "mistralai/Mistral-Small-3.1-24B-Instruct-2503", "--tp", "2",
                 "--mm-encoder-tp-mode", "data"]) == 0
    assert "vLLM falls back to weights" in capsys.readouterr().out
