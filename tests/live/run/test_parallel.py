"""Live pipeline and expert parallelism over gloo: stages pass hidden states with send/recv, EP ranks hold
whole experts, and both match one device; bad layouts are one line."""
import json

import pytest
import torch

from tpviz.errors import TpvizError
from tpviz.live import LiveForCausalLM, load_weights, resolve_model, verify
from tpviz.live.model.config import Stage
from tpviz.live.run.torchrun import SharedError, verify_torchrun
from tpviz.errors import LayoutError
from tpviz.cli.verify import main

IDS = torch.randint(0, 999, (2, 7), generator=torch.Generator().manual_seed(3))
# 3 layers (stages of 2 + 1), 5 experts (uneven over 2 ranks), a dense mlp_only layer, tied embeddings
MOE5 = {"model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 48, "num_experts": 5,
        "num_experts_per_tok": 2, "vocab_size": 1000, "num_hidden_layers": 3, "tie_word_embeddings": True,
        "norm_topk_prob": True, "mlp_only_layers": [1]}


@pytest.fixture(scope="module")
def moe5(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe5") / "config.json"
    path.write_text(json.dumps(MOE5))
    return path


def _stage_keys(result, rank: int) -> set[str]:
    return set(result.ranks[rank].param_shapes)


def test_stage_partition_and_what_each_stage_skips():
    spec = resolve_model(json.dumps(MOE5).encode()).cfg.spec
    first, last = Stage.of(spec, 2, 1, pp_size=2, pp_rank=0), Stage.of(spec, 2, 1,
                                                                       pp_size=2, pp_rank=1, ep=True)
    assert (first.layers, first.first, first.last) == ((0, 1), True, False)  # vLLM: the remainder goes first
    assert (last.layers, last.first, last.last, last.experts) == ((2,), False, True, (3, 4))
    assert first.elsewhere("model.layers.2.self_attn.qkv_proj.weight") and first.elsewhere("lm_head.weight")
    assert first.elsewhere("model.norm.weight") and not first.elsewhere("model.embed_tokens.weight")
    # vLLM's qwen3_moe.py builds embed_tokens on every stage: the last one loads its slice too (unused there)
    assert spec.arch.embed_every_stage and not last.elsewhere("model.embed_tokens.weight")
    assert not last.elsewhere("model.norm.weight")
    moe = ("num_experts", "moe_intermediate_size", "num_experts_per_tok", "mlp_only_layers", "norm_topk_prob")
    dense = {k: v for k, v in MOE5.items() if k not in moe} | {"model_type": "qwen3"}  # qwen2.py guards it
    dense = resolve_model(json.dumps(dense).encode()).cfg.spec
    assert Stage.of(dense, 2, 1, pp_size=2, pp_rank=1).elsewhere("model.embed_tokens.weight")
    assert last.elsewhere("model.layers.2.mlp.experts.0.gate_up_proj.weight")
    assert not last.elsewhere("model.layers.2.mlp.experts.4.down_proj.weight")
    assert not last.elsewhere("model.layers.2.mlp.gate.weight")  # the router stays on every EP rank
    robin = Stage.of(spec, 2, 0, ep=True, placement="round_robin")
    assert robin.experts == (0, 2, 4)


def test_a_later_stage_loads_the_tied_head_and_reads_only_its_layers(tiny):
    folder, _ = tiny["qwen3"]  # tied embeddings, 2 layers
    cfg = resolve_model(folder).cfg
    whole = LiveForCausalLM(cfg, 2, 0)
    last = LiveForCausalLM(cfg, 2, 0, Stage.of(cfg.spec, 2, 0, pp_size=2, pp_rank=1))
    full, part = load_weights(whole, folder), load_weights(last, folder)
    assert not hasattr(last.model, "embed_tokens") and "model.layers.0.input_layernorm.weight" not in dict(
        last.named_parameters())
    torch.testing.assert_close(last.lm_head.weight, whole.lm_head.weight)  # the embedding, as the tied head
    assert part.read < 0.75 * full.read


@pytest.mark.parametrize("family", ["qwen3", "llama"])  # tied embeddings; untied and a sharded checkpoint
def test_pp2_tp2_matches_one_device(tiny, family):
    folder, hf_model = tiny[family]
    result, logits = verify(folder, 2, pp=2, device="cpu", input_ids=IDS)
    assert result.passed and result.max_abs_diff < 1e-4 and result.pp_size == 2, result.summary()
    with torch.no_grad():
        assert (logits - hf_model(IDS).logits).abs().max() < 1e-4
    assert [d.name for d in result.layers] == ["embed", "layer 0", "layer 1", "final norm", "logits"]
    assert [(r.stage, r.tp_rank, r.layers) for r in result.ranks] == [(0, 0, [0]), (0, 1, [0]), (1, 0, [1]),
                                                                        (1, 1, [1])]
    first, last = result.ranks[0], result.ranks[2]
    assert first.collectives["send"]["count"] == 1 and "recv" not in first.collectives
    assert last.collectives["recv"] == {"count": 1, "bytes": IDS.numel() * 64 * 4}  # [B, S, hidden] in fp32
    assert any(k.startswith("model.embed_tokens") for k in _stage_keys(result, 0))
    assert not any(k.startswith(("model.embed_tokens", "model.layers.0")) for k in _stage_keys(result, 2))
    assert "lm_head.weight" in _stage_keys(result, 3) and "model.norm.weight" not in _stage_keys(result, 1)
    assert result.headline().startswith("PASS: tp=2 × pp=2 vs tp=1")


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_ep_tp2_matches_one_device_with_whole_experts(tiny_moe, family):
    folder, hf_model = tiny_moe[family]
    result, logits = verify(folder, 2, ep=True, device="cpu", input_ids=IDS)
    assert result.passed and result.ep, result.summary()
    with torch.no_grad():
        assert (logits - hf_model(IDS).logits).abs().max() < 1e-4
    block = "block_sparse_moe" if family == "mixtral" else "mlp"
    inter = 96 if family == "mixtral" else 48
    for rank, mine in ((0, [0, 1]), (1, [2, 3])):
        r = result.ranks[rank]
        assert r.experts == mine
        experts = {k.split(".")[5] for k in r.param_shapes if ".experts." in k}
        assert experts == {str(e) for e in mine}
        assert (r.param_shapes[f"model.layers.0.{block}.experts.{mine[0]}.gate_up_proj.weight"]
                == [2 * inter, 64])
        # every rank routes every token
        assert r.param_shapes[f"model.layers.0.{block}.gate.weight"] == [4, 64]
    assert "+ EP" in result.headline()


def test_ep_uneven_round_robin_pp_and_an_injected_bug(moe5):
    result, _ = verify(str(moe5), 2, pp=2, ep=True, placement="round_robin", device="cpu", input_ids=IDS)
    assert result.passed, result.summary()
    assert [r.experts for r in result.ranks] == [[0, 2, 4], [1, 3]] * 2
    assert [r.layers for r in result.ranks] == [[0, 1], [0, 1], [2], [2]]
    assert ("stage" in result.ranks[0].row(True, True)
            and result.ranks[0].row(True, True)["experts"] == "0, 2, 4")
    bad, _ = verify(str(moe5), 2, ep=True, device="cpu", input_ids=IDS, inject=["skip-allreduce"])
    assert not bad.passed and bad.diverges_at == "layer 0"


def test_bad_layouts_are_one_line(tiny, tiny_config):
    with pytest.raises(LayoutError, match=r"^pp=3 is more pipeline stages than the model's 2 layers$"):
        verify(tiny["qwen3"][0], 1, pp=3, device="cpu")
    with pytest.raises(LayoutError, match="expert parallelism needs a MoE model"):
        verify(tiny_config, 2, ep=True, device="cpu")
    with pytest.raises(TpvizError, match="pp=0 must be a positive integer"):
        verify(tiny_config, 2, pp=0, device="cpu")
    with pytest.raises(TpvizError, match="expert placement 'random'"):
        verify(tiny_config, 2, ep=True, placement="random", device="cpu")


def test_ranks_cap_names_the_layout(moe5, monkeypatch):
    monkeypatch.setenv("TPVIZ_LIVE_MAX_RANKS", "4")
    with pytest.raises(TpvizError, match=r"tp=2 × pp=3 needs 6 rank processes.*tp × pp ≤ 4"):
        verify(str(moe5), 2, pp=3, device="cpu")


def test_torchrun_refuses_pipeline_stages_in_one_line(tiny_config, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SharedError, match="pipeline stages run with the built-in launcher"):
        verify_torchrun(str(tiny_config), 2, device="cpu", pp=2)


def test_cli_pp_ep(moe5, tiny, capsys):
    assert main([str(moe5), "--tp", "2", "--pp", "2", "--ep", "--device", "cpu", "--seq-len", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS: tp=2 × pp=2 + EP vs tp=1") and "stage 1, layers 2, experts 3–4" in out
    assert main([str(tiny["qwen3"][0]), "--tp", "1", "--pp", "3", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pp=3 is more pipeline stages" in err
