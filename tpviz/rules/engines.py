"""The engine versions tpviz follows, each one RuleSet: what differs is data, read in the engine's own code.

vLLM 0.33.0 and 0.28.0 (model_executor/layers: linear.py, vocab_parallel_embedding.py, quantization/fp8.py,
fused_moe; distributed/utils.py get_pp_indices), and nano-vllm (GeeeekExplorer/nano-vllm: layers/linear.py,
layers/embed_head.py, engine/model_runner.py, config.py).
"""
from dataclasses import replace

from tpviz.rules.ruleset import Flags, RuleSet

VLLM_FLAGS = Flags("vllm serve {model}", "--tensor-parallel-size", "--pipeline-parallel-size",
                   "--data-parallel-size", "--enable-expert-parallel", "--expert-placement-strategy")
VLLM_0_33 = RuleSet(
    "vllm", "vLLM", "0.33",
    "vLLM 0.33.0: KV heads replicated past their count, vocab padded to 64; FP8 MoE slices "
    "that miss the 128 block use smaller scale blocks (since 0.29, Triton MoE kernel only); "
    "merged layers skip the create-time block check (since 0.14) but still cannot load misaligned scales.",
    VLLM_FLAGS, notes={"ep_hint": " Expert parallelism (--enable-expert-parallel) keeps every expert whole "
                                  "on one GPU and avoids this split."}, registry="0.33.0",
    max_num_seqs=(1024, 256))
VLLM_0_28 = replace(
    VLLM_0_33, name="vllm-0.28", version="0.28",
    note="vLLM 0.28.0 (0.14 to 0.28): as 0.33, except that an FP8 MoE slice that misses the "
         "128 block is refused (the 'gate's and up's weight = 192' reports).",
    fp8_moe_refine=False, refuses_desc_act=False, gptq_act_order_split=True, registry="0.28.0")
NANO_MAX_TP = 8  # nano-vllm's Config asserts 1 <= tensor_parallel_size <= 8 (one node)
NANO_VLLM = RuleSet(
    "nano-vllm", "nano-vllm", "",
    "nano-vllm: every split must divide; no KV-head replication, no vocab padding.",
    Flags("LLM({model!r}, tensor_parallel_size=N)", "tensor_parallel_size="),
    replicate_kv=False, vocab_padding=0, fp8_merged_exempt=False, fp8_moe_refine=False, model_checks=False,
    refuses_desc_act=False, tp_only=True, max_tp=NANO_MAX_TP, serves=("qwen3",),
    logits="gather", hybrid_pages=False, max_num_seqs=(512, 512), notes={  # its Config's max_num_seqs
        "max_tp": "nano-vllm's engine runs at most {max_tp} GPUs (its Config asserts "
                  "tensor_parallel_size <= {max_tp}); its layer classes split like this at any tp",
        # its ModelRunner builds Qwen3ForCausalLM whatever the checkpoint (engine/model_runner.py)
        "serves": "nano-vllm's engine builds Qwen3ForCausalLM only, so for {model_type} this "
                  "shows its layer classes' rules, not a model it can serve",
        # its Config has tensor_parallel_size alone (and its LLMEngine spawns one process per tp rank)
        "tp_only": "nano-vllm runs tensor parallelism alone: no pipeline stages, "
                   "data-parallel replicas or expert parallelism; vLLM rules have them",
        "plan": "nano-vllm runs tensor parallelism alone, so its plan is one layout: every GPU in "
                "one tensor-parallel group; vLLM rules also plan pipeline stages, data-parallel replicas "
                "and expert parallelism",
    })
