"""tpviz/config/windows.py (and the readers' window patterns): which layers a config's sliding_window windows,
as vLLM 0.33 runs it, and the note when tpviz leaves a window unapplied."""
import pytest

from tests.config.test_kinds import BASE, ffns, mixers
from tpviz.config.normalize import normalize


def test_gemma_alternation():
    s = normalize(dict(BASE, model_type="gemma2", sliding_window=8))  # even layers sliding
    assert mixers(s) == ["sliding_attention", "attention"] * 2
    s = normalize(dict(BASE, model_type="gemma3_text", num_hidden_layers=12, sliding_window=8))
    assert [i for i, k in enumerate(mixers(s)) if k == "attention"] == [5, 11]  # default pattern 6
    s = normalize(dict(BASE, model_type="gemma3_text", num_hidden_layers=6, sliding_window=8,
                       sliding_window_pattern=3))
    assert [i for i, k in enumerate(mixers(s)) if k == "attention"] == [2, 5]
    s = normalize(dict(BASE, model_type="gemma3_text", sliding_window=8, layer_types=["full_attention"] * 4))
    assert mixers(s) == ["attention"] * 4  # explicit layer_types win over the pattern
    # transformers' Gemma3TextConfig, which vLLM reads it with, turns a pattern of -1 into full attention
    # everywhere
    s = normalize(dict(BASE, model_type="gemma3_text", sliding_window=8, sliding_window_pattern=-1))
    assert mixers(s) == ["attention"] * 4


def test_gpt_oss_even_layers_slide():
    cfg = dict(BASE, model_type="gpt_oss", sliding_window=128, num_local_experts=4, num_experts_per_tok=2)
    for extra in ({}, {"layer_types": ["full_attention"] * 4}):  # vLLM ignores layer_types here
        s = normalize(dict(cfg, **extra))
        assert mixers(s) == ["sliding_attention", "attention"] * 2
        assert s.layers[0].mixer.window == 128 and {f[0] for f in ffns(s)} == {"moe"}


def test_sliding_window_switches():
    assert set(mixers(normalize(dict(BASE, model_type="qwen3", sliding_window=8,
                                     use_sliding_window=False)))) \
        == {"attention"}
    assert set(mixers(normalize(dict(BASE, model_type="qwen3_moe", sliding_window=8, num_experts=4,
                                     num_experts_per_tok=2, moe_intermediate_size=8)))) == {"attention"}
    assert set(mixers(normalize(dict(BASE, model_type="mistral", sliding_window=8)))) == {"sliding_attention"}


def test_phi3_window_holds_for_every_layer_unless_it_never_binds():
    """vLLM 0.33 gives a config's sliding_window to every layer when there are no layer_types (EngineArgs sets
    CacheConfig.sliding_window; Phi-3 is LlamaForCausalLM): Phi-3-mini-4k's 2047 caps its KV cache.
    Phi-3-128k's 262144 is past its 131072 positions, so it never binds: full attention."""
    s = normalize(dict(BASE, model_type="phi3", sliding_window=2047, max_position_embeddings=4096))
    assert set(mixers(s)) == {"sliding_attention"} and s.layers[0].mixer.window == 2047
    s = normalize(dict(BASE, model_type="phi3", sliding_window=262144, max_position_embeddings=131072))
    assert set(mixers(s)) == {"attention"}


def test_a_binding_window_of_an_architecture_tpviz_does_not_window_is_named():
    """A model-wide window on an architecture without the model-wide window rule is sized as full attention,
    and a note says so (an upper bound), rather than a silent cache figure; windows that are applied, never
    bind or are switched off say nothing."""
    s = normalize(dict(BASE, model_type="llama", sliding_window=4096, max_position_embeddings=131072))
    assert set(mixers(s)) == {"attention"}
    assert any(n.startswith("sliding_window=4096 in a 'llama' config is not applied") for n in s.notes)
    quiet = [dict(BASE, model_type="mistral", sliding_window=4096),
             dict(BASE, model_type="llama", sliding_window=4096, max_position_embeddings=4096),
             dict(BASE, model_type="llama", sliding_window=4096, use_sliding_window=False),
             dict(BASE, model_type="qwen2", sliding_window=4096, use_sliding_window=True),
             dict(BASE, sliding_window=None)]
    for cfg in quiet:
        assert not any("sliding_window" in n for n in normalize(cfg).notes), cfg


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen2_and_qwen3_window_only_when_transformers_makes_every_layer_sliding(model_type):
    """transformers' Qwen2Config / Qwen3Config make layers from max_window_layers on sliding (with
    use_sliding_window); vLLM 0.33 windows the cache only when that is every layer (EngineArgs), and
    Qwen2Model (Qwen3Model is one) refuses layers that differ unless max_window_layers ==
    num_hidden_layers."""
    cfg = dict(BASE, model_type=model_type, num_hidden_layers=4, sliding_window=64, use_sliding_window=True)
    every = normalize(dict(cfg, max_window_layers=0))
    assert (set(mixers(every)) == {"sliding_attention"} and every.layers[0].mixer.window == 64
            and not every.notes)
    for none in (dict(cfg, max_window_layers=4), dict(cfg, max_window_layers=0,
                                                      use_sliding_window=False), cfg):
        s = normalize(none)  # cfg alone: the default max_window_layers 28 is past its 4 layers
        assert set(mixers(s)) == {"attention"} and not any("window" in n for n in s.notes), none
    mix = normalize(dict(cfg, max_window_layers=2))
    assert set(mixers(mix)) == {"attention"}
    assert (any(f"2 of the 4 layers sliding, which vLLM 0.33's {model_type.title()} refuses" in n
                for n in mix.notes))
    given = dict(cfg, layer_types=["sliding_attention", "full_attention"] * 2)  # layer_types: the same rule
    assert set(mixers(normalize(given))) == {"attention"}
    assert any("refuses" in n for n in normalize(given).notes)
    assert not any("refuses" in n for n in normalize(dict(given, max_window_layers=4)).notes)


def test_qwen_moe_windows_as_their_transformers_configs_place_them():
    """Qwen2MoeConfig slides the even layers below max_window_layers, so with more than one layer vLLM 0.33
    windows none (its Qwen2-MoE has no per-layer windows); Qwen3MoeConfig keeps one window for every layer."""
    moe = dict(BASE, num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
               sliding_window=64, use_sliding_window=True)
    s = normalize(dict(moe, model_type="qwen2_moe"))
    assert set(mixers(s)) == {"attention"}
    assert any("makes 2 of the 4 layers sliding; vLLM 0.33 windows the KV cache only when all are" in n
               for n in s.notes)
    one = normalize(dict(moe, model_type="qwen2_moe", num_hidden_layers=1))
    assert mixers(one) == ["sliding_attention"] and not one.notes
    for mwl in (0, 28):
        s = normalize(dict(moe, model_type="qwen3_moe", max_window_layers=mwl))
        assert set(mixers(s)) == {"sliding_attention"} and s.layers[0].mixer.window == 64 and not s.notes
    off = normalize(dict(moe, model_type="qwen3_moe", use_sliding_window=False))
    assert set(mixers(off)) == {"attention"} and not off.notes
