"""Helpers the live family tests share: a checkpoint's tensor shapes, our tp=1 logits (with a change), and the
two checks every family makes against transformers."""
from dataclasses import replace

import torch
from safetensors import safe_open

from tpviz.live import LiveConfig, LiveForCausalLM, load_weights, prepare, resolve_model
from tpviz.config.sources import load_spec
from tpviz.live.load.targets import LoadingMap
from tpviz.live.run.worker import run_model


def saved_shapes(folder) -> dict:
    """Name -> shape (a tuple) of every tensor in folder/model.safetensors."""
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def tp1_matches(folder, expected: torch.Tensor, ids: torch.Tensor):
    """Our tp=1 float32 run of folder within 1e-4 of transformers' logits; returns (prep, the rank's
    report)."""
    prep = prepare(folder, 1, device="cpu", input_ids=ids)
    logits, _, report = run_model(prep.job, 0, 1, torch.device("cpu"))
    assert (logits - expected).abs().max() < 1e-4
    return prep, report


def random_round_trip(config, ids: torch.Tensor, seed: int = 0):
    """Seeded random weights for config.json are a checkpoint transformers loads as it is, and it agrees with
    our tp=1 run within 1e-4; returns (the ModelSource, transformers' model)."""
    from transformers import AutoModelForCausalLM
    source = resolve_model(config, seed=seed, random_weights=True)
    assert source.random_weights
    hf_model = AutoModelForCausalLM.from_pretrained(source.checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf_model(ids).logits
    assert (tp1_logits(source.checkpoint, ids) - expected).abs().max() < 1e-4
    return source, hf_model


def tp1_logits(folder, ids: torch.Tensor, patch=None, edit=None) -> torch.Tensor:
    """Our tp=1 logits for ids: as loaded, with patch(job cfg dict) applied to the config first, or with
    edit(model) applied to the loaded model (to switch one feature off and show it matters)."""
    job = prepare(folder, 1, device="cpu", input_ids=ids).job
    if patch:  # on the config as a dict, as the ranks used to receive it
        cfg = job.cfg.to_dict()
        patch(cfg)
        job = replace(job, cfg=LiveConfig.from_dict(cfg))
    if edit is None:
        return run_model(job, 0, 1, torch.device("cpu"))[0]
    model = LiveForCausalLM(job.cfg)
    load_weights(model, folder)
    edit(model)
    with torch.inference_mode():
        return model(ids)[0]


def add_tokenizer(folder, vocab_size: int) -> None:
    """Save a WordLevel tokenizer.json in folder whose word 't<i>' is id i, over the model's whole
    vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def loading_map(source, layers: int | None = None) -> LoadingMap:
    """The plan-derived loading map of a model source (a folder, config or preset), shrunk to `layers`."""
    spec = load_spec(source)
    return LoadingMap(spec.first_layers(layers) if layers else spec)
