"""Every special-case sentence agrees with the map it describes, for every preset at every tp it splits by
(1 to 64): vocab padding from the embedding and lm_head rows, allocation padding from the other tensors,
replicated KV heads from the k_proj pieces each GPU holds, row-parallel biases from the layer classes."""
import re

import pytest

from tpviz import shard_map
from tpviz.config.sources import presets
from tpviz.errors import TpvizError
from tpviz.render import summary as S

TPS = (1, 2, 3, 4, 6, 8, 16, 32, 64)


def maps():
    for name in presets():
        for tp in TPS:
            try:
                yield name, tp, shard_map(name, tp)
            except TpvizError:  # a tp the model does not split by: no sentence to check
                continue


def kv_holders(m) -> dict[int, set[int]]:
    """KV head -> the GPUs whose k rows hold it, read off the k_proj (or fused qkv) pieces."""
    spec, out = m.model, {}
    k = next((t for t in m.tensors if t.family == "qkv" and t.name.endswith("k_proj.weight")), None)
    if k is None or spec.is_mla:
        return out
    for p in k.pieces:
        for h in range(p.start // spec.head_dim, -(-p.stop // spec.head_dim)):
            out.setdefault(h, set()).add(p.rank)
    return out


@pytest.mark.slow
def test_every_sentence_agrees_with_its_map():
    checked = 0
    for name, tp, m in maps():
        cases, where = S.special_cases(m), f"{name} tp={tp}"
        # vocab padding: the embedding's / lm_head's rows per GPU times tp beyond the vocabulary
        vocab = [p for p in m.params if p.family in ("embed", "lm_head") and p.split_dim == 0]
        padded = {p.local_shapes[0][0] * tp for p in vocab if p.local_shapes[0][0] * tp > m.model.vocab_size}
        if padded:
            assert cases["padding"] and f"{m.model.vocab_size} → {padded.pop()}" in cases["padding"], where
        else:
            assert cases["padding"] is None, (where, cases["padding"])
        # allocation padding: any other split tensor allocating rows it does not load
        other = [p for p in m.params if p.family not in ("embed", "lm_head") and p.split_dim is not None
                 and any(p.padding)]
        assert (cases["allocation"] is not None) == bool(other), where
        for p in other:
            assert S.short_name(p.name) in cases["allocation"], where
        # replicated KV heads: more GPUs than KV heads (read off the k_proj pieces where k is its own tensor)
        kv, holders = m.model.num_key_value_heads, kv_holders(m)
        kvs = {g.mixer.get("kv_heads") for g in m.groups if g.mixer.get("kv_heads")}
        attends = any(t.family == "qkv" for t in m.tensors) and not m.model.is_mla
        kv = min(kvs) if kvs else kv  # the layers' own (DeciLM's config-level count is not used)
        if len(kvs) > 1:  # per-layer KV heads: the sentence speaks of the first group's
            holders = {}
        if holders:
            assert (max(len(r) for r in holders.values()) > 1) == (tp > kv), where
        if attends and tp > kv:  # the sentence names a group whose heads are copied, with its counts
            line = cases["kv"]
            assert line and any(f"{n} KV head{'s' if n != 1 else ''} on {tp} GPUs" in line
                                and f"KV head to {tp // n} GPUs" in line for n in kvs or {kv} if n < tp), (
                where, line)
        else:
            assert cases["kv"] is None, (where, cases["kv"])
        # row-parallel biases: named exactly, held by all
        biases = [p for p in m.params if p.layer_class == "RowParallelLinear" and p.split_dim is None
                  and p.name.endswith(".bias")]
        if biases:
            named = re.findall(r"[\w.*]+\.bias", cases["bias"])
            # a tower's keep their prefix (Llama-4's vision o_proj.bias is not the decoder's)
            assert set(named) == {p.name if p.tower else S.short_name(p.name) for p in biases}, where
            assert f"all {tp} GPUs" in cases["bias"], where
        else:
            assert cases["bias"] is None, where
        checked += 1
    assert checked > 100  # every preset, most at several tp sizes
