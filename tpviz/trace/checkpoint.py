"""A real checkpoint's tensor list (safetensors headers or index, no tensor data read), and how it compares
with a shard map: what the map lacks and what the checkpoint lacks. This is what keeps a map honest."""
import json
import re
import struct
from pathlib import Path

from tpviz.errors import SourceError
from tpviz.plan import arch_names
from tpviz.plan.tensors import fill
from tpviz.trace.shardmap import ShardMap

INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER = 100_000_000  # a safetensors header is JSON; real ones are far below this
# tensors a checkpoint may hold that no TP layer loads: rotary caches (the four vLLM 0.33's AutoWeightsLoader
# drops, GLM's rotary_pos_emb among them), attention-mask buffers, MTP heads
IGNORED = re.compile(r"(rotary_emb\.inv_freq|rotary_pos_emb\.inv_freq|rotary_emb\.(cos|sin)_cached"
                     r"|\.attn\.bias$|\.attn\.masked_bias$|attention\.bias$|attention\.masked_bias$"
                     r"|^mtp\.|\.mtp\.)")
# quantized storage that tpviz maps as its unquantized tensor (quantization is modelled separately)
QUANT_SUFFIXES = ("_scale_inv", "_scale", "weight_scale_2", "input_scale", ".qweight", ".qzeros",
                  ".scales", ".g_idx",
                  "_blocks", "_scales", "weight_packed", "weight_shape", "weight_zero_point")
VISION = ("vision_tower.", "visual.", "vision_model.", "multi_modal_projector.", "audio_tower.",
          "embed_vision.", "embed_audio.", "vision_", "mm_projector.",
          "vit_downsampler", "vit_large_projector")  # Step-3's projector


def read_header(path: Path) -> dict:
    """The JSON header of one safetensors file: {name: {dtype, shape, data_offsets}} (no tensor data read)."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > MAX_HEADER:
                raise SourceError(f"{path.name} is not a safetensors file (header of {size} bytes)")
            header = json.loads(f.read(size))
    except (OSError, struct.error, ValueError, RecursionError) as e:
        raise SourceError(f"cannot read the safetensors header of {path.name}: {e}") from None
    if not isinstance(header, dict):
        raise SourceError(f"{path.name} is not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    return header


def local_tensor_bytes(folder: Path) -> dict[str, int] | None:
    """Stored bytes of every tensor in a local checkpoint's safetensors headers (the index's shards, or
    model.safetensors); None when a shard is missing here (an index alone says nothing of dtypes)."""
    index = folder / INDEX_FILE
    files = [folder / "model.safetensors"]
    if index.is_file():
        names = local_tensor_names(folder)
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({folder / str(weight_map[n]) for n in names})
    if not all(f.is_file() and f.resolve().parent == folder.resolve() for f in files):
        return None
    out = {}
    for f in files:
        for name, info in read_header(f).items():
            offsets = info.get("data_offsets") if isinstance(info, dict) else None
            if isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets):
                out[name] = offsets[1] - offsets[0]
    return out


def index_weight_map(index: Path, error: type[Exception] = SourceError) -> dict:
    """A model.safetensors.index.json's weight_map (tensor name -> file), or one line naming what is wrong."""
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise error(f"{index} is not a valid safetensors index ({str(e).splitlines()[0][:200]})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise error(f"{index} is not a valid safetensors index: it needs a weight_map object "
                    "(tensor name -> file)")
    return weight_map


def local_tensor_names(folder: Path) -> set[str] | None:
    """The tensor names of a local checkpoint folder: its index, else its safetensors headers; None without
    weights."""
    index = folder / INDEX_FILE
    if index.is_file():
        return set(index_weight_map(index))
    single = folder / "model.safetensors"  # as transformers picks: the index's shards, else this one file
    return set(read_header(single)) if single.is_file() else None


def expand(m: ShardMap) -> dict[str, str]:
    """Every concrete checkpoint name the map has ('*' filled with layer and expert indices) -> its map
    name."""
    return {name: t.name for t in m.tensors for name in _concrete(t)}


def _concrete(t) -> list[str]:
    """A tensor map's concrete checkpoint names: '*' filled with its layers (or blocks), then its experts (or
    both with where each layer's copy is stored)."""
    if t.stored_at:
        return [fill(t.name, a, b) for a, b in t.stored_at]
    layers = t.layers if t.layers is not None else range(t.blocks) if t.blocks else [None]
    experts = t.experts if t.experts and t.name.count("*") > 1 else [None]
    names = [t.name if i is None else t.name.replace("*", str(i), 1) for i in layers]
    return [name if e is None else name.replace("*", str(e), 1) for name in names for e in experts]


def _prefix(map_names: set[str], names: set[str]) -> tuple[str, str]:
    """(prefix to drop, prefix to add) that lines the checkpoint's names up with the map's
    (multimodal wrappers store the decoder under language_model.*, some files drop 'transformer.')."""
    best, best_hits = ("", ""), len(map_names & names)
    drops = {n[:n.index(s)] for n in names for s in ("layers.", "h.", "embed") if s in n}
    drops |= {n[:n.index(".") + 1] for n in names if "." in n}  # a wrapper's own: llm., language.
    for drop in sorted(drops, key=len)[:32]:
        for add in ("", "model.", "transformer."):
            hits = sum(1 for n in names if n.startswith(drop) and add + n[len(drop):] in map_names)
            if hits > best_hits:
                best, best_hits = (drop, add), hits
    return best


def _beyond(name: str, num_layers: int) -> bool:
    """A layer past the decoder's (DeepSeek's MTP layer 61): vLLM loads it only for speculative decoding."""
    match = re.search(r"layers\.(\d+)\.", name)
    return bool(match) and int(match.group(1)) >= num_layers


def _patterns(names: list[str], most: int = 6) -> list[str]:
    """Names with their numbers collapsed to '*', most frequent first; past `most`, one "and N more" entry."""
    counts: dict[str, int] = {}
    for n in names:
        key = re.sub(r"\.\d+\.", ".*.", re.sub(r"\.\d+\.", ".*.", n))
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    shown = [f"{k} ({v})" if v > 1 else k for k, v in ranked[:most]]
    if rest := ranked[most:]:
        shown.append(f"and {len(rest)} more kind{'s' * (len(rest) > 1)} ({sum(v for _, v in rest)} tensors)")
    return shown


def expected_bytes(m: ShardMap) -> dict[str, int]:
    """Concrete checkpoint name -> the bytes it stores, as the map sizes it (one '*' name may hold two shapes
    in different layers: Kimi-Linear's self_attn.q_proj in its KDA and its MLA layers)."""
    params = {(p.name, tuple(p.layers or ())): p for p in m.params}
    out = {}
    for t in m.tensors:
        p = params[(t.param, tuple(t.layers or ()))]
        n = 1
        for d in t.shape:
            n *= d
        # gpt-oss: all experts in one tensor
        stacked = len(t.experts) if t.experts and t.name.count("*") < 2 else 1
        out.update(dict.fromkeys(_concrete(t), n * stacked * (p.element_bytes or m.model_dtype_bytes)))
    return out


def dropped_at_load(m: ShardMap) -> set[str]:
    """Checkpoint tensors vLLM 0.33 reads and drops: the k_proj, v_proj and k_norm a Gemma-4 checkpoint still
    ships for its KV-shared layers (gemma4.py's weights mapper maps them to nothing), a vision tower's blocks
    past vision_feature_layer and CLIP's post_layernorm in LLaVA (llava.py builds neither)."""
    names, t = arch_names(m.model), m.model.tower
    shared = {f"{names.layer.replace('*', str(i))}{names.attn}{part}{suffix}"
              for i, layer in enumerate(m.model.layers) if layer.mixer.kv_shared
              for part, suffix in ((names.k, ".weight"), (names.v, ".weight"), (names.k_norm, ".weight"))}
    if t is None:
        return shared
    # a tower's blocks past vision_feature_layer, which its loader skips, and the names its mapper drops
    skipped = {x.name.replace("*", str(i), 1) for x in m.tensors if x.tower and x.name.startswith(t.blocks)
               for i in range(t.depth, t.stored)}
    return shared | skipped | set(t.dropped)


def compare(m: ShardMap, names: set[str], source: str, sizes: dict[str, int] | None = None) -> dict:
    """What the map has that the checkpoint lacks, and the other way round (as '*' patterns with counts);
    with the headers' sizes, also the tensors whose stored bytes differ from the map's."""
    mapped = expand(m)
    # a modelled tower's names in either layout ("visual." before transformers 4.52, "model.visual." after)
    towers = tuple(p for t in (m.model.tower, m.model.audio) if t for p in t.prefixes)
    # the decoder's prefix, read off the names outside the tower (a tower can outnumber them: MiniCPM-V)
    drop, add = _prefix(set(mapped), {n for n in names if not any(n.startswith(t) or f".{t}" in n
                                                                   for t in towers)})
    seen, extra, quant, tied, dropped = set(), [], [], [], []
    unloaded = dropped_at_load(m)
    layers = m.model.num_hidden_layers
    # tied: vLLM allocates one matrix, and a stored lm_head (Falcon-180B's) loads onto the embedding's
    head = arch_names(m.model).lm_head if m.model.tie_word_embeddings else None
    for n in names:
        if n.startswith(m.model.arch.unloaded):  # parts vLLM does not build (Qwen2.5-Omni's talker)
            dropped.append(n)
            continue
        if tower := next((t for t in towers if n.startswith(t) or f".{t}" in n), None):
            key = n[n.index(tower):]
            (seen.add(key) if key in mapped else dropped.append(n) if key in unloaded else extra.append(n))
            continue
        if (IGNORED.search(n) or n.startswith(VISION) or any(f".{v}" in n for v in VISION)
            or _beyond(n, layers)): continue
        key = add + n[len(drop):] if n.startswith(drop) else n
        if key == head:
            tied.append(n)
            continue
        # the old multimodal layout keeps lm_head beside the decoder: language_model.lm_head
        if key not in mapped:
            key = next((k for k in (n.split("language_model.", 1)[-1], key) if k in mapped), key)
        if key in mapped:
            seen.add(key)
        elif key in unloaded:
            dropped.append(n)
        elif key.endswith(QUANT_SUFFIXES):
            quant.append(n)
            base = re.sub(r"(_blocks|_scales|\.qweight|\.weight_packed)$", lambda mm: ".weight" if mm.group(1)
                          in (".qweight", ".weight_packed") else "", key)
            if base in mapped:
                seen.add(base)
        else:
            extra.append(n)
    missing = sorted(set(mapped) - seen)
    differ = []
    if sizes:
        want = expected_bytes(m)
        for n, size in sizes.items():
            tower = next((t for t in towers if n.startswith(t) or f".{t}" in n), None)
            key = n[n.index(tower):] if tower else add + n[len(drop):] if n.startswith(drop) else n
            if key in mapped and key in seen and size != want[key]:
                differ.append(f"{n} (checkpoint {size} bytes, map {want[key]})")
    return {"source": source, "tensors": len(names), "matched": len(seen), "prefix": drop,
            "missing_in_checkpoint": _patterns(missing), "missing_in_map": _patterns(extra),
            "quantization_tensors": len(quant), "verified": not missing and not extra,
            **({"tied_lm_head": True} if tied else {}),
            **({"dropped_at_load": _patterns(dropped), "dropped": len(dropped)} if dropped else {}),
            # stored bytes (from the headers) against the map's: a float32 file of a model served in bf16
            # differs
            "bytes": {"checked": sizes is not None, "differ": sorted(differ)[:6], "count": len(differ)}}


def dropped_sentence(check: dict) -> str:
    return (f"{check['dropped']} more are dropped by vLLM at load ({', '.join(check['dropped_at_load'])}): "
            "KV-shared layers attend over an earlier layer's cache")


def checkpoint_sentence(check: dict) -> str:
    """One line on the comparison, for the CLI and the app."""
    sizes = check.get("bytes") or {}
    if check["verified"] and not sizes.get("count"):
        what = "tensors" if sizes.get("checked") else "tensor names"  # an index alone has names, no shapes
        return (f"Checkpoint check: all {check['matched']} {what} of {check['source']} match the map"
                + (", byte for byte" if sizes.get("checked") else "")
                + (f" (plus {check['quantization_tensors']} quantization tensors)"
                   if check["quantization_tensors"] else "")
                + ("; its lm_head.weight is stored, but the embeddings are tied, so it loads onto the "
                   "embedding's one matrix" if check.get("tied_lm_head") else "")
                + (f"; {dropped_sentence(check)}" if check.get("dropped") else "") + ".")
    parts = []
    if sizes.get("count"):
        parts.append(f"{sizes['count']} tensors are stored in other sizes than the map counts, e.g. "
                     + sizes["differ"][0])
    if check["missing_in_checkpoint"]:
        parts.append("the checkpoint lacks " + ", ".join(check["missing_in_checkpoint"]))
    if check["missing_in_map"]:
        parts.append("the map lacks " + ", ".join(check["missing_in_map"]))
    if check.get("dropped"):
        parts.append(dropped_sentence(check))
    return f"Checkpoint check against {check['source']}: " + "; ".join(parts) + "."
