"""Gemma-2 and Gemma-3 (text) in the live model: transformers parity at tp=1 with every Gemma detail shown to
matter (soft-caps, (1 + w) norms, sqrt(hidden) embedding scale, query_pre_attn_scalar, GELU-tanh, the four
norms, sliding layers, Gemma-3's q/k norms and two RoPEs), TP and PP parity, random weights, a multimodal
checkpoint's text decoder, and one-line refusals."""
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from tpviz.layers import RMSNorm
from tpviz.live import prepare, resolve_model, verify
from tpviz.live.model import gemma
from tpviz.live.errors import LiveError
from tpviz.live.model.decoder import MLP
from tpviz.live.load.random_weights import checkpoint_shapes, hf_config
from tpviz.live.load.source import live_config
from tests.live.checks import loading_map
from tpviz.live.run.worker import run_model
from tpviz.config.sources import resolve_config
from tpviz.config.normalize import normalize
from tests.live.checks import random_round_trip, saved_shapes, tp1_logits, tp1_matches

IDS = torch.randint(0, 1001, (2, 12), generator=torch.Generator().manual_seed(7))  # 12 tokens > window 4
# hidden 64, 4 heads of 16, 2 KV heads (replicated at tp=4), 4 layers, a vocabulary no tp divides, a window of
# 4, query_pre_attn_scalar 24 (not head_dim), soft-caps small enough to bite
BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
            num_hidden_layers=4, vocab_size=1001, rms_norm_eps=1e-6, sliding_window=4,
            query_pre_attn_scalar=24, attn_logit_softcapping=5.0, final_logit_softcapping=3.0)
# Gemma-2: its default every-other-layer windows (sliding, full, sliding, full). Gemma-3: its own layer_types,
# a
# scaled RoPE on the full layer and the local base on the sliding ones; attn_logit_softcapping is set but
# ignored (transformers and vLLM do not apply it to Gemma-3), which the parity below confirms
GEMMA3 = dict(layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
WINDOWS = {"gemma2": [4, 0, 4, 0], "gemma3": [4, 4, 0, 4]}


def _noisy(model, seed: int):
    """Norm offsets N(0, 0.1) (Gemma scales by 1 + w), matrices N(0, 0.2): logits and scores big enough to
    cap."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(0.1 * noise if "norm" in name else 0.2 * noise)
    return model.float().eval()


def make_gemma(family: str, folder, seed: int = 0, **overrides):
    import transformers
    if family == "gemma2":
        config = transformers.Gemma2Config(**{**BASE, **overrides})
    else:
        config = transformers.Gemma3TextConfig(**{**BASE, **GEMMA3, **overrides})
    model = _noisy(transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"), seed)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """family -> (checkpoint folder, transformers model, its logits on IDS)."""
    root, out = tmp_path_factory.mktemp("tiny-gemma"), {}
    for i, family in enumerate(WINDOWS):
        model = make_gemma(family, root / family, seed=30 + i)
        with torch.no_grad():
            out[family] = (root / family, model, model(IDS).logits)
    return out






@pytest.mark.parametrize("family", list(WINDOWS))
def test_tp1_matches_transformers_fp32(tiny_gemma, family):
    folder, _, expected = tiny_gemma[family]
    prep, report = tp1_matches(folder, expected, IDS)
    assert expected.abs().max() > 2.5  # the final cap (3) is reached for: it bites
    cfg = prep.source.cfg
    assert checkpoint_shapes(cfg) == saved_shapes(folder)  # random weights write exactly this layout
    assert [layer.mixer.window if layer.mixer.kind == "sliding_attention" else 0
            for layer in cfg.spec.layers] \
        == WINDOWS[family]
    assert cfg.attn_scale == pytest.approx(24 ** -0.5) and cfg.embed_scale == 8.0 and cfg.final_softcap == 3.0
    shapes = report["param_shapes"]
    for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"):
        assert shapes[f"model.layers.0.{norm}.weight"] == [64]
    assert "lm_head.weight" not in shapes  # tied to the embedding
    if family == "gemma2":
        assert cfg.attn_softcap == 5.0 and cfg.local_rope is None
        assert "model.layers.0.self_attn.q_norm.weight" not in shapes
    else:  # per-head q/k norms; the sliding layers' own RoPE; the attention cap ignored, and said so
        assert (shapes["model.layers.0.self_attn.q_norm.weight"]
                == shapes["model.layers.0.self_attn.k_norm.weight"] \
            == [16])
        assert (cfg.attn_softcap is None and any("attn_logit_softcapping=5 is not applied" in n
                                                 for n in cfg.notes))
        assert (cfg.rope["rope_type"], cfg.rope["factor"], cfg.rope["rope_theta"]) == ("linear", 2.0, 1e6)
        assert (cfg.local_rope["rope_type"], cfg.local_rope["rope_theta"]) == ("default", 1e4)


def _no_window(cfg: dict) -> None:
    for layer in cfg["spec"]["layers"]:
        layer["mixer"]["window"] = 0


CONFIG_PATCHES = {
    "attn-softcap": ("gemma2", lambda c: c.update(attn_softcap=None)),
    "final-softcap": ("gemma3", lambda c: c.update(final_softcap=None)),
    "embed-scale": ("gemma2", lambda c: c.update(embed_scale=None)),
    "query-pre-attn-scalar": ("gemma3", lambda c: c.update(attn_scale=None)),
    "gemma2-window": ("gemma2", _no_window),
    "gemma3-window": ("gemma3", _no_window),
    "gemma3-sliding-rope": ("gemma3", lambda c: c.update(local_rope=None)),  # 1e4 unscaled, not 1e6 linear x2
}


@pytest.mark.parametrize("detail", list(CONFIG_PATCHES))
def test_config_details_matter(tiny_gemma, detail):
    """Turning each configured detail off changes the logits well past the parity tolerance."""
    family, patch = CONFIG_PATCHES[detail]
    folder, _, expected = tiny_gemma[family]
    assert (tp1_logits(folder, IDS, patch) - expected).abs().max() > 1e-3


def _plain_norm(self, x):
    return RMSNorm.forward(self, x)


def _no_qk_norm(self, x):  # Gemma-3's per-head norms (width head_dim) skipped, the hidden-size ones kept
    return x if self.weight.numel() == 16 else _GEMMA_NORM(self, x)


def _pre_norm_only(self, positions, h):  # Llama's block shape: no post-attention / post-feedforward norms
    h = h + self.self_attn(positions, self.input_layernorm(h))
    return h + self.mlp(self.pre_feedforward_layernorm(h))


def _exact_gelu(self, x):
    gate, up = self.gate_up_proj(x).chunk(2, -1)
    return self.down_proj(F.gelu(gate) * up)


_GEMMA_NORM = gemma.GemmaRMSNorm.forward
CODE_PATCHES = {  # name: (family, class, method, replacement, least change)
    "one-plus-w-norm": ("gemma2", gemma.GemmaRMSNorm, "forward", _plain_norm, 1e-3),
    "qk-norm": ("gemma3", gemma.GemmaRMSNorm, "forward", _no_qk_norm, 1e-3),
    "post-norms": ("gemma2", gemma.GemmaDecoderLayer, "forward", _pre_norm_only, 1e-3),
    "silu-not-gelu": ("gemma3", gemma.GemmaMLP, "forward", MLP.forward, 1e-3),
    # exact GELU is close to its tanh form, yet well past the 1e-4 parity tolerance
    "exact-gelu": ("gemma2", gemma.GemmaMLP, "forward", _exact_gelu, 1e-3 / 2),
}


@pytest.mark.parametrize("detail", list(CODE_PATCHES))
def test_computed_details_matter(tiny_gemma, monkeypatch, detail):
    family, cls, method, replacement, least = CODE_PATCHES[detail]
    folder, _, expected = tiny_gemma[family]
    monkeypatch.setattr(cls, method, replacement)
    assert (tp1_logits(folder, IDS) - expected).abs().max() > least


@pytest.mark.slow
@pytest.mark.parametrize("family, tp, pp", [("gemma2", 4, 1), ("gemma3", 2, 2)])
def test_tp_and_pp_match_tp1(tiny_gemma, family, tp, pp):
    """Gemma-2 at tp=4 replicates its 2 KV heads; Gemma-3 at tp=2 x pp=2 embeds and scales on the first stage
    and soft-caps the gathered logits on the last (which holds the tied embedding as its head)."""
    folder, _, expected = tiny_gemma[family]
    result, logits = verify(folder, tp, device="cpu", input_ids=IDS, pp=pp, timeout=120)
    assert result.passed, (result.max_abs_diff, result.diverges_at)
    assert (logits - expected).abs().max() < 1e-4
    assert "all_gather" not in result.ranks[0].collectives  # soft-caps and per-head norms need no collective


@pytest.mark.slow
def test_random_weights_run_and_load_in_transformers(tiny_gemma):
    """Random weights for each config: TP matches tp=1, and transformers reads the folder the same way."""
    for family in WINDOWS:
        config = tiny_gemma[family][0] / "config.json"
        result, _ = verify(config, 2, device="cpu", input_ids=IDS, random_weights=True, timeout=120)
        assert result.random_weights and result.passed, result.max_abs_diff
        source, hf_model = random_round_trip(config, IDS)
        assert type(hf_model).__name__ == {"gemma2": "Gemma2ForCausalLM",
                                           "gemma3": "Gemma3ForCausalLM"}[family]
        # norm offsets around 0, as Gemma stores them
        with safe_open(str(source.checkpoint / "model.safetensors"), "pt") as f:
            assert f.get_tensor("model.norm.weight").float().abs().mean() < 0.2


def test_random_config_round_trips(tiny_gemma):
    """The random folder's config.json reads back into the same live config."""
    for family in WINDOWS:
        cfg = resolve_model(tiny_gemma[family][0]).cfg
        written = hf_config(cfg)
        again = live_config(normalize(written, cfg.spec.name))
        for key in ("rope", "local_rope", "attn_scale", "attn_softcap", "final_softcap", "embed_scale"):
            assert getattr(again, key) == getattr(cfg, key), key
        assert again.spec.layers == cfg.spec.layers and checkpoint_shapes(again) == checkpoint_shapes(cfg)


def test_multimodal_checkpoint_runs_its_text_decoder(tmp_path):
    """A Gemma3ForConditionalGeneration checkpoint: the text weights (language_model.*) load, the vision
    tower's and projector's are never read, and the text-only logits match transformers' once soft-capped
    (vLLM caps the wrapper's logits with the text config's final_logit_softcapping; transformers' wrapper does
    not)."""
    import transformers
    text = {**BASE, **GEMMA3}
    config = transformers.Gemma3Config(
        text_config=text, mm_tokens_per_image=4, boi_token_index=997, eoi_token_index=998,
        image_token_index=999,
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14))
    model = _noisy(transformers.Gemma3ForConditionalGeneration(config), 40)
    model.save_pretrained(tmp_path)
    names = saved_shapes(tmp_path)
    assert any(n.startswith(("vision_tower.", "model.vision_tower.")) for n in names)
    with torch.no_grad():
        expected = 3.0 * torch.tanh(model(IDS).logits / 3.0)
    prep = prepare(tmp_path, 1, device="cpu", input_ids=IDS)
    logits, _, report = run_model(prep.job, 0, 1, torch.device("cpu"))
    assert (logits - expected).abs().max() < 1e-4
    notes = prep.source.cfg.notes
    assert any("vision tower and multi-modal projector weights" in n for n in notes)
    assert any("final_logit_softcapping=3 is applied, as vLLM does" in n for n in notes)
    vision = sum(n.numel() * 4 for name, n in model.named_parameters() if "language_model" not in name)
    assert report["bytes_read"] <= report["checkpoint_bytes"] - vision
    # both layouts transformers has written: before 4.52 (language_model.model.*) and after
    # (model.language_model.*)
    for name in ("language_model.model.layers.1.self_attn.q_proj.weight",
                 "model.language_model.layers.1.self_attn.q_proj.weight"):
        assert loading_map(tmp_path).target(name) == ("model.layers.1.self_attn.qkv_proj.weight", "q")
    assert loading_map(tmp_path).target("language_model.lm_head.weight") == ("lm_head.weight", None)
    assert loading_map(tmp_path).target("model.vision_tower.vision_model.post_layernorm.weight") is None


def test_legacy_preset_configs():
    """The presets' config.json as Google wrote them: Gemma-2's default caps and alternating windows;
    Gemma-3's sliding_window_pattern, rope_theta with rope_scaling for full layers and rope_local_base_freq
    for sliding ones."""
    raw, name = resolve_config("google/gemma-2-9b-it")
    cfg = live_config(normalize(raw, name), layers=4)
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.embed_scale) == (50.0, 30.0, 3584 ** 0.5)
    assert cfg.attn_scale == 224 ** -0.5 and cfg.local_rope is None and cfg.rope["rope_theta"] == 10000.0
    assert [layer.mixer.kind for layer in cfg.spec.layers] == ["sliding_attention", "attention"] * 2
    raw, name = resolve_config("google/gemma-3-27b-it")
    cfg = live_config(normalize(raw, name), layers=6)
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.attn_scale) == (None, None, 168 ** -0.5)
    assert (cfg.rope["rope_type"], cfg.rope["factor"], cfg.rope["rope_theta"]) == ("linear", 8.0, 1e6)
    assert (cfg.local_rope["rope_type"], cfg.local_rope["rope_theta"]) == ("default", 1e4)
    assert [layer.mixer.window for layer in cfg.spec.layers] == [1024] * 5 + [0]
    assert any("text decoder alone" in n for n in cfg.notes)


@pytest.mark.parametrize("change, message", [
    ({"hidden_activation": "gelu"}, "hidden_activation='gelu': Gemma runs gelu_pytorch_tanh"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=true"),
    ({"final_logit_softcapping": -1}, "final_logit_softcapping=-1 must be a positive number"),
    ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar=0 must be a positive number"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "must be given per layer type"),
])
def test_refusals_are_one_line(change, message):
    raw = {"model_type": "gemma3_text", **BASE, **change}
    with pytest.raises(LiveError, match=message) as err:
        resolve_model(json.dumps(raw).encode())
    assert "\n" not in str(err.value)


def test_hidden_act_alone_does_not_decide():
    """transformers' Gemma reads hidden_activation; a stray hidden_act (Gemma-1 configs say gelu) is not
    refused."""
    raw = {"model_type": "gemma2", **BASE, "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"}
    assert resolve_model(json.dumps(raw).encode()).cfg.attn_softcap == 5.0


@pytest.mark.parametrize("family", list(WINDOWS))
def test_explorer_maps_the_checkpoint(tiny_gemma, family):
    """The explorer's shard map names every tensor of the checkpoint with its shape."""
    import tpviz
    m = tpviz.shard_map(str(tiny_gemma[family][0]), 2, dtype="float32")
    assert m.checkpoint["verified"] and m.checkpoint["bytes"]["count"] == 0, m.checkpoint
