"""The SGLang 0.5.23 rule set: the guide's examples computed by hand, the layouts both engines share, and
every message it reproduces against the text in the 0.5.23 wheel (sglang/srt, quoted below with file and
line)."""
import pytest

from tpviz import load_spec, shard_map
from tpviz.deploy.deployment import deploy
from tpviz.errors import LayoutError, TPSizeError
from tpviz.rules import Layout, ruleset
from tpviz.trace.model_map import map_model
from tpviz.trace.validity import split_problem

SGL = ruleset("sglang")
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 768,
        "intermediate_size": 3072, "num_attention_heads": 12, "num_key_value_heads": 12,
        "num_hidden_layers": 2, "vocab_size": 32000, "torch_dtype": "bfloat16"}


def rows(m, name: str, rank: int) -> list[tuple[int, int]]:
    """The source rows (start, stop) a rank holds of a tensor."""
    return [(p.start, p.stop) for p in m.tensor(name).pieces if p.rank == rank]


def test_qwen3_235b_fp8_needs_ep_at_tp_8():
    # moe_intermediate_size 1536 / 8 = 192 is no whole 128-row block, and SGLang has no MoE refinement
    problem = split_problem(load_spec("Qwen/Qwen3-235B-A22B-FP8"), 8, "sglang")[0]
    assert "The output_size of gate's and up's weight = 192 is not divisible by weight quantization " \
           "block_n = 128." in problem and "--ep" in problem
    d = deploy(load_spec("Qwen/Qwen3-235B-A22B-FP8"), Layout(8, ep_size=2), "sglang")  # 1536 / 4 = 384
    assert [g.experts for g in d.gpus] == [list(range(64))] * 4 + [list(range(64, 128))] * 4


def test_deepseek_v3_attention_dp_8_ep_8_whole_attention_and_32_whole_experts():
    layout = Layout(8, attn_dp=8, ep_size=8)
    m = map_model(load_spec("deepseek-ai/DeepSeek-V3"), 8, "sglang", layout=layout)
    for rank in range(8):  # attn_tp = 1: q_b (128 heads x 192) and o_proj whole on every GPU
        assert rows(m, "model.layers.*.self_attn.q_b_proj.weight", rank) == [(0, 128 * 192)]
        assert rows(m, "model.layers.*.mlp.experts.*.gate_proj.weight", rank) == [(0, 2048)]  # whole
    d = deploy(load_spec("deepseek-ai/DeepSeek-V3"), layout, "sglang")
    assert [g.experts for g in d.gpus] == [list(range(32 * r, 32 * r + 32)) for r in range(8)]
    # the MLA latent is cached per attention-DP group: each of the 8 serves its own sequences
    assert len({g.kv_cache_bytes_per_token for g in d.gpus}) == 1


def test_qwen3_30b_tp_8_ep_2_gpus_0_to_3_hold_experts_0_to_63_cut_4_ways():
    layout = Layout(8, ep_size=2)
    m = map_model(load_spec("Qwen/Qwen3-30B-A3B"), 8, "sglang", layout=layout)
    name = "model.layers.*.mlp.experts.*.gate_proj.weight"  # moe_intermediate_size 768, moe_tp = 4
    assert [rows(m, name, r) for r in range(8)] == [[(192 * (r % 4), 192 * (r % 4 + 1))] for r in range(8)]
    assert rows(m, "model.layers.*.self_attn.q_proj.weight", 5) == [(5 * 512, 6 * 512)]  # 32 heads x 128 / 8
    d = deploy(load_spec("Qwen/Qwen3-30B-A3B"), layout, "sglang")
    assert [g.experts for g in d.gpus[:4]] == [list(range(64))] * 4


def test_pipeline_remainder_on_the_last_stages():
    assert SGL.pp_partition(61, 4) == [15, 15, 15, 16]  # get_pp_indices
    assert ruleset("vllm").pp_partition(61, 4) == [15, 15, 16, 15]  # vLLM: on the stages before the last
    d = deploy(load_spec("deepseek-ai/DeepSeek-V3"), Layout(4, pp=4), "sglang")
    assert d.stages == [[0, 15], [15, 30], [30, 45], [45, 61]]


def test_vocab_padded_to_64_times_3_at_tp_3():
    # 32000 is a multiple of 64 but not of 3: SGLang pads to 192 (32064 rows, 10688 per GPU); vLLM refuses
    assert SGL.padded_vocab(32000, 3) == 32064 and SGL.padded_vocab(32000, 4) == 32000
    m = shard_map(TINY, 3, "sglang")
    assert [rows(m, "model.embed_tokens.weight", r) for r in range(3)] == [
        [(0, 10688)], [(10688, 21376)], [(21376, 32000)]]
    assert "vocab_size=32000" in split_problem(load_spec(TINY), 3, "vllm")[0]


# (layout in SGLang, the same GPUs in vLLM): every GPU holds the same bytes
EQUIVALENT = [
    ("meta-llama/Llama-3.1-8B", Layout(8), Layout(8)),
    ("Qwen/Qwen3-8B", Layout(4, pp=2), Layout(4, pp=2)),  # qwen3.py: the lm_head on the last stage alone
    ("Qwen/Qwen3-30B-A3B", Layout(8, ep_size=8), Layout(8, ep=True)),
    ("deepseek-ai/DeepSeek-V3", Layout(8, attn_dp=8, ep_size=8, dense_tp1=True, dp_lm_head=True,
                                       shared_tp1=True), Layout(1, dp=8, ep=True)),
]


@pytest.mark.parametrize("model, sglang, vllm", EQUIVALENT, ids=lambda x: getattr(x, "label", x))
def test_equivalent_layouts_hold_the_same_bytes(model, sglang, vllm):
    spec = load_spec(model)
    a, b = deploy(spec, sglang, "sglang"), deploy(spec, vllm, "vllm")
    assert [g.weight_bytes for g in a.gpus] == [g.weight_bytes for g in b.gpus]
    assert [g.kv_cache_bytes_per_token for g in a.gpus] == [g.kv_cache_bytes_per_token for g in b.gpus]


def test_llama_and_qwen3_moe_build_the_lm_head_on_every_stage():
    # llama.py and qwen3_moe.py build ParallelLMHead with no is_last_rank guard: each stage allocates its
    # slice
    for model in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B"):
        spec = load_spec(model)
        a, b = deploy(spec, Layout(4, pp=2), "sglang"), deploy(spec, Layout(4, pp=2), "vllm")
        head = -(-spec.vocab_size // 64) * 64 // 4 * spec.hidden_size * 2  # padded rows / 4 GPUs, bf16
        assert a.gpus[0].weight_bytes == b.gpus[0].weight_bytes + head  # stage 0 holds a slice too
        # vLLM's qwen3_moe.py builds embed_tokens on every stage, SGLang's on the first alone (same rows)
        embed = head if spec.arch.embed_every_stage else 0
        assert a.gpus[-1].weight_bytes + embed == b.gpus[-1].weight_bytes
    tied = {**TINY, "tie_word_embeddings": True}
    assert "ties the lm_head to embed_tokens" in SGL.layout_problem(Layout(2, pp=2), load_spec(tied))


def test_attention_dp_is_refused_where_the_model_cuts_attention_over_tp():
    problem = SGL.layout_problem(Layout(8, attn_dp=2), load_spec("meta-llama/Llama-3.1-8B"))
    assert "llama.py cuts attention over the whole --tp even with --attn-dp-size 2" in problem


def test_replicas_beside_experts_differ_from_vllm():
    # vLLM cuts Qwen3-30B's experts over tp x dp = 8 GPUs; SGLang's --dp-size replicas are whole copies
    spec = load_spec("Qwen/Qwen3-30B-A3B")
    a, b = deploy(spec, Layout(4, dp=2), "sglang"), deploy(spec, Layout(4, dp=2), "vllm")
    assert deploy(spec, Layout(4), "sglang").gpus[0].weight_bytes == a.gpus[0].weight_bytes
    assert (a.gpus[0].weight_bytes > b.gpus[0].weight_bytes
            == deploy(spec, Layout(4, dp=2), "vllm").gpus[7].weight_bytes)


# the SGLang 0.5.23 source text of each message tpviz repeats, and the layout that makes it
SOURCE = [
    # arg_groups/parallel_hook.py:287-292
    ('f"--dp-size {cfg.dp_size} with --attn-dp-size {cfg.attn_dp_size}: " "data-parallel replicas combined '
     'with attention data parallelism are not supported."', Layout(8, dp=2, attn_dp=2),
     "--dp-size 2 with --attn-dp-size 2: data-parallel replicas combined with attention data parallelism "
     "are not supported."),
    # arg_groups/parallel_hook.py:285-286
    ('f"--attn-dp-size must be positive (got {cfg.attn_dp_size})."', Layout(8, attn_dp=0),
     "--attn-dp-size must be positive (got 0)."),
    # models/qwen3_moe.py:243-249 (moe_tp_size against num_experts)
    ('f"Tensor parallel size {self.tp_size} is greater than the number of experts {config.num_experts}."',
     Layout(256), "Tensor parallel size 256 is greater than the number of experts 128."),
]


@pytest.mark.parametrize("source, layout, text", SOURCE)
def test_messages_are_sglangs_own(source, layout, text):
    assert SGL.layout_problem(layout, load_spec("Qwen/Qwen3-30B-A3B")) == text


def test_partition_override_in_sglangs_words(monkeypatch):
    # distributed/utils.py get_pp_indices: ValueError("Invalid partition string: {}"),
    # f"{len(partitions)=} does not match {pp_size=}.", f"{sum(partitions)=} does not match
    # {num_hidden_layers=}."
    for text, message in (("a,b", "Invalid partition string: a,b"),
                          ("20,20,21", "len(partitions)=3 does not match pp_size=4."),
                          ("15,15,15,15", "sum(partitions)=60 does not match num_hidden_layers=61.")):
        with pytest.raises(LayoutError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
            SGL.pp_partition(61, 4, text)
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "16,15,15,15")
    assert SGL.pp_partition(61, 4) == [16, 15, 15, 15] and SGL.pp_partition(61, 1) == [61]  # pp 1 ignores it


@pytest.mark.parametrize("layout, part", [
    (Layout(8, attn_dp=3), "--attn-dp-size 3 does not divide --tp 8"),
    (Layout(8, ep_size=3), "--ep 3 does not divide --tp 8"),
    (Layout(8, ep=True), "SGLang's expert parallelism is --ep N"),
])
def test_bare_asserts_say_what_fails_and_the_flag(layout, part):
    assert part in SGL.layout_problem(layout, load_spec("Qwen/Qwen3-30B-A3B"))


def test_head_counts_are_checked_against_the_attention_group():
    spec = load_spec("Qwen/Qwen3-30B-A3B")  # 32 heads, 4 KV heads
    with pytest.raises(TPSizeError, match="attn_tp_size = tp / attn_dp_size = 12"):
        deploy(spec, Layout(24, attn_dp=2, ep_size=8), "sglang")
    # Llama's model file cuts attention over the whole tp even under attention DP (llama.py uses tp_size)
    w = SGL.widths(Layout(8, attn_dp=4), load_spec("meta-llama/Llama-3.1-8B").arch)
    assert (w.attention, w.embed, w.lm_head) == (8, 8, 8)


def test_what_sglang_code_tpviz_does_not_model_is_refused_in_one_line():
    problem = split_problem(load_spec("openai/gpt-oss-120b"), 8, "sglang")[0]
    assert "does not model SGLang 0.5.23's gpt_oss model file" in problem and "\n" not in problem
    assert "has no --attn-dp-size" in ruleset("vllm").layout_problem(Layout(8, attn_dp=2))


def test_switches_apply_only_where_the_model_file_reads_them():
    qwen = load_spec("Qwen/Qwen3-30B-A3B")
    assert "does not change qwen3_moe.py's dense MLPs" in SGL.layout_problem(Layout(8, dense_tp1=True), qwen)
    ds = load_spec("deepseek-ai/DeepSeek-V3")
    whole = deploy(ds, Layout(8, dense_tp1=True), "sglang").gpus[0].weight_bytes
    cut = deploy(ds, Layout(8), "sglang").gpus[0].weight_bytes
    dense = 3 * 3 * 7168 * 18432  # 3 dense layers of gate, up, down in FP8 (1 byte), plus their scales
    assert whole - cut == pytest.approx(dense * 7 / 8, rel=0.01)


def test_plan_ranks_sglangs_own_layouts():
    from tpviz.deploy.ranking import plan_rows, rank_layouts
    rows = plan_rows(rank_layouts(load_spec("deepseek-ai/DeepSeek-V3"), 8, 141.0, "sglang"))
    best = next(r for r in rows if r["fits"])
    assert best.get("attn_dp", 1) > 1  # the latent KV cache is per attention-DP group: DP attention wins room
    shapes = {(r["tp"], r.get("attn_dp", 1), r.get("ep_size", 1)) for r in rows}
    assert {(8, 8, 8), (8, 1, 1), (8, 1, 2)} <= shapes
    assert not any(r["ep"] for r in rows)  # vLLM's EP over tp x dp is not an SGLang layout


FP8 = {**TINY, "hidden_size": 1024, "intermediate_size": 2880, "num_attention_heads": 8,
       "num_key_value_heads": 8,
       "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                               "weight_block_size": [128, 128]}}


def test_fp8_block_checks_in_sglangs_words():
    # layers/quantization/fp8.py validate_block_quant_shapes: f"Weight output_partition_size = "
    # f"{output_partition_size} is not divisible by weight quantization block_n = {block_n}." - for merged
    # layers at every tp, tp 1 included (2880 = 22.5 blocks of 128: gate_up's halves)
    problem = split_problem(load_spec(FP8), 1, "sglang")[0]
    assert problem.endswith("Weight output_partition_size = 2880 is not divisible by weight quantization "
                            "block_n = 128.")
    assert "Weight output_partition_size" not in (split_problem(load_spec(FP8), 1, "vllm")[0] or "")
    fp8_even = {**FP8, "intermediate_size": 2816}  # 22 blocks: whole at tp 1 and 2 (11), not at tp 4 (5.5)
    assert split_problem(load_spec(fp8_even), 2, "sglang")[0] is None
    assert "Weight output_partition_size = 704 is not divisible by weight quantization block_n = 128." in \
        split_problem(load_spec(fp8_even), 4, "sglang")[0]


def test_post_load_moe_check_in_sglangs_words():
    # model_runner_components/moe_ep_setup.py check_quantized_moe_compatibility, run by ModelRunner.__init__
    # after loading for any weight_block_size config with moe_intermediate_size, quantized experts or not
    c = load_spec("Qwen/Qwen3-235B-A22B-FP8").config
    q = {**c["quantization_config"], "modules_to_not_convert": ["mlp.experts"]}  # bf16 experts
    spec = load_spec({**c, "quantization_config": q})
    assert split_problem(spec, 8, "vllm")[0] is None
    assert split_problem(spec, 8, "sglang")[0] == (
        "after loading: For quantized MoE models, please make sure (moe_intermediate_size=1536 / "
        "moe_tp_size=8) % weight_block_size_n=128 == 0 where moe_tp_size is equal to tp_size (8) divided by "
        "ep_size (1). You can fix this by setting arguments `--tp` and `--ep` correctly.")
    assert split_problem(spec, 8, "sglang", layout=Layout(8, ep_size=2))[0] is None  # 1536 / 4 = 384
    # f"moe_intermediate_size {moe_intermediate_size} must be divisible by moe_tp_size ({moe_tp_size}) which
    # is tp_size ({tp_size}) divided by moe_ep_size ({moe_ep_size})."
    assert SGL.load_problem(Layout(10, ep_size=2), spec) == (
        "moe_intermediate_size 1536 must be divisible by moe_tp_size (5) which is tp_size (10) divided by "
        "moe_ep_size (2).")
    # SGLANG_SHARED_EXPERT_TP1 skips the block test, not the divisibility; no block size, no check
    assert SGL.load_problem(Layout(8, shared_tp1=True), spec) is None
    plain = load_spec({**c, "quantization_config": {**q, "weight_block_size": None}})
    assert SGL.load_problem(Layout(8), plain) is None


def test_deepseek_compares_the_whole_tp_with_its_experts():
    # models/deepseek_v2.py: f"Tensor parallel size {self.tp_size} is greater than the number of experts
    # {config.n_routed_experts}." with the global tp, not moe_tp
    problem = SGL.layout_problem(Layout(512, ep_size=256), load_spec("deepseek-ai/DeepSeek-V3"))
    assert problem == "Tensor parallel size 512 is greater than the number of experts 256."


def test_fit_sizes_sglangs_layout_not_the_tp_map():
    from tpviz.deploy.fit import fit
    layout = Layout(8, attn_dp=8, ep_size=8)
    m = map_model(load_spec("deepseek-ai/DeepSeek-V3"), 8, "sglang", layout=layout)
    f = fit(m, 141.0, layout=layout)
    gpu = deploy(load_spec("deepseek-ai/DeepSeek-V3"), layout, "sglang").gpus[0]
    assert f.weights == gpu.weight_bytes  # 32 whole experts, not a slice of all 256
    assert f.max_sequences % 8 == 0  # each attention-DP group caches its own sequences


def test_deepseek_v3_fused_shared_expert_is_said_at_ep_1():
    ds = load_spec("deepseek-ai/DeepSeek-V3")
    assert any("fuses DeepSeek-V3's shared expert" in w for w in split_problem(ds, 8, "sglang")[1])
    assert not any("fuses" in w for w in split_problem(ds, 8, "sglang", layout=Layout(8, ep_size=2))[1])
    assert "fuses it into the routed experts" in SGL.layout_problem(Layout(8, shared_tp1=True), ds)


def test_a_tower_sglang_may_refuse_is_said_where_its_heads_do_not_divide_attn_tp():
    """The tower is left out under SGLang (plan/tower.py): its map, memory and tp checks. Where its heads do
    not divide attn_tp, SGLang's VisionAttention asserts unless the encoder runs data-parallel: a map there
    says so, and the validity table carries it on the tp it calls valid."""
    vl = load_spec("Qwen/Qwen3-VL-30B-A3B-Instruct")  # 16 vision heads; the decoder's 32 divide tp 32
    m = shard_map(vl, 32, rules="sglang")
    said = [w for w in m.warnings if w.startswith("SGLang may refuse this layout for the vision tower")]
    assert len(said) == 1 and "its 16 heads do not divide attn_tp_size = 32" in said[0]
    assert "--mm-enable-dp-encoder" in said[0]
    assert any("left out of this map, its memory and its tp checks" in w for w in m.warnings)
    assert not any(w.startswith("SGLang may refuse") for w in shard_map(vl, 16, rules="sglang").warnings)
    # Gemma-3 (and Llama-4): SGLang builds no tower unless --enable-multimodal, the map's default exactly
    gemma = load_spec("google/gemma-3-27b-it")
    m = shard_map(gemma, 32, rules="sglang")
    assert any(w.startswith("SGLang 0.5.23 builds no vision tower for this model unless --enable-multimodal")
               for w in m.warnings)
    assert any(w.startswith("with --enable-multimodal, SGLang may refuse") for w in m.warnings)
    assert not any("left out of this map" in w for w in m.warnings)
    assert split_problem(gemma, 32)[0].startswith("the vision tower: vision_config.num_attention_heads=16")
    problem, warnings = split_problem(vl, 32, "sglang")
    assert problem is None and any("16 heads do not divide attn_tp_size = 32" in w for w in warnings)
    text = load_spec("meta-llama/Llama-3.1-8B")  # no tower: nothing to say
    assert not any("vision tower" in w for w in split_problem(text, 32, "sglang")[1])
