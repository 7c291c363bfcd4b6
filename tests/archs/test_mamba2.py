"""Pure Mamba2 (vLLM 0.33 models/mamba2.py, Mamba2ForCausalLM): every layer Nemotron-H's 'M', the same
MambaMixer2 under backbone.layers.*.mixer. Names and shapes against tiny checkpoints transformers writes; the
counts, every rank's rows and the state bytes by hand."""
import pytest
import torch
import transformers

from tests.helpers.checkpoint import written_shapes
from tests.helpers.errors import one_line
from tpviz import shard_map
from tpviz.config.normalize import normalize
from tpviz.config.sources import presets
from tpviz.errors import ConfigError, TPSizeError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.render.summary import cache_sentences
from tpviz.trace.checkpoint import expand
from tpviz.trace.shardmap import numel
from tpviz.trace.validity import split_problem

TINY = dict(vocab_size=96, hidden_size=64, num_heads=8, head_dim=16, n_groups=2, state_size=8, conv_kernel=4,
            num_hidden_layers=2, expand=2)
# Mamba-Codestral-7B's dimensions (its card: 7.3B, Mamba2, 256k context): 64 layers of 4096, 128 heads of 64,
# 8 groups of state 128, a 32768 vocab, untied
CODESTRAL = {"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 4096,
             "num_heads": 128, "head_dim": 64, "n_groups": 8, "state_size": 128, "expand": 2,
             "conv_kernel": 4, "num_hidden_layers": 64, "vocab_size": 32768, "tie_word_embeddings": False,
             "use_bias": False, "use_conv_bias": True, "rms_norm": True, "layer_norm_epsilon": 1e-05,
             "torch_dtype": "bfloat16"}


def tiny_config(**changes) -> dict:
    return {**transformers.Mamba2Config(**TINY, **changes).to_dict(), "architectures": ["Mamba2ForCausalLM"]}


@pytest.mark.parametrize("changes", [{}, {"tie_word_embeddings": True}])
def test_names_and_shapes_are_what_transformers_saves(tmp_path, changes):
    torch.manual_seed(0)
    model = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**TINY, **changes))
    written = written_shapes(model, tmp_path)
    m = shard_map(tiny_config(**changes), 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    planned = {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))}
    tied = "lm_head.weight" if changes else None  # a tied checkpoint may still store lm_head (loaded once)
    assert planned == {n: s for n, s in written.items() if n != tied}
    assert {layer.label for layer in m.model.layers} == {"Mamba2 + no FFN"}


def test_codestral_counts_and_rows_by_hand():
    """Per layer: in_proj [z | x | B | C | dt] = (2 x 8192 + 2 x 8 x 128 + 128) x 4096, conv1d (and its bias)
    over x | B | C, A_log / D / dt_bias per head, the gated norm over 8192, out_proj 4096 x 8192 and the layer
    norm; two 32768 x 4096 tables: 7,285,403,648 values (the card's 7.3B). At tp 2 each GPU takes 64 heads and
    4 of the 8 groups; A_log is held in float32."""
    m = shard_map(CODESTRAL, 2)
    layer = (18560 * 4096 + 10240 * 4 + 10240 + 3 * 128 + 8192 + 4096 * 8192 + 4096)
    total = 64 * layer + 2 * 32768 * 4096 + 4096
    assert total == 7_285_403_648
    assert m.total_weight_bytes == 2 * total + 64 * 128 * 2
    ip = m.tensor("backbone.layers.*.mixer.in_proj.weight")
    assert [(p.start, p.stop) for p in ip.rank_pieces(1)] == [(4096, 8192), (12288, 16384), (16896, 17408),
                                                             (17920, 18432), (18496, 18560)]
    assert m.tensor("backbone.layers.*.mixer.out_proj.weight").split_dim == 1
    assert [t.name for t in m.tensors][:3] == ["backbone.embeddings.weight", "lm_head.weight",
                                              "backbone.norm_f.weight"]


def test_the_preset_is_what_mistral_announced():
    """The release's config (docs/presets.md): Mistral's "7,285,403,648 parameters" and the checkpoint's 579
    tensors of 14,570,807,296 bytes (all bf16 on disk; vLLM holds A_log in float32, 2 bytes more a head)."""
    m = shard_map(presets()["mistralai/Mamba-Codestral-7B-v0.1"], 1)
    assert sum(p.count * numel(p.shape) for p in m.params) == 7_285_403_648
    assert len(expand(m)) == 579
    assert m.total_weight_bytes == 14_570_807_296 + 64 * 128 * 2


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_state_bytes_by_hand_and_no_kv_cache(tp):
    """mamba2.py's state in the model's dtype: conv [(8192 + 2 x 8 x 128) / tp, 3] and ssm [128 / tp heads,
    64, 128] per layer; no layer attends, so no KV cache."""
    r = shard_map(CODESTRAL, tp).ranks[0]
    assert r.state_bytes_per_sequence == 64 * ((8192 + 2 * 8 * 128) // tp * 3 + 128 // tp * 64 * 128) * 2
    assert r.kv_cache_bytes_per_token == 0
    sentences = cache_sentences(shard_map(CODESTRAL, tp))
    assert any(s.startswith("Mamba2 layers keep a fixed state") for s in sentences)


def test_valid_tp_sizes_name_the_configs_own_keys():
    spec = normalize(CODESTRAL)
    assert [tp for tp in (1, 2, 3, 4, 8, 16) if split_problem(spec, tp)[0] is None] == [1, 2, 4, 8]
    assert split_problem(spec, 3)[0] == "num_heads=128 is not divisible by tp_size=3"
    assert split_problem(spec, 16)[0] == "n_groups=8 is not divisible by tp_size=16"
    with pytest.raises(TPSizeError) as e:
        shard_map(CODESTRAL, 3)
    assert one_line(e.value) and "num_heads=128" in str(e.value)


def test_refusals():
    with pytest.raises(ConfigError, match="use_bias=True: mamba2's Mamba2 in_proj / out_proj biases"):
        normalize({**CODESTRAL, "use_bias": True})
    with pytest.raises(ConfigError) as e:
        normalize({**CODESTRAL, "head_dim": 32})
    assert one_line(e.value)
    assert "num_heads=128 x head_dim=32 is not expand x hidden_size=8192" in str(e.value)
