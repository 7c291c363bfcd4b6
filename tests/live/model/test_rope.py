"""RoPE as the configs say (issue 10): every rope type the live model runs, against transformers at tp=1 in
fp32, partial_rotary_factor against Phi3 (transformers' Llama family ignores it), tp=2 against tp=1, and
one-line errors for what it does not run."""
import json

import pytest
import torch

from tpviz.live import LiveError, prepare, resolve_model, verify
from tpviz.live.model.rope import frequencies, rope_parameters
from tpviz.live.run.worker import run_model

from tests.live.conftest import make_tiny

VOCAB, HEAD_DIM, THETA = 1001, 16, 5000.0  # the tiny llama of conftest: hidden 64, 4 heads
SHORT_FACTOR = [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0]
LONG_FACTOR = [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0]
# rope type -> (rope_parameters, max_position_embeddings); sequences of 40 outgrow every original context
# (16-32)
CASES = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, 64),
    "dynamic": ({"rope_type": "dynamic", "factor": 4.0}, 16),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}, 512),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, 64),
    "yarn-mscale": ({"rope_type": "yarn", "factor": 8.0,
                     "original_max_position_embeddings": 32, "beta_fast": 8.0,
                     "beta_slow": 0.5, "truncate": False, "mscale": 0.707, "mscale_all_dim": 1.0}, 256),
    "yarn-attention-factor": ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16,
                               "attention_factor": 1.3}, 32),
    "longrope": ({"rope_type": "longrope", "short_factor": SHORT_FACTOR, "long_factor": LONG_FACTOR,
                  "original_max_position_embeddings": 16}, 64),  # factor from 64 / 16
}


def _ids(n: int, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


def _live(folder, ids, rope: dict | None = None) -> torch.Tensor:
    """tp=1 logits of the live model; `rope` replaces the parsed rope parameters (e.g. {} for plain RoPE)."""
    prep = prepare(folder, 1, device="cpu", input_ids=ids)
    if rope is not None:
        prep.job.cfg.rope = rope
    return run_model(prep.job, 0, 1, torch.device("cpu"))[0]


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """rope case -> (checkpoint folder, transformers model), tiny llamas that differ only in their RoPE."""
    root = tmp_path_factory.mktemp("rope")
    return {name: (root / name, make_tiny("llama", root / name, seed=3, rope_parameters=dict(rope),
                                          max_position_embeddings=mpe))
            for name, (rope, mpe) in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_scaled_rope_matches_transformers_fp32(scaled, name):
    folder, hf_model = scaled[name]
    # short: the unscaled / short-factor side
    lengths = (12, 40) if name in ("dynamic", "longrope") else (40,)
    for n in lengths:
        ids = _ids(n)
        with torch.no_grad():
            expected = hf_model(ids).logits
        logits = _live(folder, ids)
        assert (logits - expected).abs().max() < 1e-4, (name, n)
    plain = _live(folder, ids, rope={})  # same weights, plain RoPE: the scaling must matter at this length
    assert (logits - plain).abs().max() > 1e-3, name


def test_frequencies_match_transformers_rope_functions():
    """inv_freq and the attention factor of each type, partial_rotary_factor included, as transformers
    computes."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    for name, (rope, mpe) in CASES.items():
        for partial in (1.0, 0.5):
            rp = {**rope, "partial_rotary_factor": partial}
            if name == "longrope" and partial < 1:
                rp.update(short_factor=SHORT_FACTOR[:4], long_factor=LONG_FACTOR[:4])
            raw = dict(hidden_size=64, num_attention_heads=4, head_dim=HEAD_DIM, rope_theta=THETA,
                       max_position_embeddings=mpe, rope_parameters=rp)
            p = rope_parameters(raw, HEAD_DIM, THETA)
            assert p["rotary_dim"] == int(HEAD_DIM * partial)
            config = transformers.LlamaConfig(**{**raw, "rope_parameters": dict(rp)})
            for seq_len in (None, 12, 40):
                want, want_scale = ROPE_INIT_FUNCTIONS[rp["rope_type"]](config, "cpu", seq_len=seq_len)
                got, scale = frequencies(p, HEAD_DIM, seq_len)
                assert got.dtype == torch.float32 and torch.allclose(got, want, rtol=1e-6,
                                                                     atol=0), (name, seq_len)
                assert scale == pytest.approx(want_scale, rel=1e-12), (name, seq_len)


def _phi3_as_llama(folder, rope: dict):
    """A tiny Phi3 (which honours partial_rotary_factor) saved as the equivalent Llama checkpoint: q/k/v and
    gate/up unfused, rope_parameters as given. Returns the Phi3 model, the reference."""
    import transformers
    from safetensors.torch import save_file
    config = transformers.Phi3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=96, num_hidden_layers=2,
                                     vocab_size=VOCAB, rms_norm_eps=1e-6,
                                     pad_token_id=0, max_position_embeddings=64,
                                     original_max_position_embeddings=16,
                                     rope_parameters=dict(rope), tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    gen, tensors = torch.Generator().manual_seed(5), {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else noise * 0.05)
            if name.endswith("qkv_proj.weight"):
                for part, t in zip("qkv", p.split([64, 32, 32])):
                    tensors[name.replace("qkv_proj", f"{part}_proj")] = t.clone()
            elif name.endswith("gate_up_proj.weight"):
                for part, t in zip(("gate", "up"), p.chunk(2)):
                    tensors[name.replace("gate_up_proj", f"{part}_proj")] = t.clone()
            else:
                tensors[name] = p.detach().clone()
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": HEAD_DIM, "intermediate_size": 96, "num_hidden_layers": 2,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
        "tie_word_embeddings": False, "rope_parameters": {**rope, "rope_theta": 10000.0}}))
    return model


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "partial_rotary_factor": 0.5},
    {"rope_type": "longrope", "partial_rotary_factor": 0.5, "short_factor": SHORT_FACTOR[:4],
     "long_factor": LONG_FACTOR[:4], "original_max_position_embeddings": 16},
], ids=["default", "longrope"])
def test_partial_rotary_factor_matches_phi3(tmp_path, rope):
    hf_model = _phi3_as_llama(tmp_path / "ckpt", rope)
    ids = _ids(40)
    with torch.no_grad():
        expected = hf_model(ids).logits
    prep = prepare(tmp_path / "ckpt", 1, device="cpu", input_ids=ids)
    assert prep.job.cfg.rope["rotary_dim"] == 8
    assert any("first 8 of 16 dims" in n for n in prep.source.cfg.notes)
    logits = run_model(prep.job, 0, 1, torch.device("cpu"))[0]
    assert (logits - expected).abs().max() < 1e-4
    # rotating every dim, as transformers' Llama does, is a different model
    if rope["rope_type"] == "default":
        full = _live(tmp_path / "ckpt", ids, rope={**prep.job.cfg.rope, "rotary_dim": HEAD_DIM})
        assert (logits - full).abs().max() > 1e-3


def test_scaled_rope_tp2_matches_tp1(scaled):
    folder, hf_model = scaled["yarn"]
    ids = _ids(40)
    result, logits = verify(folder, 2, device="cpu", input_ids=ids)
    assert result.passed and result.max_abs_diff < 1e-4, result.summary()
    with torch.no_grad():
        assert (logits - hf_model(ids).logits).abs().max() < 1e-4


BASE = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
        "vocab_size": 1000, "num_hidden_layers": 2, "max_position_embeddings": 64}


@pytest.mark.parametrize("rope, message", [
    ({"type": "mrope", "mrope_section": [2, 3, 3]},
     "rope type 'mrope' is not supported by the live check; it runs "
                                                    "default, linear, dynamic, llama3, yarn, longrope"),
    ({"rope_type": "su", "short_factor": [1.0] * 8}, "rope type 'su' is not supported"),
    ({"rope_type": "linear", "factor": "2"}, "rope 'linear': factor='2' must be a positive number"),
    ({"rope_type": "dynamic"}, "rope 'dynamic': factor=None must be a positive number"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
     "high_freq_factor=1.0 must exceed low_freq_factor=4.0"),
    ({"rope_type": "yarn", "factor": float("nan"), "original_max_position_embeddings": 16}, "factor=nan"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 8},
     "short_factor must be a list of 8 positive numbers"),
    ({"rope_type": "default", "partial_rotary_factor": 0.1875},
     "partial_rotary_factor=0.1875 gives 3 rotated dims"),
    ({"full_attention": {"rope_type": "default"},
      "sliding_attention": {"rope_type": "linear", "factor": 2.0}},
     "per-layer rope parameters (full_attention, sliding_attention)"),
    ("yarn", "rope_scaling='yarn' must be an object"),
])
def test_unsupported_rope_is_one_line(rope, message):
    with pytest.raises(LiveError) as e:
        resolve_model({**BASE, "rope_scaling": rope})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_rope_config_places():
    """rope_scaling (old) or rope_parameters (transformers 5, with rope_theta); a top-level
    original_max_position_embeddings wins, as in transformers; no rope is plain RoPE with the spec's theta."""
    cfg = resolve_model({**BASE, "rope_theta": 500000.0}).cfg
    assert cfg.rope == {"rope_type": "default", "rope_theta": 500000.0, "rotary_dim": 16}
    assert not any("rope" in n for n in cfg.notes)
    cfg = resolve_model({**BASE, "original_max_position_embeddings": 8, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 1e6}}).cfg
    assert cfg.rope["original_max_position_embeddings"] == 8 and cfg.rope["rope_theta"] == 1e6
    assert resolve_model({**BASE, "rope_scaling": {"type": "linear", "factor": 2}}).cfg.rope["factor"] == 2.0
