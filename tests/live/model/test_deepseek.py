"""DeepSeek-V2/V3 in the live model: MLA (latent projections replicated, heads split), YaRN with mscale,
grouped top-k routing with e_score_correction_bias, shared experts, dense first layers; transformers parity at
tp=1, each feature mattering, TP (and EP) parity, random weights, per-rank reads."""
import pytest
import torch

from tpviz.live import LiveForCausalLM, load_weights, resolve_model, verify
from tpviz.live.check.inject import describe_injections
from tpviz.live.model.mla import MLAttention
from tpviz.live.model.moe import SparseMoeBlock
from tpviz.live.load.random_weights import checkpoint_shapes
from tests.live.checks import random_round_trip, saved_shapes, tp1_logits, tp1_matches

IDS = torch.randint(0, 999, (2, 12), generator=torch.Generator().manual_seed(7))  # longer than YaRN's 8
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}  # both scales != 1
MLA = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96, vocab_size=999,
           rms_norm_eps=1e-6, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
           moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=32,
           rope_parameters=YARN, pad_token_id=None, bos_token_id=None, eos_token_id=None)
# V3: q_lora_rank 32, 8 experts in 2 groups (one kept per token), sigmoid + correction bias, 3 layers (0
# dense); V2: V2-Lite's q_proj (no q_lora_rank), softmax group_limited_greedy, routed_scaling_factor 1.5, 2
# layers
CONFIGS = {
    "deepseek_v3": dict(MLA, q_lora_rank=32, num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2,
                        n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5),
    "deepseek_v2": dict(MLA, q_lora_rank=None, num_hidden_layers=2, n_routed_experts=4, num_experts_per_tok=2,
                        n_group=2, topk_group=1, topk_method="group_limited_greedy",
                        routed_scaling_factor=1.5),
}


def make_deepseek(family: str, folder, seed: int = 0, **overrides):
    """Save a tiny transformers DeepSeek with norms around 1, weights N(0, 0.05), and (V3) a correction bias
    large enough to change which experts are chosen."""
    import transformers
    cls = {"deepseek_v3": transformers.DeepseekV3Config, "deepseek_v2": transformers.DeepseekV2Config}[family]
    model = transformers.AutoModelForCausalLM.from_config(cls(**{**CONFIGS[family], **overrides}),
                                                          attn_implementation="eager").float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if "inv_freq" in name:
                continue
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.3 * noise
                    if "correction" in name else 0.05 * noise)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def tiny_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-deepseek")
    return {family: (root / family, make_deepseek(family, root / family, seed=30 + i))
            for i, family in enumerate(CONFIGS)}






@pytest.mark.parametrize("family", list(CONFIGS))
def test_tp1_matches_transformers_fp32(tiny_ds, family):
    folder, hf_model = tiny_ds[family]
    with torch.no_grad():
        prep, report = tp1_matches(folder, hf_model(IDS).logits, IDS)
    # random weights write exactly this layout
    assert checkpoint_shapes(prep.source.cfg) == saved_shapes(folder)
    shapes = report["param_shapes"]
    assert "model.layers.0.mlp.gate_up_proj.weight" in shapes  # first_k_dense_replace: a dense layer 0
    assert shapes["model.layers.1.mlp.shared_experts.gate_up_proj.weight"] == [64, 64]
    assert ("model.layers.1.mlp.gate.e_score_correction_bias" in shapes) == (family == "deepseek_v3")


def _zero_correction_bias(model):
    for m in model.modules():
        if isinstance(m, SparseMoeBlock):
            m.gate.e_score_correction_bias.zero_()


def _zero_shared_experts(model):
    for m in model.modules():
        if isinstance(m, SparseMoeBlock):
            m.shared_experts.down_proj.weight.zero_()


def _set(key, value):
    def patch(cfg):
        cfg[key] = value
    return patch


def _routing(**values):
    def patch(cfg):
        cfg["routing"].update(values)
    return patch


PLAIN_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "rotary_dim": 8}
# name -> (families, config patch or None, model edit or None): each turned off must change logits
FEATURES = {
    "e_score_correction_bias": (["deepseek_v3"], None, _zero_correction_bias),
    "shared experts": (list(CONFIGS), None, _zero_shared_experts),
    "grouped top-k": (list(CONFIGS), _routing(n_group=1, topk_group=1), None),
    "routed_scaling_factor": (list(CONFIGS), _routing(routed_scaling_factor=1.0), None),
    "norm_topk_prob": (["deepseek_v3"], _set("norm_topk_prob", False), None),
    "yarn": (list(CONFIGS), _set("rope", PLAIN_ROPE), None),
    "mscale softmax scale": (list(CONFIGS), _set("attn_scale", 24 ** -0.5), None),
    "interleaved rope": (list(CONFIGS), _set("rope_interleave", False), None),
}


@pytest.mark.parametrize("family, feature",
                         [(f, name) for name, (fams, _, _) in FEATURES.items() for f in fams])
def test_each_feature_matters(tiny_ds, family, feature):
    folder, _ = tiny_ds[family]
    _, patch, edit = FEATURES[feature]
    assert (tp1_logits(folder, IDS, patch, edit) - tp1_logits(folder, IDS)).abs().max() > 1e-3


def test_v3_rope_interleave_false_follows_transformers(tmp_path):
    hf_model = make_deepseek("deepseek_v3", tmp_path, seed=3, rope_interleave=False, num_hidden_layers=2)
    assert resolve_model(tmp_path).cfg.rope_interleave is False
    with torch.no_grad():
        expected = hf_model(IDS).logits
    assert (tp1_logits(tmp_path, IDS) - expected).abs().max() < 1e-4


def test_config_is_read_and_checked():
    from tpviz.live.errors import LiveError
    from tpviz.live.load.source import live_config
    from tpviz.config.normalize import normalize
    raw = {"model_type": "deepseek_v2", **CONFIGS["deepseek_v2"], "norm_topk_prob": True}
    cfg = live_config(normalize(raw))
    assert cfg.routing == {"scoring": "softmax", "correction_bias": False, "grouped": True, "n_group": 2,
                           "topk_group": 1, "routed_scaling_factor": 1.5}
    assert cfg.norm_topk_prob and any("transformers' DeepseekV2 ignores" in n for n in cfg.notes)
    v3 = {"model_type": "deepseek_v3", **CONFIGS["deepseek_v3"]}
    cfg = live_config(normalize(v3))
    assert cfg.norm_topk_prob and cfg.routing["correction_bias"] and cfg.rope_interleave
    assert cfg.attn_scale == pytest.approx(24 ** -0.5 * (0.08 * __import__("math").log(4) + 1) ** 2)
    for bad, words in (({"scoring_func": "softmax"}, "scoring_func='softmax'"), ({"n_group": 3}, "n_group=3"),
                       ({"attention_bias": True}, "without biases"), ({"topk_group": 3}, "topk_group=3")):
        with pytest.raises(LiveError, match=words):
            live_config(normalize({**v3, **bad}))
    with pytest.raises(LiveError, match="MLA only"):
        live_config(normalize({**v3, "kv_lora_rank": 0}))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_ranks_read_their_head_slices_and_the_whole_latents(tiny_ds, family):
    folder, _ = tiny_ds[family]
    cfg, total = resolve_model(folder).cfg, (folder / "model.safetensors").stat().st_size
    q = "q_b_proj" if family == "deepseek_v3" else "q_proj"
    for rank in range(2):
        model = LiveForCausalLM(cfg, 2, rank)
        read = load_weights(model, folder).read
        # the latent projections and routers are read whole, the rest split
        assert total / 2 < read < 0.6 * total
        p = {n: list(t.shape) for n, t in model.named_parameters()}
        a = "model.layers.1.self_attn."
        assert p[a + "kv_a_layernorm.weight"] == [32]
        if family != "deepseek_v3":
            assert p[a + "kv_a_proj_with_mqa.weight"] == [40, 64]
        assert p[a + f"{q}.weight"][0] == 2 * 24 and p[a + "kv_b_proj.weight"] == [2 * 32, 32]
        assert p[a + "o_proj.weight"] == [64, 2 * 16]
        assert p["model.layers.1.mlp.shared_experts.down_proj.weight"] == [64, 16]
        if family == "deepseek_v3":
            # vLLM's fused latent table: q_a_proj's 32 rows, then kv_a_proj_with_mqa's 40
            assert p[a + "fused_qkv_a_proj.weight"] == [32 + 40, 64] and p[a + "q_a_layernorm.weight"] == [32]
            bias = dict(model.named_parameters())["model.layers.1.mlp.gate.e_score_correction_bias"]
            assert bias.dtype == torch.float32 and model.to(torch.bfloat16) and bias.dtype == torch.float32


def test_injections_describe_mla(tiny_ds):
    cfg = resolve_model(tiny_ds["deepseek_v3"][0]).cfg
    bias, skip, kv, qk = describe_injections(["bias-all-ranks", "skip-allreduce",
                                              "wrong-kv-head", "local-qk-norm"],
                                             cfg, 2)
    assert not bias.has_effect and "the shared experts are bias-free" in bias.reason
    assert (skip.has_effect
            and "o_proj, down_proj and MoE-block (routed + shared expert) outputs" in skip.reason)
    assert not kv.has_effect and "MLA has no KV heads" in kv.reason
    assert not qk.has_effect and "q_a_layernorm and kv_a_layernorm" in qk.reason


def test_deepseek_v3_preset_builds_at_tp8_without_weights():
    from tpviz.live.load.source import check_split, live_config
    from tpviz.config.sources import resolve_config
    from tpviz.config.normalize import normalize
    raw, name = resolve_config("deepseek-ai/DeepSeek-V3")
    cfg = live_config(normalize(raw, name), layers=4)  # three dense layers, then MoE
    check_split(cfg, 8)
    check_split(cfg, 8, ep=True)
    with torch.device("meta"):
        model = LiveForCausalLM(cfg, 8, 7)
    assert isinstance(model.model.layers[3].mlp, SparseMoeBlock)
    assert (isinstance(model.model.layers[0].self_attn, MLAttention)
            and model.model.layers[0].self_attn.num_heads == 16)


@pytest.mark.slow
@pytest.mark.parametrize("family, tp, ep", [("deepseek_v3", 2, False), ("deepseek_v3", 4, False),
                                            ("deepseek_v3", 2, True), ("deepseek_v2", 2, False)])
def test_tp_matches_tp1(tiny_ds, family, tp, ep):
    result, _ = verify(tiny_ds[family][0], tp, device="cpu", input_ids=IDS, ep=ep, timeout=180)
    assert result.passed, result.summary()
    assert result.max_abs_diff < 1e-4 and result.argmax_agreement == 1.0
    n = CONFIGS[family]["num_hidden_layers"]
    for r in result.ranks:  # embedding, then o_proj + (MoE block or dense down_proj) per layer
        assert r.collectives["all_reduce"]["count"] == 1 + 2 * n
        assert r.bytes_read < r.checkpoint_bytes
        if ep:  # 8 experts whole, 4 on each rank; the shared experts stay TP-split
            assert r.experts == [4 * r.rank + e for e in range(4)]
            assert r.param_shapes["model.layers.1.mlp.experts.%d.down_proj.weight" % r.experts[0]] == [64, 32]
            assert r.param_shapes["model.layers.1.mlp.shared_experts.down_proj.weight"] == [64, 16]


@pytest.mark.slow
def test_random_weights_at_tp2(tiny_ds):
    folder = tiny_ds["deepseek_v3"][0]
    source, _ = random_round_trip(folder / "config.json", IDS, seed=1)
    assert saved_shapes(source.checkpoint) == saved_shapes(folder)
    result, _ = verify(folder / "config.json", 2, device="cpu", random_weights=True,
                       input_ids=IDS, timeout=180)
    assert result.passed, result.summary()
