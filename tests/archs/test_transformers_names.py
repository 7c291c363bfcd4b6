"""Architectures checked against the tensor names of a tiny checkpoint that transformers itself builds (its
model class is what writes the real checkpoints): the map names exactly those, tied ones aside."""
import pytest
import torch
import transformers

from tpviz import shard_map
from tpviz.config.sources import presets
from tpviz.errors import ConfigError
from tpviz.trace.checkpoint import expand
from tpviz.trace.collectives import collectives

TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=512)
CASES = {"CohereForCausalLM": "CohereForAI/c4ai-command-r-v01",
         "Exaone4ForCausalLM": "LGAI-EXAONE/EXAONE-4.0-32B",
         "Cohere2ForCausalLM": "CohereLabs/c4ai-command-r7b-12-2024"}


@pytest.mark.parametrize("hf_class", sorted(CASES))
def test_the_map_names_what_transformers_writes(hf_class):
    cfg = {**presets()[CASES[hf_class]], **TINY}
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    with torch.device("meta"):
        model = getattr(transformers, hf_class)(config)
    written = {name for name, _ in model.named_parameters()}  # tied parameters once, as save_pretrained does
    assert set(expand(shard_map(cfg, 2))) == written


def test_command_r_reduces_once_per_layer_and_refuses_qk_norms():
    """vLLM 0.33 models/commandr.py: attention and MLP side by side under one LayerNorm, one all-reduce of
    their sum per layer; Command-R+'s per-head q/k norms are refused, named."""
    cfg = presets()["CohereForAI/c4ai-command-r-v01"]
    m = shard_map(cfg, 4)
    reduces = [c for c in collectives(m) if c.where.startswith(("after o_proj", "after down_proj"))]
    assert [c.count for c in reduces] == [40, 0]  # o_proj and down_proj summed, reduced once
    assert m.model.tie_word_embeddings and not any(p.family == "lm_head" for p in m.params)
    for key in ("use_qk_norm", "attention_bias"):
        with pytest.raises(ConfigError, match=key):
            shard_map({**cfg, key: True}, 4)


def test_exaone4_windows_three_layers_in_four():
    """vLLM 0.33 models/exaone4.py: layer_types' sliding layers cache sliding_window tokens, the rest all."""
    m = shard_map(presets()["LGAI-EXAONE/EXAONE-4.0-32B"], 4)
    kinds = [layer.mixer.window for layer in m.model.layers]
    assert kinds[:8] == [4096, 4096, 4096, 0] * 2 and kinds.count(0) == 16
    assert not any("input_layernorm" in name for name in expand(m))


def test_command_r7b_caches_one_token_past_its_window():
    """vLLM 0.33 models/commandr.py passes sliding_window + 1 for Cohere2's sliding layers (they attend to
    [pos - sliding_window, pos]); every fourth layer is full attention."""
    m = shard_map(presets()["CohereLabs/c4ai-command-r7b-12-2024"], 2)
    windows = [layer.mixer.window for layer in m.model.layers]
    assert windows[:4] == [4097, 4097, 4097, 0] and windows.count(0) == 8
    assert m.model.joint_reduce and "sliding_window + 1" in " ".join(m.model.notes)
