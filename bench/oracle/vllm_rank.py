"""One rank of bench/vllm_oracle.py: vLLM 0.33 builds each case's model class at this rank and reports its
parameters and what its load_weights makes of the checkpoint tensors tpviz names. Imports vLLM, never tpviz.

Run by the oracle (VLLM_TARGET_DEVICE=cpu, one process per rank), not by hand:
    python bench/oracle/vllm_rank.py --rank R --tp N --port P --job JOB.json   (writes rankR.json beside it)
"""
import argparse
import json
from pathlib import Path

import torch

# vLLM's CUDA wheel has no CPU `_C` library; its activation layers only look these ops up when built (they
# never run here), so they are declared, without a kernel, where vLLM lacks them
ACTIVATION_OPS = ("gelu_new", "gelu_fast", "gelu_quick", "gelu_tanh", "gelu_and_mul", "gelu_tanh_and_mul",
                  "silu_and_mul", "mul_and_silu", "fatrelu_and_mul", "swigluoai_and_mul", "relu_squared",
                  "relu2_no_mul", "swiglustep_and_mul", "silu_and_mul_with_clamp", "situ_and_mul")
# a class that reads a tensor while built fails on the meta device (Bloom's ALiBi slopes; Gemma-3n's sparse
# activation, whose Gaussian cutoff it computes with .item())
META_FAILURES = ("Cannot copy out of meta tensor", "cannot be called on meta tensors")


def declare_missing_ops() -> object:
    """Declare the activation ops vLLM's `_C` lacks on this machine; the library must stay alive."""
    lib = torch.library.Library("_C", "FRAGMENT")
    for op in ACTIVATION_OPS:
        if not hasattr(torch.ops._C, op):
            lib.define(f"{op}(Tensor(a!) out, Tensor input) -> ()")
    return lib


class NoTokenizer:
    """What a model class that asks for its tokenizer while built gets here (DeepSeek-OCR reads its image
    token's id): every token is id 0. The oracle builds with skip_tokenizer_init; no weight depends on it."""
    vocab: dict = {}

    def __init__(self):
        self.vocab = type("AnyToken", (dict,), {"__missing__": lambda self, key: 0})()


def tokenizer_free() -> None:
    """Before any model file is imported: the tokenizer lookup answers NoTokenizer."""
    import vllm.tokenizers
    vllm.tokenizers.cached_tokenizer_from_config = lambda *args, **kwargs: NoTokenizer()


def why(e: Exception) -> str:
    """An exception in one line."""
    return f"{type(e).__name__}: {' | '.join(str(e).split(chr(10)))[:400]}"


def build(case_dir: Path, config: dict, tp: int, ckpt: list):
    """vLLM's model class for this config, built as its default loader builds it, on the meta device (no
    memory); a class that reads its own tensors while built (Bloom's ALiBi slopes, Kimi-K2.5's tower moved to
    its device, Gemma-3n's sparse activation) is built on the CPU instead. A config that says tied beside a
    checkpoint with an lm_head is untied first, as ModelConfig.maybe_untie_word_embeddings does for a real
    checkpoint (the dummy format skips it)."""
    from vllm.config import LoadConfig, ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    case_dir.mkdir(parents=True)
    (case_dir / "config.json").write_text(json.dumps(config))

    def configs():  # a fresh one per try: a failed build leaves its attention layers registered in it
        mc = ModelConfig(model=str(case_dir), skip_tokenizer_init=True, dtype="bfloat16")
        vc = VllmConfig(model_config=mc, load_config=LoadConfig(load_format="dummy"),
                        parallel_config=ParallelConfig(tensor_parallel_size=tp))
        if getattr(mc.hf_config, "tie_word_embeddings", False) and any(n.endswith("lm_head.weight")
                                                                       for n, *_ in ckpt):
            mc.hf_config.tie_word_embeddings = mc.hf_config.get_text_config().tie_word_embeddings = False
        return mc, vc

    mc, vc = configs()
    try:
        with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype), torch.device("meta"):
            return initialize_model(vllm_config=vc), vc
    except (NotImplementedError, RuntimeError) as e:
        if not any(f in str(e) for f in META_FAILURES):
            raise
    mc, vc = configs()
    with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype), torch.device("cpu"):
        return initialize_model(vllm_config=vc), vc


def kind(module) -> str | None:
    """How a linear or vocabulary layer cuts its weight: column (gathered when gather_output), row (its input
    cut here when not input_is_parallel), replicated (a layer built with tp 1, disable_tp), vocab; None for
    any other module."""
    names = [c.__name__ for c in type(module).__mro__]
    if getattr(module, "tp_size", None) == 1 or "ReplicatedLinear" in names:
        return "replicated" if any(n.endswith(("Linear", "Embedding")) for n in names) else None
    if "VocabParallelEmbedding" in names:
        return "vocab"
    if "RowParallelLinear" in names:
        return "row" if module.input_is_parallel else "row, input cut here"
    if "ColumnParallelLinear" in names:
        return "column, gathered" if module.gather_output else "column"
    return None


def report(model, vc, ckpt: list) -> dict:
    """The model's parameters and buffers, then what its load_weights makes of the checkpoint tensors tpviz
    names: in one pass (the loader's own path), then one by one (which parameters each loads into, which it
    rejects, which it takes nothing from)."""
    from vllm.config import set_current_vllm_config
    # a wrapper whose mapper takes the decoder's own names (DeepSeek-OCR's model.layers.) is fed them as is
    mapper = getattr(type(model), "hf_to_vllm_mapper", None)
    own = "model.layers." in (getattr(mapper, "orig_to_new_prefix", None) or {})
    wrapped = not own and any(n.startswith("language_model.") for n, _ in model.named_parameters())

    # a tower tpviz names without the model. its checkpoint stores (MiniCPM-V 4.6's model.vision_tower.),
    # where the class has no such module and its mapper takes only the stored name
    tops = {n.split(".")[0] for n, _ in model.named_parameters()}
    stored = [p for p in (getattr(mapper, "orig_to_new_prefix", None) or {})  # not a bare "model." (OCR's)
              if p.startswith("model.") and p != "model."]

    def vllm_name(n: str) -> str:  # the old multimodal layout, which every wrapper's mapper keeps as is
        if wrapped and n.startswith(("model.", "lm_head.")):
            return f"language_model.{n}"
        if n.split(".")[0] not in tops and any(f"model.{n}".startswith(p) for p in stored):
            return f"model.{n}"
        return n

    def weights(only=None):
        # untouched CPU memory: a loader may copy into a parameter built on the CPU (norms, GDN's), and
        # copying into a meta parameter reads nothing
        for n, shape, dt, _ in ckpt if only is None else [only]:
            yield vllm_name(n), torch.empty(shape, dtype=getattr(torch, dt))

    params = {n: [list(p.shape), p.element_size()] for n, p in model.named_parameters()}
    result = {"params": params, "buffers": {n: [list(b.shape), b.element_size()] for n, b in
                                            model.named_buffers()},
              "loads": {}, "load_error": "", "rejected": [], "unloaded": [], "ignored": []}
    done: set[str] = set()
    with set_current_vllm_config(vc):
        try:
            done = set(model.load_weights(weights()))
        except Exception as e:
            result["load_error"] = why(e)
        for one in ckpt:
            try:
                got = model.load_weights(weights(one))
            except Exception as e:
                result["rejected"].append(f"{vllm_name(one[0])}: {why(e)}")
                continue
            done |= set(got)
            result["loads"][one[0]] = sorted(got)
            if not got:
                result["ignored"].append(vllm_name(one[0]))
    # a parameter load_weights registers when the checkpoint has it (the Transformers backend's lm_head bias)
    result["params"] = {n: [list(p.shape), p.element_size()] for n, p in model.named_parameters()}
    result["unloaded"] = sorted(set(params) - done)
    # a row layer's bias is whole on every rank (rank 0 adds it)
    result["kinds"] = {f"{m}.{p}" if m else p: "replicated" if k.startswith("row") and p == "bias" else k
                       for m, module in model.named_modules() if (k := kind(module))
                       for p, _ in module.named_parameters(recurse=False)}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--rank", "--tp", "--port"):
        ap.add_argument(flag, type=int, required=True)
    ap.add_argument("--job", type=Path, required=True)
    args = ap.parse_args()
    # vLLM is imported where it is used, so that --help answers without its start-up
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    ops = declare_missing_ops()
    tokenizer_free()
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(args.tp, args.rank, f"tcp://127.0.0.1:{args.port}", args.rank,
                                     backend="gloo")
        initialize_model_parallel(args.tp)
    out = {}
    for case, c in json.loads(args.job.read_text()).items():
        try:
            model, vc = build(args.job.parent / f"{case}-rank{args.rank}", c["config"], args.tp,
                              c["tensors"])
        except Exception as e:  # vLLM refuses this config at this tp: the oracle's answer
            out[case] = {"refused": why(e)}
            continue
        out[case] = report(model, vc, c["tensors"])
        del model
    (args.job.parent / f"rank{args.rank}.json").write_text(json.dumps(out))
    del ops


if __name__ == "__main__":
    main()
