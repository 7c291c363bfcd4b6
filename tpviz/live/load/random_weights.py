"""Random weights for a live run: made once from a seed, written tensor by tensor as a safetensors checkpoint
(with a config.json transformers can load), cached and pruned, and loaded by every rank like real weights."""
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

import torch

from tpviz.config.cache import cache_root
from tpviz.live.model.config import LiveConfig
from tpviz.live.model.gemma import hf_gemma_config
from tpviz.live.model.gptoss import hf_gpt_oss_config
from tpviz.live.model.mla import hf_mla_config
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors

RANDOM_FORMAT = 2  # bump when the random-weight recipe changes, so old caches are not reused
# random checkpoints kept beyond these are pruned, oldest first
CACHE_MAX_ENTRIES, CACHE_MAX_BYTES = 8, 8 << 30


def random_checkpoint(cfg: LiveConfig, seed: int = 0) -> Path:
    """Make (once) and return a safetensors checkpoint folder of seeded random weights for cfg."""
    cfg.notes.append(f"random weights (seed {seed}): no checkpoint weights were given")
    # keyed by exactly what the folder holds: the config.json it writes and every tensor's shape
    key = json.dumps([RANDOM_FORMAT, seed, hf_config(cfg), checkpoint_shapes(cfg)], sort_keys=True)
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in cfg.spec.name)[-48:]
    folder = cache_root() / "random" / f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if (folder / "model.safetensors").is_file():
        _touch(folder)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".tmp-{folder.name}-{uuid.uuid4().hex[:8]}"  # build aside, rename atomically
    tmp.mkdir()
    try:
        write_random_safetensors(cfg, seed, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(hf_config(cfg), indent=2))
        try:
            os.rename(tmp, folder)
        except OSError:  # another run made it first: keep theirs
            if not (folder / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    prune_cache(folder)
    return folder


def _touch(folder: Path) -> None:
    try:
        os.utime(folder)  # recently used: pruned last
    except OSError:
        pass


def _size(folder: Path) -> int:
    try:
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    except OSError:
        return 0


def prune_cache(keep: Path, max_entries: int = CACHE_MAX_ENTRIES, max_bytes: int = CACHE_MAX_BYTES) -> None:
    """Delete the least recently used random checkpoints beyond max_entries or max_bytes (never `keep`)."""
    try:
        entries = [p for p in keep.parent.iterdir() if p.is_dir()
                   and not p.name.startswith(".") and p != keep]
        entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)  # newest first
    except OSError:
        return
    count, total = 1, _size(keep)
    for p in entries:
        size = _size(p)
        if count + 1 > max_entries or total + size > max_bytes:
            shutil.rmtree(p, ignore_errors=True)
        else:
            count, total = count + 1, total + size


def hf_config(cfg: LiveConfig) -> dict:
    """A Hugging Face style config.json for cfg, so the random folder is a checkpoint like any other."""
    s = cfg.spec
    out = {"architectures": [s.arch.hf_class], "model_type": s.model_type,
           "hidden_size": s.hidden_size, "num_attention_heads": s.num_attention_heads,
           "num_key_value_heads": s.num_key_value_heads, "head_dim": s.head_dim,
           "intermediate_size": s.intermediate_size, "vocab_size": s.vocab_size,
           "num_hidden_layers": s.num_hidden_layers, "tie_word_embeddings": s.tie_word_embeddings,
           "attention_bias": s.attention_bias, "mlp_bias": cfg.mlp_bias,
           "rope_theta": s.rope_theta, "rms_norm_eps": s.rms_norm_eps, "hidden_act": "silu",
           "torch_dtype": "bfloat16"}
    if cfg.sliding_window:
        out["sliding_window"] = cfg.sliding_window
    # Phi-3: transformers' default pad/eos id (32000) may lie outside the vocabulary
    out.update(s.arch.hf_extra)
    windows = [layer.mixer.window for layer in s.layers if layer.mixer.kind == "sliding_attention"]
    if s.arch.live == "olmo" and windows:  # windows per layer type (OLMo-3)
        out["layer_types"] = ["sliding_attention" if layer.mixer.kind == "sliding_attention"
                              else "full_attention" for layer in s.layers]
        out["sliding_window"] = max(windows, default=4096)
        if cfg.local_rope is not None:  # and RoPE per layer type, as transformers 5 writes it
            ropes = {"full_attention": cfg.rope or {"rope_theta": s.rope_theta},
                     "sliding_attention": cfg.local_rope}
            out["rope_parameters"] = {kind: {"rope_type": "default",
                                             **{k: v for k, v in p.items() if k != "rotary_dim"}}
                                      for kind, p in ropes.items()}
    # soft-caps, query_pre_attn_scalar, layer types, RoPE per layer type (Gemma-3)
    if s.arch.live in ("gemma2", "gemma3"):
        out.update(hf_gemma_config(cfg))
    # both families read num_experts_per_tok; Qwen3-MoE's dense layers come back as mlp_only_layers
    if s.is_moe:
        out.update(num_experts_per_tok=s.num_experts_per_tok, norm_topk_prob=cfg.norm_topk_prob)
        if s.arch.routing == "fp32":  # Mixtral
            out.update(num_local_experts=s.num_experts, intermediate_size=s.moe_intermediate_size)
        elif not s.is_mla:  # Qwen-MoE; DeepSeek's fields: hf_mla_config
            out.update(num_experts=s.num_experts, moe_intermediate_size=s.moe_intermediate_size,
                       decoder_sparse_step=1, mlp_only_layers=s.dense_layers,
                       shared_expert_intermediate_size=s.shared_expert_intermediate_size)
    if s.is_mla:  # DeepSeek: MLA dims, RoPE (YaRN), first_k_dense_replace, routing
        out.update(hf_mla_config(cfg))
    if s.arch.live == "gpt_oss":  # experts, layer types, SwiGLU clamp, RoPE (YaRN); written unquantized
        out = {k: v for k, v in out.items() if k not in ("num_experts",
                                                         "moe_intermediate_size", "mlp_only_layers",
                                                        "decoder_sparse_step",
                                                         "shared_expert_intermediate_size")}
        out.update(hf_gpt_oss_config(cfg))
    return out


def checkpoint_shapes(cfg: LiveConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint the plan maps for cfg (unquantized: random weights are bf16), with its
    shape on disk: the same list the explorer draws and Run live loads (tpviz.plan.tensors)."""
    spec = replace(cfg.spec, quant=None, quantization="")
    return {t.name: tuple(t.shape) for t in tensors(build_plan(spec, cfg.rules))}


def iter_random_tensors(cfg: LiveConfig, seed: int):
    """Seeded bf16 weights, one (name, tensor) at a time: N(0, 0.02) matrices, norms 1 + N(0, 0.1) (Gemma's
    stored offsets, which scale by 1 + w: N(0, 0.1)), biases N(0, 0.1) (nothing trivial)."""
    gen = torch.Generator().manual_seed(seed)
    offset = 0 if cfg.spec.arch.live in ("gemma2", "gemma3") else 1
    for name, shape in checkpoint_shapes(cfg).items():
        t = torch.randn(shape, generator=gen)
        if name.endswith("norm.weight"):
            t = offset + 0.1 * t
        else:
            t *= 0.1 if name.endswith(".bias") else 0.02
        yield name, t.to(torch.bfloat16)
        del t


def random_tensors(cfg: LiveConfig, seed: int) -> dict[str, torch.Tensor]:
    """All of iter_random_tensors in one dict (small models and tests)."""
    return dict(iter_random_tensors(cfg, seed))


def write_random_safetensors(cfg: LiveConfig, seed: int, path: Path) -> None:
    """Write the seeded bf16 weights as one safetensors file, a tensor at a time (the shapes give the
    header)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in checkpoint_shapes(cfg).items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, t in iter_random_tensors(cfg, seed):
            f.write(t.contiguous().view(torch.uint8).numpy().data)
