"""Round trip of the loader-driven tracer on the real configs in ../shared/configs and on every preset.

For every config, tp in {1, 2, 4, 8, 16} and rule set:
- an invalid tp raises TPSizeError with exactly split_problem's message;
- the pieces cover every source row/column the right number of times (tests/conftest.py: check_shard_map);
- each rank's pieces rebuild that rank's local parameter, built and loaded here independently of the tracer;
- the checkpoint names equal those of the real safetensors index files.
"""
import json
import re

import pytest
import torch

from tpviz import TPSizeError, shard_map
from tpviz.layers import QKVParallelLinear
from tpviz.plan import DT, build_plan
from tpviz.rules import RULES, Layout, ruleset
from tpviz.rules.sglang_files import transformers_served
from tpviz.trace.shardmap import ShardMap
from tpviz.config.sources import load_spec, presets
from tpviz.trace.probe import build_rank
from tpviz.trace.tracer import load, tagged, trace
from tpviz.trace.validity import split_problem
from tests.paths import SHARED

CONFIGS = SHARED / "configs"
TPS = (1, 2, 4, 8, 16)


def _shared_files() -> list[str]:
    if not CONFIGS.is_dir():
        return []
    return sorted(p.stem for p in CONFIGS.glob("*.json") if not p.name.endswith(".index.json"))


def _index_files() -> list[str]:
    if not CONFIGS.is_dir():
        return []
    return sorted(p.name[: -len(".index.json")] for p in CONFIGS.glob("*.index.json"))


SHARED_FILES = _shared_files() or ["<shared absent>"]
INDEX_FILES = _index_files() or ["<shared absent>"]


def shared_config(stem: str) -> dict:
    if not SHARED.is_dir() or stem == "<shared absent>":
        pytest.skip("../shared is absent")
    return json.loads((CONFIGS / f"{stem}.json").read_text(encoding="utf-8"))


def rebuild_from_pieces(spec, m: ShardMap, rules: str) -> None:
    """Build every rank's modules from the plan, load ALL sources through the real weight_loaders on
    tagged tensors, and compare with the parameter reconstructed from the map's pieces."""
    tp = m.tp_size
    plans = build_plan(spec, rules)
    widths = ruleset(rules).widths(Layout(tp), spec.arch)  # SGLang: some roles over other groups than tp
    params = {(p.name, tuple(p.layers or ())): p for p in m.params}
    assert [p.name for p in plans] == [p.name for p in m.params]
    for plan in plans:
        pm, dim = params[(plan.name, tuple(plan.layers or ()))], plan.tp_dim
        tensors = [t for t in m.tensors if t.param == plan.name and t.layers == plan.layers]
        assert sorted(t.name for t in tensors) == sorted(s.name for s in plan.sources)
        # tagged along the split dim on disk, then prepared as the model's load_weights does (transpose,
        # reorder)
        tags = {s.name: (s.prepare or (lambda x: x))(tagged(s.shape, dim if s.dim is None else s.dim))
                for s in plan.sources}
        for rank in range(tp):
            cut = widths.of(plan.role)
            _, param = build_rank(plan, cut, rank % cut)
            param.data.fill_(float("nan"))
            for src in plan.sources:
                for shard_id in src.shard_id if isinstance(src.shard_id, list) else [src.shard_id]:
                    load(param, tags[src.name], shard_id)
            got = param.data
            assert got.size(dim) == pm.local_shapes[rank][dim], (plan.name, rank)
            want = torch.full_like(got, float("nan"))
            for t in tensors:
                for piece in t.rank_pieces(rank):
                    view = [1] * got.ndim
                    view[dim] = piece.size
                    block = want.narrow(dim, piece.param_start, piece.size)
                    block.copy_(torch.arange(piece.start, piece.stop,
                                             dtype=DT).reshape(view).expand_as(block))
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True,
                                       msg=lambda s: f"{plan.name} rank {rank} tp={tp} {rules}: {s}")
            nan_rows = torch.isnan(got).movedim(dim, 0).reshape(got.size(dim), -1).all(1)
            assert int(nan_rows.sum()) == pm.padding[rank], (plan.name, rank)
            # padding rows come after the real ones (KimiMoE pads each half of w13: w1, zeros, w3, zeros)
            if pm.padding[rank] and pm.layer_class != "PaddedExpertsGateUp":
                real = got.size(dim) - pm.padding[rank]
                assert not nan_rows[:real].any() and nan_rows[real:].all(), (plan.name, rank)


def sglang_native(spec) -> bool:
    """Whether SGLang 0.5.23 builds the model with a file of its own that tpviz has read."""
    return spec.arch.sglang is not None and transformers_served(spec.config) is None


def round_trip(cfg, tp: int, rules: str, invariants) -> None:
    spec = load_spec(cfg)
    problem = split_problem(spec, tp, rules)[0]
    # a model file tpviz has not read, or a class SGLang serves through its Transformers backend: one line
    if ruleset(rules).carves and not sglang_native(spec):
        assert ("does not model SGLang 0.5.23's" in problem or "SGLang 0.5.23's model registry has no "
                in problem) and "\n" not in problem, problem
        return
    if problem is not None:  # a divisibility rule, or what an SGLang model file itself refuses (Groups.check)
        own = ruleset(rules).carves and problem.startswith("SGLang 0.5.23's ")
        assert "\n" not in problem and (f"tp_size={tp}" in problem or own), problem
        with pytest.raises(TPSizeError) as err:
            trace(spec, tp, rules)
        assert str(err.value) == problem
        return
    m = trace(spec, tp, rules)
    assert (m.tp_size, m.rules.name) == (tp, rules)
    invariants(m)
    rebuild_from_pieces(spec, m, rules)


def expected_problem(spec, tp: int, rules: str) -> bool:
    """Hand rule (non-MLA configs): does any split fail at this tp? (SGLang: only the model files it reads,
    and the vocabulary padded to 64 x tp when 64 does not divide)"""
    if ruleset(rules).carves and not sglang_native(spec):
        return True
    kv = spec.num_key_value_heads
    kv_ok = kv % tp == 0 or (rules != "nano-vllm" and tp % kv == 0)
    vocab = -(-spec.vocab_size // 64) * 64 if rules != "nano-vllm" else spec.vocab_size
    if ruleset(rules).carves and vocab % tp:
        vocab = -(-spec.vocab_size // (64 * tp)) * 64 * tp
    dense_ok = not spec.dense_layers or spec.intermediate_size % tp == 0
    moe_ok = not spec.is_moe or spec.moe_intermediate_size % tp == 0
    return not (spec.num_attention_heads % tp == 0 and kv_ok and dense_ok and moe_ok and vocab % tp == 0)


@pytest.mark.parametrize("rules", RULES)
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("stem", SHARED_FILES)
def test_shared_config_round_trip(stem, tp, rules, shard_map_invariants):
    round_trip(shared_config(stem), tp, rules, shard_map_invariants)


@pytest.mark.parametrize("stem", SHARED_FILES)
def test_shared_config_validity_matches_hand_rules(stem):
    spec = load_spec(shared_config(stem))
    if spec.is_mla:
        pytest.skip("hand rule covers non-MLA models")
    for rules in RULES:
        for tp in TPS:
            assert (split_problem(spec, tp,
                                  rules)[0] is not None) == expected_problem(spec, tp, rules), (tp, rules)


def test_shared_configs_exercise_kv_replication_and_invalid_tps():
    """The sweep is not vacuous: some shared configs replicate KV heads, and some tp sizes are invalid."""
    if not SHARED.is_dir():
        pytest.skip("../shared is absent")
    replicated = invalid = 0
    for stem in SHARED_FILES:
        spec = load_spec(shared_config(stem))
        for tp in TPS:
            if (split_problem(spec, tp, "vllm")[0] is None and tp > spec.num_key_value_heads
                and not spec.is_mla): replicated += 1
            invalid += split_problem(spec, tp, "nano-vllm")[0] is not None
    assert replicated >= 5 and invalid >= 5, (replicated, invalid)


@pytest.mark.parametrize("rules", RULES)
@pytest.mark.parametrize("repo", sorted(presets()))
def test_preset_round_trip(repo, rules, shard_map_invariants):
    for tp in TPS:
        round_trip(repo, tp, rules, shard_map_invariants)


def _star(name: str) -> tuple[str, tuple[int, ...]]:
    """Checkpoint name with every numeric path component (layer, expert) replaced by '*', and the numbers."""
    numbers = tuple(int(n) for n in re.findall(r"(?<=\.)\d+(?=\.)", name))
    return re.sub(r"(?<=\.)\d+(?=\.)", "*", name), numbers


@pytest.mark.parametrize("stem", INDEX_FILES)
def test_checkpoint_names_match_safetensors_index(stem):
    if not SHARED.is_dir() or stem == "<shared absent>":
        pytest.skip("../shared is absent")
    index = json.loads((CONFIGS / f"{stem}.index.json").read_text(encoding="utf-8"))
    m = shard_map(shared_config(stem), 1)
    on_disk: dict[str, set] = {}
    for name in index["weight_map"]:
        if name.endswith("rotary_emb.inv_freq"):  # a buffer, not a weight
            continue
        star, numbers = _star(name)
        on_disk.setdefault(star, set()).add(numbers[0] if numbers else None)
    mapped = {t.name: t for t in m.tensors}
    assert set(mapped) == set(on_disk), (sorted(set(mapped) - set(on_disk)),
                                         sorted(set(on_disk) - set(mapped)))
    for name, layers in on_disk.items():
        if "*" in name:
            assert set(mapped[name].layers) == layers, name
        else:
            assert mapped[name].layers is None, name


def test_index_files_are_found():
    if not SHARED.is_dir():
        pytest.skip("../shared is absent")
    assert len(_index_files()) == 3 and all((CONFIGS / f"{s}.json").is_file() for s in _index_files())


def test_layout_is_read_off_the_loaders(monkeypatch):
    """Change what a real weight_loader does and the map follows: no separate formula decides the layout."""
    before = shard_map("meta-llama/Llama-3.1-8B", 8).tensor("model.layers.*.self_attn.k_proj.weight")
    assert [(p.rank, p.start) for p in before.pieces] == [(r, 128 * r) for r in range(8)]
    monkeypatch.setattr(QKVParallelLinear, "kv_shard_index", lambda self: (self.tp_rank + 1) % self.tp_size)
    after = shard_map("meta-llama/Llama-3.1-8B", 8).tensor("model.layers.*.self_attn.k_proj.weight")
    assert [(p.rank, p.start) for p in after.pieces] == [(r, 128 * ((r + 1) % 8)) for r in range(8)]


def test_invariant_checker_catches_a_broken_map(shard_map_invariants):
    """The checker used everywhere is not vacuous: drop one piece, or duplicate one, and it fails."""
    m = shard_map("Qwen/Qwen3-8B", 4)
    shard_map_invariants(m)
    q = m.tensor("model.layers.*.self_attn.q_proj.weight")
    dropped = q.pieces.pop()
    with pytest.raises(AssertionError):
        shard_map_invariants(m)
    q.pieces += [dropped, dropped]
    with pytest.raises(AssertionError):
        shard_map_invariants(m)


def test_json_round_trip_and_schema():
    m = shard_map("mistralai/Mixtral-8x7B-v0.1", 4)
    d = m.to_dict()
    assert d["schema"] == "tpviz.shardmap/4" and d["tp_size"] == 4 and d["rules"] == "vllm"
    assert d["model"]["name"] == "mistralai/Mixtral-8x7B-v0.1"
    assert json.loads(m.to_json()) == d
    assert ShardMap.from_dict(json.loads(m.to_json())).to_dict() == d
    t = d["tensors"][0]
    assert {"name", "shape", "split_dim", "param", "layer_class", "shard_id", "pieces"} <= set(t)
    assert "layers" not in t  # embed_tokens is not a per-layer tensor
    q = next(t for t in d["tensors"] if t["name"] == "model.layers.*.self_attn.q_proj.weight")
    assert q["layers"] == list(range(32)) and q["shard_id"] == "q"
    assert q["pieces"][1] == {"rank": 1, "start": 1024, "stop": 2048, "param_start": 0}
    assert {"rank", "weight_bytes", "kv_cache_bytes_per_token"} <= set(d["ranks"][0])


def test_kv_heads_are_read_from_the_loaded_k_rows_also_when_qkv_is_fused():
    chatglm = {"model_type": "chatglm", "hidden_size": 256, "num_attention_heads": 8,
               "multi_query_attention": True,
               "multi_query_group_num": 2, "kv_channels": 32, "ffn_hidden_size": 512,
               "padded_vocab_size": 1024, "num_layers": 2, "add_qkv_bias": True}
    m = shard_map(chatglm, 4)
    assert [r.kv_heads for r in m.ranks] == [[0], [0], [1], [1]]
    assert all(r.kv_cache_bytes_per_token == 2 * 1 * 32 * 2 * 2 for r in m.ranks)


def test_interleaved_traces_restore_torch_threads_and_gc():
    """App sessions are threads: trace A may end while trace B runs; B must keep 1 thread and the collector
    off, and the end restore both (a collector the caller had switched off stays off)."""
    import gc

    import torch
    from tpviz.trace.tracer import probing
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a, b = probing(), probing()
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        assert torch.get_num_threads() == 1 and not gc.isenabled()
        b.__exit__(None, None, None)
        assert torch.get_num_threads() == 2 and gc.isenabled()
        gc.disable()
        with probing():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        torch.set_num_threads(before)


@pytest.mark.parametrize("model,layout", [
    ("Qwen/Qwen3-30B-A3B", Layout(8, attn_dp=2, ep_size=8)),
    ("Qwen/Qwen3-30B-A3B", Layout(8, ep_size=2)),
    ("deepseek-ai/DeepSeek-V3", Layout(8, attn_dp=8, ep_size=4, dense_tp1=True))])
def test_sglang_expert_parallel_map_holds_each_gpus_share_of_the_experts(model, layout):
    """SGLang's --ep lives inside tp, so the map's GPUs are the layout's at pp 1: each holds its EP group's
    experts, not every one (the map once said 54.66 GiB per GPU for Qwen3-30B-A3B at --ep 8, 7.41 held)."""
    from tpviz.deploy.deployment import deploy
    spec = load_spec(model)
    m = trace(spec, layout.tp, "sglang", layout)
    held = [g.weight_bytes for g in deploy(spec, layout, "sglang").gpus]
    assert [r.weight_bytes for r in m.ranks] == held
    # without EP every expert is cut tp ways on every GPU: the same bytes as 1/ep of them cut tp/ep ways
    plain = trace(spec, layout.tp, "sglang")
    assert [r.weight_bytes_by_family["experts"] for r in m.ranks] == \
        [r.weight_bytes_by_family["experts"] for r in plain.ranks]
