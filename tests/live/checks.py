"""Helpers the live family tests share: a checkpoint's tensor shapes, and our tp=1 logits with a change."""
import torch
from safetensors import safe_open

from tpviz.live import LiveConfig, LiveForCausalLM, load_weights, prepare
from tpviz.live.worker import run_model


def saved_shapes(folder) -> dict:
    """Name -> shape (a tuple) of every tensor in folder/model.safetensors."""
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def tp1_logits(folder, ids: torch.Tensor, patch=None, edit=None) -> torch.Tensor:
    """Our tp=1 logits for ids: as loaded, with patch(job cfg dict) applied to the config first, or with
    edit(model) applied to the loaded model (to switch one feature off and show it matters)."""
    prep = prepare(folder, 1, device="cpu", input_ids=ids)
    if patch:
        patch(prep.job["cfg"])
    if edit is None:
        return run_model(prep.job, 0, 1, torch.device("cpu"))[0]
    model = LiveForCausalLM(LiveConfig.from_dict(prep.job["cfg"]))
    load_weights(model, folder)
    edit(model)
    with torch.inference_mode():
        return model(ids)[0]


def add_tokenizer(folder, vocab_size: int) -> None:
    """Save a WordLevel tokenizer.json in folder whose word 't<i>' is id i, over the model's whole vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
