"""vLLM's model files that build embed_tokens with no is_first_rank guard (qwen3_moe.py, mixtral.py,
gemma*.py, gpt_oss.py, ... in 0.28 and 0.33) allocate and load their slice of the table on every pipeline
stage; llama.py, qwen2.py and deepseek_v2.py build it on the first stage alone."""
from tpviz.config.sources import load_spec
from tpviz.deploy.deployment import deploy
from tpviz.rules import Layout


def embed_slice(spec, tp: int) -> int:
    """One GPU's rows of embed_tokens: the vocabulary padded to 64, cut tp ways, bf16."""
    return -(-spec.vocab_size // 64) * 64 // tp * spec.hidden_size * 2


def test_mixtrals_middle_stages_hold_their_layers_and_the_embedding_by_hand():
    spec = load_spec("mistralai/Mixtral-8x7B-v0.1")
    assert spec.arch.embed_every_stage
    h, inter, kv = 4096, 14336, 8 * 128
    # one layer at tp 2, bf16: q/k/v/o and eight experts' gate/up/down cut in two, router and norms whole
    layer = ((2 * h * h + 2 * kv * h) // 2 + 8 * 3 * inter * h // 2 + 8 * h + 2 * h) * 2
    gpus = deploy(spec, Layout(2, pp=4), "vllm").gpus
    middle = [g for g in gpus if g.pp in (1, 2)]
    assert [g.weight_bytes for g in middle] == [8 * layer + embed_slice(spec, 2)] * 4


def test_llama_and_deepseek_build_it_on_the_first_stage_alone():
    for model in ("meta-llama/Llama-3.1-8B", "deepseek-ai/DeepSeek-V3"):
        spec = load_spec(model)
        assert not spec.arch.embed_every_stage
        assert not any("every pipeline stage" in w for w in deploy(spec, Layout(8, pp=2), "vllm").warnings)


def test_the_layout_says_so_and_sglang_keeps_it_on_the_first_stage():
    spec = load_spec("Qwen/Qwen3-30B-A3B")
    vllm, sglang = deploy(spec, Layout(4, pp=2), "vllm"), deploy(spec, Layout(4, pp=2), "sglang")
    assert any("embed_tokens on every pipeline stage" in w for w in vllm.warnings)
    assert not any("every pipeline stage" in w for w in sglang.warnings)
    # SGLang's qwen2_moe.py model guards it with is_first_rank: the last stages differ by exactly that slice
    assert vllm.gpus[-1].weight_bytes == sglang.gpus[-1].weight_bytes + embed_slice(spec, 4)
