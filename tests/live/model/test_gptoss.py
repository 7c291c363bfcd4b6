"""gpt-oss in the live model: transformers parity at tp=1 with every gpt-oss detail shown to matter (attention
sinks, the SwiGLU clamp, attention / router / expert biases, sliding windows, YaRN), TP and EP parity, random
weights, and MXFP4 checkpoints (quantized here as the released ones store them) dequantized while loading."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tpviz.live import prepare, resolve_model, verify
from tpviz.live.model import gptoss
from tpviz.live.errors import LiveError
from tpviz.live.load.random_weights import checkpoint_shapes, hf_config
from tpviz.live.load.source import live_config
from tests.live.checks import loading_map
from tpviz.config.normalize import normalize
from tests.live.checks import random_round_trip, saved_shapes, tp1_logits, tp1_matches

IDS = torch.randint(0, 1001, (2, 12), generator=torch.Generator().manual_seed(7))  # 12 tokens > window 4
# hidden 64, 4 heads of 16, 2 KV heads (replicated at tp=4), 4 layers (sliding, full, sliding, full:
# transformers'
# default layer_types), window 4, 4 experts top-2, intermediate 64 (tp=2: 32 rows a rank, one MXFP4 block),
# YaRN
BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
            num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
            vocab_size=1001, sliding_window=4, rms_norm_eps=1e-6)
FP4 = torch.tensor(gptoss.FP4_VALUES)


def make_gpt_oss(folder, seed: int = 0, **overrides):
    """A tiny GptOssForCausalLM with weights that make every detail bite: experts large enough to reach the
    clamp (|gate|, |up| > 7), biases and sinks around +-0.5."""
    import transformers
    config = transformers.GptOssConfig(**{**BASE, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen)
            scale = 0.5 if name.endswith(("bias", "sinks")) else 1.0 if "experts" in name else 0.1
            p.copy_(1 + 0.1 * z if "norm" in name else z * scale)
    model.save_pretrained(folder)
    return model


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[..., rows, K] -> (blocks [..., rows, K/32, 16] uint8, scales [..., rows, K/32] uint8, dequantized
    values): per 32 values an E8M0 exponent (max |x| within 6 * 2^e), values rounded to the nearest e2m1, low
    nibble first."""
    g = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    e = torch.ceil(torch.log2(g.abs().amax(-1).clamp(min=1e-30) / 6)).clamp(-127, 127)
    idx = (g / torch.exp2(e)[..., None]).unsqueeze(-1).sub(FP4).abs().argmin(-1)  # nearest e2m1 value
    blocks = (idx[..., 0::2] | (idx[..., 1::2] << 4)).to(torch.uint8)
    values = (FP4[idx] * torch.exp2(e)[..., None]).reshape(w.shape)
    return blocks, (e + 127).to(torch.uint8), values


def make_mxfp4(folder, src, model):
    """Rewrite the tiny checkpoint in src as the released gpt-oss store it (experts as *_blocks / *_scales in
    the [E, out, in] orientation, quantization_config mxfp4), and put the dequantized experts into model."""
    import shutil
    shutil.copytree(src, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    params = dict(model.named_parameters())
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales, values = quantize_mxfp4(tensors.pop(name).transpose(1, 2).contiguous())
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        with torch.no_grad():
            params[name].copy_(values.transpose(1, 2))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def tiny_oss(tmp_path_factory):
    """kind -> (checkpoint folder, its logits on IDS): 'bf16' (unquantized, fp32) and 'mxfp4'."""
    root = tmp_path_factory.mktemp("tiny-gpt-oss")
    model = make_gpt_oss(root / "plain", seed=50)
    with torch.no_grad():
        plain = model(IDS).logits
        quant = make_mxfp4(root / "mxfp4", root / "plain", model)(IDS).logits
    return {"plain": (root / "plain", plain), "mxfp4": (root / "mxfp4", quant)}


@pytest.mark.parametrize("kind", ["plain", "mxfp4"])
def test_tp1_matches_transformers_fp32(tiny_oss, kind):
    folder, expected = tiny_oss[kind]
    prep, report = tp1_matches(folder, expected, IDS)
    cfg = prep.source.cfg
    assert [layer.mixer.window for layer in cfg.spec.layers] == [4, 0, 4, 0]
    assert cfg.rope["rope_type"] == "yarn" and cfg.swiglu == {"alpha": 1.702, "limit": 7.0}
    shapes = report["param_shapes"]
    assert shapes["model.layers.0.self_attn.sinks"] == [4]
    assert shapes["model.layers.0.mlp.experts.gate_up_proj"] == [4, 64, 128]
    assert shapes["model.layers.0.mlp.router.bias"] == [4]
    if kind == "plain":
        assert checkpoint_shapes(cfg) == saved_shapes(folder)  # random weights write exactly this layout
    else:
        assert cfg.spec.quantization == "mxfp4"


def _no_window(cfg: dict) -> None:
    for layer in cfg["spec"]["layers"]:
        layer["mixer"]["window"] = 0


def _modules(cls):
    def edit(attr, value):
        def apply(model):
            for m in model.modules():
                if isinstance(m, cls):
                    setattr(m, attr, value) if not callable(value) else value(m)
        return apply
    return edit


def _zero(*names):
    def apply(model):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(names):
                    p.zero_()
    return apply


DETAILS = {  # name: (config patch, model edit)
    "sinks": (None, _modules(gptoss.GptOssAttention)("use_sinks", False)),
    "clamp": (None, _modules(gptoss.GptOssExperts)("clamp", False)),
    "attention-biases": (None, _zero("qkv_proj.bias", "o_proj.bias")),
    "router-bias": (None, _zero("router.bias")),
    "expert-biases": (None, _zero("gate_up_proj_bias", "down_proj_bias")),
    "window": (_no_window, None),
    "yarn": (lambda c: c.update(rope={"rope_type": "default", "rope_theta": c["rope"]["rope_theta"]}), None),
}


@pytest.mark.parametrize("detail", list(DETAILS))
def test_details_matter(tiny_oss, detail):
    """Turning each gpt-oss detail off changes the logits well past the parity tolerance."""
    folder, expected = tiny_oss["plain"]
    patch, edit = DETAILS[detail]
    assert (tp1_logits(folder, IDS, patch, edit) - expected).abs().max() > 1e-3


def test_checkpoint_names_map(tiny_oss):
    """Stacked experts load into one parameter named as their tensor; MXFP4 blocks and scales as its parts."""
    targets = loading_map(tiny_oss["mxfp4"][0])
    assert targets.target("model.layers.1.mlp.experts.gate_up_proj_blocks") == \
        ("model.layers.1.mlp.experts.gate_up_proj", "blocks")
    assert targets.target("model.layers.1.mlp.experts.down_proj_scales") == \
        ("model.layers.1.mlp.experts.down_proj", "scales")
    assert targets.target("model.layers.1.mlp.experts.down_proj_bias") == \
        ("model.layers.1.mlp.experts.down_proj_bias", None)
    assert targets.target("model.layers.1.self_attn.sinks") == ("model.layers.1.self_attn.sinks", None)
    assert loading_map(tiny_oss["plain"][0]).target("model.layers.1.mlp.experts.gate_up_proj") == \
        ("model.layers.1.mlp.experts.gate_up_proj", None)


def test_dequantize_matches_transformers():
    """Our MXFP4 dequantization is transformers' (low nibble first, 2^(scale - 127))."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    gen = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (2, 6, 2, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(120, 134, (2, 6, 2), generator=gen, dtype=torch.uint8)
    ours = gptoss.dequantize_mxfp4(blocks, scales, torch.float32)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, K, rows]
    assert torch.equal(ours, theirs.transpose(1, 2))


def test_expert_rows_follow_vllm():
    """vLLM's cut: unquantized ceil(I / tp); MXFP4 whole 32-value blocks, the last ranks short or empty."""
    assert [gptoss.expert_rows(64, 2, r, False) for r in range(2)] == [(0, 32), (32, 64)]
    assert [gptoss.expert_rows(96, 2, r, True) for r in range(2)] == [(0, 64), (64, 96)]
    assert [gptoss.expert_rows(64, 4, r, True) for r in range(4)] == [(0, 32), (32, 64), (64, 64), (64, 64)]


def test_mxfp4_reads_only_its_slices(tiny_oss):
    """At tp=2 each rank reads about half the expert blocks and scales (and every rank the rest whole)."""
    folder, _ = tiny_oss["mxfp4"]
    from tpviz.live import LiveForCausalLM, load_weights
    prep = prepare(folder, 2, device="cpu", input_ids=IDS)
    cfg = prep.job.cfg
    full = LiveForCausalLM(cfg)
    whole = load_weights(full, folder).read
    half = load_weights(LiveForCausalLM(cfg, 2, 1), folder).read
    assert half < whole
    experts = full.model.layers[0].mlp.experts
    assert experts.gate_up_proj.abs().sum() > 0 and not experts._pending["down_proj"]


def test_misaligned_mxfp4_refused(tiny_oss, tmp_path):
    """MXFP4 experts whose intermediate size is no whole number of 32-value blocks: one line, naming the
    layer."""
    config = json.loads((tiny_oss["mxfp4"][0] / "config.json").read_text())
    config["intermediate_size"] = 48
    with pytest.raises(LiveError,
                       match=r"model\.layers\.0\.mlp\.experts: MXFP4 experts need intermediate_size "
                                        r"divisible by 32") as err:
        resolve_model(json.dumps(config).encode())
    assert "\n" not in str(err.value)


def test_random_config_round_trips(tiny_oss):
    cfg = resolve_model(tiny_oss["plain"][0]).cfg
    written = hf_config(cfg)
    again = live_config(normalize(written, cfg.spec.name))
    for key in ("rope", "swiglu"):
        assert getattr(again, key) == getattr(cfg, key), key
    assert again.spec.layers == cfg.spec.layers and checkpoint_shapes(again) == checkpoint_shapes(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("kind, tp, ep", [("plain", 2, None), ("mxfp4", 2, None), ("mxfp4", 4, None),
                                          ("plain", 2, "linear"), ("mxfp4", 2, "round_robin")])
def test_tp_matches_tp1(tiny_oss, kind, tp, ep):
    """tp=2 (one MXFP4 block a rank), tp=4 (KV heads replicated; MXFP4 ranks 2 and 3 hold no expert rows, as
    vLLM cuts them), and expert parallelism (round-robin: each rank reads its experts' blocks expert by
    expert)."""
    folder, expected = tiny_oss[kind]
    result, logits = verify(folder, tp, device="cpu", input_ids=IDS, ep=ep is not None,
                            placement=ep or "linear", timeout=180)
    assert result.passed, (result.max_abs_diff, result.diverges_at)
    assert (logits - expected).abs().max() < 1e-4


@pytest.mark.slow
def test_random_weights_run_and_load_in_transformers(tiny_oss):
    config = tiny_oss["plain"][0] / "config.json"
    result, _ = verify(config, 2, device="cpu", input_ids=IDS, random_weights=True, timeout=180)
    assert result.random_weights and result.passed, result.max_abs_diff
    _, hf_model = random_round_trip(config, IDS)
    assert type(hf_model).__name__ == "GptOssForCausalLM"


def test_config_without_rope_runs_transformers_yarn(tiny_oss):
    """A config naming no RoPE (as some gpt-oss configs are written) gets GptOssConfig's YaRN default, not
    plain."""
    written = json.loads((tiny_oss["plain"][0] / "config.json").read_text())
    bare = {**{k: v for k, v in written.items() if k not in ("rope_parameters", "rope_scaling")},
            # top level, as openai/gpt-oss-20b writes it
            "rope_theta": written["rope_parameters"]["rope_theta"]}
    cfg = live_config(normalize(bare, "bare"))
    assert cfg.rope == resolve_model(tiny_oss["plain"][0]).cfg.rope and cfg.rope["rope_type"] == "yarn"
    assert any("names no RoPE scaling" in n for n in cfg.notes)


@pytest.mark.parametrize("kind", ["plain", "mxfp4"])
def test_explorer_maps_the_checkpoint(tiny_oss, kind):
    """The explorer's shard map names every tensor of both checkpoints with its shape (the MXFP4 map assumes
    the released checkpoints' bf16 biases; these test biases are fp32, so only the unquantized bytes are
    compared)."""
    import tpviz
    m = tpviz.shard_map(str(tiny_oss[kind][0]), 2, dtype="float32")
    assert m.checkpoint["verified"], m.checkpoint
    if kind == "plain":
        assert m.checkpoint["bytes"]["count"] == 0, m.checkpoint
