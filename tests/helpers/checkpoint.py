"""A tiny Llama config, the checkpoint tensor names of its map, and safetensors folders holding (some of)
them."""
import json

import torch
from safetensors.torch import save_file

TINY = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 128, "num_hidden_layers": 2}
LINEARS = [f"model.layers.{i}.{p}" for i in range(2) for p in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
NAMES = {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} | {n + ".weight"
                                                                                for n in LINEARS} | {
    f"model.layers.{i}.{n}_layernorm.weight" for i in range(2) for n in ("input", "post_attention")}


def save(path, names):
    save_file({n: torch.zeros(2) for n in sorted(names)}, str(path))


def folder(tmp_path, names=NAMES, cfg=TINY, fname="model.safetensors", sub="ckpt"):
    f = tmp_path / sub
    f.mkdir(exist_ok=True)
    (f / "config.json").write_text(json.dumps(cfg))
    if names is not None:
        save(f / fname, names)
    return f


def names_only(c: dict) -> dict:
    """The name comparison (the stored-bytes part is tested on its own: these files hold dummy data)."""
    return {k: v for k, v in c.items() if k != "bytes"}


def check(f, **changes):
    """The checkpoint report of folder f when every tensor matches, with `changes` applied."""
    return {"source": str(f.resolve()), "tensors": len(NAMES), "matched": len(NAMES), "prefix": "",
            "missing_in_checkpoint": [], "missing_in_map": [], "quantization_tensors": 0,
            "verified": True, **changes}


def written_shapes(model, folder) -> dict[str, tuple]:
    """Save a (tiny, random) transformers model with its own writer, then read back every tensor's name and
    shape: the checkpoint layout a map must name."""
    from safetensors import safe_open
    model.save_pretrained(folder)
    shapes = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return shapes
