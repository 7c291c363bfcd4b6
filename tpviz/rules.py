"""The rule sets: vLLM as released (replicate KV heads, pad the vocab, its quantization checks), an older
vLLM whose FP8 MoE check had no fallback yet, and nano-vllm (everything must divide)."""
from tpviz.errors import TPSizeError, TpvizError

RULES = ("vllm", "vllm-0.28", "nano-vllm")
ENGINE = {"vllm": "vLLM 0.33", "vllm-0.28": "vLLM 0.28", "nano-vllm": "nano-vllm"}
# what changed between the rule sets, for the UI, the CLI and the JSON
RULE_NOTES = {
    "vllm": "vLLM 0.33.0: KV heads replicated past their count, vocab padded to 64; FP8 MoE slices that miss the "
            "128 block use smaller scale blocks (since 0.29, Triton MoE kernel only); merged layers skip the "
            "create-time block check (since 0.14) but still cannot load misaligned scales.",
    "vllm-0.28": "vLLM 0.28.0 (0.14 to 0.28): as 0.33, except that an FP8 MoE slice that misses the 128 block "
                 "is refused (the 'gate's and up's weight = 192' reports).",
    "nano-vllm": "nano-vllm: every split must divide; no KV-head replication, no vocab padding.",
}
MAX_TP = 1024  # far beyond any deployment; keeps a typo from tracing a billion ranks
VOCAB_PADDING = 64  # vLLM pads the vocabulary to a multiple of this before splitting it
NANO_MAX_TP = 8  # nano-vllm's engine: Config asserts 1 <= tensor_parallel_size <= 8 (one node)
# nano-vllm's ModelRunner builds Qwen3ForCausalLM whatever the checkpoint (engine/model_runner.py)
NANO_ENGINE_ONLY = ("nano-vllm's engine builds Qwen3ForCausalLM only, so for {model_type} this shows its layer "
                    "classes' rules, not a model it can serve")


def engine_tp_warnings(tp_size, rules: str) -> list[str]:
    """What the engine behind `rules` would not start at this tp, though its layer classes split it."""
    if check_rules(rules) == "nano-vllm" and isinstance(tp_size, int) and tp_size > NANO_MAX_TP:
        return [f"nano-vllm's engine runs at most {NANO_MAX_TP} GPUs (its Config asserts tensor_parallel_size "
                f"<= {NANO_MAX_TP}); its layer classes split like this at any tp"]
    return []


def engine_notes(model_type: str, rules: str) -> list[str]:
    """What the engine behind `rules` would not run about this model at all, as warnings (one line each)."""
    if check_rules(rules) == "nano-vllm" and model_type != "qwen3":
        return [NANO_ENGINE_ONLY.format(model_type=model_type or "this model")]
    return []


def check_rules(rules: str) -> str:
    """Return rules if it names a known rule set, else raise."""
    if rules not in RULES:
        raise TpvizError(f"unknown rules {rules!r}; use one of: {', '.join(RULES)}")
    return rules


def check_tp(tp_size, tp_rank: int = 0) -> None:
    """tp_size must be a positive int and tp_rank one of its ranks."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise TPSizeError(f"tp_size={tp_size!r} must be a positive integer")
    if tp_size > MAX_TP:
        raise TPSizeError(f"tp_size={tp_size} is larger than {MAX_TP}; use a tp size a deployment could have")
    if isinstance(tp_rank, bool) or not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size:
        raise TPSizeError(f"tp_rank={tp_rank!r} must be in 0..{tp_size - 1} for tp_size={tp_size}")


def divide(numerator: int, denominator: int, what: str = "size", generic: bool = False) -> int:
    """numerator // denominator, raising a TPSizeError naming `what` when it does not divide; generic: `what`
    is a layer's own size name, which the tracer replaces with the config key behind it."""
    if numerator % denominator:
        raise TPSizeError(f"{what}={numerator} is not divisible by tp_size={denominator}", what, numerator, denominator,
                          generic)
    return numerator // denominator


def kv_split(total_num_kv_heads: int, tp_size: int, rules: str = "vllm") -> tuple[int, int]:
    """(KV heads per rank, ranks sharing each KV head). vLLM replicates when tp_size is a multiple."""
    if total_num_kv_heads % tp_size == 0:
        return total_num_kv_heads // tp_size, 1
    head = f"num_key_value_heads={total_num_kv_heads} is not divisible by tp_size={tp_size}"
    if check_rules(rules) == "nano-vllm":
        hint = " (rules='vllm' would replicate them)" if tp_size % total_num_kv_heads == 0 else ""
        raise TPSizeError(f"{head}; nano-vllm rules never replicate KV heads{hint}")
    if tp_size % total_num_kv_heads:
        raise TPSizeError(f"{head}, and tp_size is not a multiple of it")
    return 1, tp_size // total_num_kv_heads


def padded_vocab(vocab_size: int, rules: str = "vllm") -> int:
    """Vocab rows each layer allocates in total: padded to 64 under vLLM rules, as-is under nano-vllm."""
    if check_rules(rules) == "nano-vllm":
        return vocab_size
    return -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING
