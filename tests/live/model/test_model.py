"""The live model at tp=1 against transformers, and the loader reading only each rank's slices
(in-process)."""
import json
from dataclasses import replace

import pytest
import torch

from tpviz.errors import TpvizError, WeightsError
from tpviz.live import LiveError, LiveForCausalLM, load_weights, prepare, resolve_model
from tpviz.live.load.random_weights import checkpoint_shapes, random_tensors
from tests.live.checks import loading_map
from tpviz.live.run.worker import run_model

from tests.live.conftest import FAMILIES


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tp1_matches_transformers_fp32(tiny, family):
    folder, hf_model = tiny[family]
    ids = torch.randint(0, hf_model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = hf_model(ids).logits
    prep = prepare(folder, 1, device="cpu", input_ids=ids)
    assert not prep.source.random_weights
    logits, hidden, report = run_model(prep.job, 0, 1, torch.device("cpu"))
    assert logits.shape == expected.shape
    assert (logits - expected).abs().max() < 1e-4
    assert list(hidden)[:2] == ["embed", "layer 0"] and "final norm" in hidden
    assert report["collectives"] == {}  # tp=1 runs without a process group


def test_transformers5_rope_parameters_are_read(tiny):
    source = resolve_model(tiny["llama"][0])
    assert source.cfg.spec.rope_theta == 5000.0 and source.cfg.mlp_bias and source.cfg.o_bias


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_reads_only_its_slices(tiny, tp):
    source = resolve_model(tiny["qwen2"][0])  # untied, so embed and lm_head are both row-sliced
    total = sum(t.numel() * 4 for t in _all_tensors(source.checkpoint))
    reads = []
    for rank in range(tp):
        model = LiveForCausalLM(source.cfg, tp, rank)  # no process group: loading needs none
        reads.append(load_weights(model, source.checkpoint).read)
    # every rank reads its 1/tp plus the replicated norms and o_proj/down columns (read as their slices too)
    assert all(r < total / tp * 1.15 for r in reads), (reads, total)
    assert sum(reads) < total * 1.1


def _all_tensors(folder):
    from safetensors.torch import load_file
    out = []
    for f in sorted(folder.glob("*.safetensors")):
        out += list(load_file(str(f)).values())
    return out


def test_checkpoint_names_map_exactly(tiny, tiny_extra):
    qkv, llama, phi3 = "model.layers.1.self_attn.qkv_proj.weight", loading_map(tiny["llama"][0]), loading_map(
        tiny_extra["phi3"][0])
    assert llama.target("model.layers.1.self_attn.v_proj.weight") == (qkv, "v")
    assert llama.target("model.layers.0.mlp.up_proj.bias") == ("model.layers.0.mlp.gate_up_proj.bias", 1)
    assert phi3.target(qkv) == (qkv, None)  # fused on disk: the loader splits it
    assert llama.target("model.layers.5.mlp.down_proj.weight") is None  # past its 2 layers
    assert llama.target("model.layers.0.self_attn.rotary_emb.inv_freq") is None


def test_missing_tensor_is_one_clear_line(tiny, tmp_path):
    from safetensors.torch import load_file, save_file
    folder = tiny["qwen3"][0]
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    source = resolve_model(tmp_path)
    with pytest.raises(WeightsError, match="lacks model.layers.1.self_attn.qkv_proj.weight"):
        load_weights(LiveForCausalLM(source.cfg, 2, 0), tmp_path)


def test_shrinking_and_random_weights_are_seeded(tiny_config):
    a = resolve_model(tiny_config, layers=1, seed=3)
    b = resolve_model(tiny_config, layers=1, seed=3)
    assert a.random_weights and a.checkpoint == b.checkpoint  # made once, then reused
    assert a.cfg.spec.num_hidden_layers == 1 and "shrunk to the first 1 of 2 layers" in a.cfg.notes
    more = resolve_model(tiny_config, layers=1000, seed=3).cfg  # more than it has: all run, and it says so
    assert (more.spec.num_hidden_layers == 2
            and "layers=1000 is more than the model's 2: all of them run" in more.notes)
    t1, t2 = random_tensors(a.cfg, 3), random_tensors(a.cfg, 3)
    assert all(torch.equal(t1[k], t2[k]) for k in t1) and set(t1) == set(checkpoint_shapes(a.cfg))
    assert not torch.equal(t1["model.norm.weight"], torch.ones_like(t1["model.norm.weight"]))


def test_invalid_split_fails_before_random_weights_are_made():
    from tpviz.config.cache import cache_root
    before = set((cache_root() / "random").glob("*")) if (cache_root() / "random").exists() else set()
    with pytest.raises(TpvizError, match="tp_size=3"):
        prepare("Qwen/Qwen3-8B", 3, device="cpu", random_weights=True)
    after = set((cache_root() / "random").glob("*")) if (cache_root() / "random").exists() else set()
    assert after == before


def test_preset_gets_random_weights_and_shrinks():
    # asked for: nothing is downloaded
    source = resolve_model("Qwen/Qwen3-0.6B", layers=1, random_weights=True)
    assert source.random_weights and source.cfg.spec.num_hidden_layers == 1
    assert any("first 1 of 28 layers" in n for n in source.cfg.notes)
    assert json.loads((source.checkpoint / "config.json").read_text())["head_dim"] == 128


def test_a_tied_lm_head_is_the_embedding_and_allocates_no_weight_of_its_own(tiny_config, monkeypatch):
    import tpviz.live.model.causal_lm as live_model
    built = []

    class Head(live_model.ParallelLMHead):  # where the head's own weight was made, before any tying
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self.weight.device.type)
    monkeypatch.setattr(live_model, "ParallelLMHead", Head)
    cfg = resolve_model(tiny_config, random_weights=True).cfg
    model = LiveForCausalLM(cfg, 2, 1)
    assert cfg.spec.tie_word_embeddings and built == ["meta"]  # vocab/tp x hidden bytes never allocated
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    untied = replace(cfg, spec=replace(cfg.spec, tie_word_embeddings=False))
    model = LiveForCausalLM(untied, 2, 1)
    assert built == ["meta", "cpu"] and model.lm_head.weight is not model.model.embed_tokens.weight


@pytest.mark.parametrize("model, match", [
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", "qwen3_next MoE"),  # Qwen2-MoE and DeepSeek run now
    ("google/gemma-4-31B-it", "model_type 'gemma4_text'"),
    ("/no/such/folder", "no such file"),
    ("", "give a model"),
])
def test_unsupported_or_missing_models_fail_in_one_line(model, match):
    with pytest.raises(TpvizError, match=match) as e:
        resolve_model(model, layers=1)
    assert "\n" not in str(e.value)


def test_bad_tp_and_ids_fail_before_any_rank_starts(tiny_config):
    with pytest.raises(TpvizError,
                       match=r"not divisible by tp_size=3\. Valid tp sizes for this model: 1, 2, 4\.$"):
        prepare(tiny_config, 3, device="cpu")
    with pytest.raises(LiveError, match="outside the vocabulary"):
        prepare(tiny_config, 2, device="cpu", input_ids=[[1, 2, 1000]])
    with pytest.raises(LiveError, match="unknown inject"):
        prepare(tiny_config, 2, device="cpu", inject=["nope"])


def _edited_checkpoint(tiny, tmp_path, name, edit):
    from safetensors.torch import load_file, save_file
    folder = tiny["qwen3"][0]
    tensors = load_file(str(folder / "model.safetensors"))
    tensors[name] = edit(tensors[name])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    return resolve_model(tmp_path)


@pytest.mark.parametrize("name, edit, match", [
    ("model.layers.0.mlp.down_proj.weight", lambda t: t.index_fill(0, torch.tensor([3]), float("nan")),
     r"model.layers.0.mlp.down_proj.weight holds NaN or Inf values .*the checkpoint itself is broken"),
    ("model.norm.weight", lambda t: torch.full_like(t, float("inf")), r"model.norm.weight holds NaN or Inf"),
    ("model.layers.1.input_layernorm.weight", lambda t: t > 0, r"input_layernorm.weight is stored as BOOL"),
    ("model.layers.0.self_attn.q_proj.weight", lambda t: t.to(torch.int32),
     r"q_proj.weight is stored as I32"),
    ("model.layers.0.self_attn.o_proj.weight", lambda t: t[:, :-2].contiguous(),
     r"model.layers.0.self_attn.o_proj.weight"),
    ("model.layers.1.input_layernorm.weight", lambda t: t[:-1].contiguous(),
     r"checkpoint tensor model.layers.1.input_layernorm.weight does not fit .*shape"),
])
def test_broken_weights_are_named_not_reported_as_a_tp_mismatch(tiny, tmp_path, name, edit, match):
    source = _edited_checkpoint(tiny, tmp_path, name, edit)
    for rank in (0, 1):
        with pytest.raises(WeightsError, match=match) as e:
            load_weights(LiveForCausalLM(source.cfg, 2, rank), tmp_path)
        assert "\n" not in str(e.value)


def test_nan_weights_end_verify_with_the_tensor_named(tiny, tmp_path):
    _edited_checkpoint(tiny, tmp_path, "model.embed_tokens.weight",
                       lambda t: t.index_fill(0, torch.tensor([7]),
                                                                                            float("nan")))
    with pytest.raises(TpvizError, match="model.embed_tokens.weight holds NaN or Inf"):
        from tpviz.live import verify
        verify(tmp_path, 1, device="cpu", seq_len=8)
