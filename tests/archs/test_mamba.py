"""Pure Mamba1 (vLLM 0.33 models/mamba.py: MambaForCausalLM, FalconMambaForCausalLM): Jamba's Mamba1 mixer
alone in every layer, with no dt / B / C norm weights. Names and shapes against tiny checkpoints transformers
writes; counts, rows and state by hand."""
import math

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
from tpviz.trace.validity import split_problem

TINY = dict(vocab_size=96, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
            time_step_rank=6)
# state-spaces/mamba-2.8b-hf's dimensions: 64 layers of 2560, state 16, expand 2, dt rank 160, a 50280 vocab,
# tied (the card's 2.8B)
MAMBA_28 = {"architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 2560,
            "num_hidden_layers": 64, "state_size": 16, "expand": 2, "conv_kernel": 4, "use_bias": False,
            "use_conv_bias": True, "time_step_rank": 160, "vocab_size": 50280, "tie_word_embeddings": True}


@pytest.mark.parametrize("hf_class, config_class, tie", [
    ("MambaForCausalLM", "MambaConfig", True), ("FalconMambaForCausalLM", "FalconMambaConfig", False)])
def test_names_and_shapes_are_what_transformers_saves(tmp_path, hf_class, config_class, tie):
    """Falcon-Mamba's dt / B / C RMSNorms carry no weight (transformers computes them unweighted; vLLM builds
    them with has_weight=False): neither checkpoint nor map has a norm beside the layer's own."""
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**TINY, tie_word_embeddings=tie)
    written = written_shapes(getattr(transformers, hf_class)(config), tmp_path)
    cfg = {**config.to_dict(), "architectures": [hf_class]}
    m = shard_map(cfg, 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    planned = {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))}
    assert planned == {n: s for n, s in written.items() if not (tie and n == "lm_head.weight")}
    assert {layer.label for layer in m.model.layers} == {"Mamba1 + no FFN"}


def test_mamba_28b_counts_rows_and_state_by_hand():
    """Per layer: in_proj [x | gate] 2 x 5120 x 2560, conv1d 5120 x 4 and its bias, x_proj (160 + 2 x 16) x
    5120, dt_proj 5120 x 160 and bias, A 5120 x 16 (float32 in vLLM), D 5120, out_proj 2560 x 5120, the norm;
    one tied 50280 x 2560 table: 2,768,345,600 values. At tp 2 each GPU takes 2560 channels of each part;
    x_proj cut by its input. The state: conv [5120 / tp, 3] and ssm [5120 / tp, 16] a layer, in the model's
    dtype."""
    m = shard_map(MAMBA_28, 2)
    layer = (2 * 5120 * 2560 + 5120 * 4 + 5120 + 192 * 5120 + 5120 * 160 + 5120 + 5120 * 16 + 5120
             + 2560 * 5120 + 2560)
    values = sum(p.count * math.prod(p.shape) for p in m.params)
    assert 64 * layer + 50280 * 2560 + 2560 == values == 2_768_345_600
    in_proj = m.tensor("backbone.layers.*.mixer.in_proj.weight")
    assert [(p.start, p.stop) for p in in_proj.rank_pieces(1)] == [(2560, 5120), (7680, 10240)]
    assert m.tensor("backbone.layers.*.mixer.x_proj.weight").split_dim == 1
    assert not any("layernorm" in t.name for t in m.tensors)
    r = m.ranks[0]
    assert r.state_bytes_per_sequence == 64 * (2560 * 3 + 2560 * 16) * 2 and r.kv_cache_bytes_per_token == 0


@pytest.mark.parametrize("preset, values", [("tiiuae/falcon-mamba-7b", 7_272_665_088),
                                            ("state-spaces/mamba-2.8b-hf", 2_768_345_600)])
def test_the_presets_are_what_their_releases_count(preset, values):
    """Falcon-Mamba-7B: TII's 7.27B, its 8192 channels from intermediate_size (its expand says 16, which
    mamba.py never reads), untied; Mamba-2.8B: the published 2,768,345,600, tied by MambaConfig's default."""
    m = shard_map(presets()[preset], 1)
    assert sum(p.count * math.prod(p.shape) for p in m.params) == values
    channels = 8192 if "falcon" in preset else 5120
    assert m.tensor("backbone.layers.*.mixer.in_proj.weight").shape[0] == 2 * channels
    assert m.model.tie_word_embeddings is ("falcon" not in preset)


def test_tp_names_expand_and_bias_is_refused():
    spec = normalize(MAMBA_28)
    assert [tp for tp in (1, 2, 3, 4, 8, 16) if split_problem(spec, tp)[0] is None] == [1, 2, 4, 8, 16]
    with pytest.raises(TPSizeError) as e:
        shard_map({**MAMBA_28, "expand": 3}, 7)
    assert one_line(e.value) and "intermediate_size=7680 is not divisible by tp_size=7" in str(e.value)
    with pytest.raises(ConfigError, match="use_bias=True: mamba's Mamba1 in_proj / out_proj biases"):
        normalize({**MAMBA_28, "use_bias": True})
