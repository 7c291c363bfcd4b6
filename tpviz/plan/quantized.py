"""Quantized linear layers in the plan: one ParamPlan per stored tensor, and vLLM's checks per rule set."""
import math
from dataclasses import dataclass

from tpviz.errors import QuantError
from tpviz.layers.quantized import QuantContext
from tpviz.config.quant import Quant
from tpviz.layers.storage import QTensor, linear_tensors
from tpviz.rules import RuleSet


# vLLM 0.33's words when a row-parallel shard would split a quantization group (research: quantization/*.py)
GROUP_MESSAGES = {
    "gptq": "Weight in_features per partition {k} is not divisible by group_size = {g} (the "
            "Marlin kernel's check).",
    "awq": "The input size is not aligned with the quantized weight shape (input per GPU "
           "{k}, group_size {g}). This can be caused by too large tensor parallel size.",
    "compressed-tensors": "Weight input_size_per_partition={k} is not divisible by "
                          "group_size={g}. This happens when tensor_parallel_size splits the layer input "
                          "into shards that are not a whole number of quant groups.",
    "modelopt": "Unsupported model when in features size is not multiple of {g} (input per GPU {k}).",
}
DESC_ACT = ("GPTQ group activation ordering (desc_act=True) is no longer supported. Use a "
            "checkpoint with static activation ordering or desc_act=False.")


def misaligned_scales(parts: list[int], block: int) -> bool:
    """Whether a merged layer's block scales cannot be loaded: vLLM's loader places each part's scales at
    ceil(offset / block) rows, ceil(size / block) long, which overruns the ceil(total / block) rows when a
    part before the last is not a whole number of blocks (it skips the create-time check for merged
    layers)."""
    ends = [math.ceil(sum(parts[:i]) / block) + math.ceil(p / block) for i, p in enumerate(parts)]
    return len(parts) > 1 and max(ends) > math.ceil(sum(parts) / block)


@dataclass(frozen=True)
class QPlan:
    """A quantized layer's scheme, the rule set that judges it, and whether it is a MoE expert."""
    quant: Quant
    rules: RuleSet
    role: str  # "dense" or "moe"
    hidden: int
    model_bytes: int

    def tensors(self, row: bool) -> list[QTensor]:
        return linear_tensors(self.quant, row, self.rules.gptq_act_order_split)

    def ctx(self, row: bool) -> QuantContext:
        return QuantContext(self.tensors(row), self._check, self.hidden if self.role == "moe" else 0)

    def _check(self, layer, out_sizes: list[int], in_size: int) -> None:
        """vLLM's create-time checks (raise), and what fails later at load time or needs a fallback
        (recorded)."""
        q, tp = self.quant, layer.tp_size
        if (tp == 1 and q.scheme == "fp8_block" and self.role != "moe" and len(out_sizes) > 1
                and self.rules.fp8_merged_at_tp1 and (bad := [s for s in out_sizes if s % q.block[0]])):
            raise QuantError(f"Weight output_partition_size = {bad[0]} is not divisible by "
                             # SGLang checks merged layers at every tp
                             f"weight quantization block_n = {q.block[0]}.")
        if (tp == 1 and q.scheme == "fp8_block" and self.role != "moe"
            and misaligned_scales(out_sizes, q.block[0])):
            layer.problem = (f"the merged parts {out_sizes} are not whole FP8 blocks of "
                             f"{q.block[0]} rows, so their block scales overlap: loading fails (start + "
                             "length exceeds the scale rows)")
            return
        moe_blocks = q.scheme == "fp8_block" and self.role == "moe"  # checked at tp 1 (and EP) too
        if layer.tp_dim is None or (tp == 1 and not moe_blocks):
            return
        row = layer.tp_dim == 1
        if q.scheme == "fp8_block":
            bn, bk = q.block
            if self.role == "moe":
                return self._moe_fp8(layer, in_size if row else out_sizes[0], row and tp > 1, tp)
            if row and in_size % bk:
                raise QuantError(f"Weight input_size_per_partition = {in_size} is not divisible by weight "
                                  f"quantization block_k = {bk}.")
            bad = [s for s in out_sizes if s % bn]
            if not row and bad:
                message = (f"Weight output_partition_size = {bad[0]} is not divisible by weight quantization "
                           f"block_n = {bn}.")
                if len(out_sizes) > 1 and q.method == "fp8" and self.rules.fp8_merged_exempt:
                    layer.problem = (f"{message} {self.rules.label} skips this check for merged "
                                     "layers (since 0.14) but then cannot cut the block "
                                     "scales: loading fails (start + length exceeds the scale rows)")
                    return
                raise QuantError(message)
        # INT4/INT8 groups, NVFP4: a group may not straddle GPUs
        elif q.group > 0 and row and in_size % q.group:
            raise QuantError(GROUP_MESSAGES.get(q.method, GROUP_MESSAGES["compressed-tensors"]).format(
                k=in_size, g=q.group))

    def _moe_fp8(self, layer, i_p: int, row: bool, tp: int) -> None:
        """Both engines check the experts' slice against the block at any tp (block_k only above tp 1);
        vLLM >= 0.29 refines the blocks where a divisor of 32 or more fits (oracle/fp8.py)."""
        bn, bk = self.quant.block
        if i_p % bn == 0 and (tp == 1 or i_p % bk == 0):
            return
        r = math.gcd(math.gcd(bn, bk), math.gcd(i_p, self.hidden))
        # vLLM >= 0.29 refines the blocks
        if self.rules.fp8_moe_refine and self.quant.method == "fp8" and r >= 32:
            layer.warning = (f"expert intermediate per GPU = {i_p} is not a multiple of "
                             f"the FP8 block ({bn}); {self.rules.label} refines the scales to "
                             f"{r}×{r} blocks, which only its Triton MoE kernel runs")
            layer.refine = bn // r
            return
        if row:
            raise QuantError(f"The input_size of down's weight = {i_p} is not divisible by "
                             "weight quantization "
                              f"block_k = {bk}.")
        raise QuantError(f"The output_size of gate's and up's weight = {i_p} is not divisible by weight "
                          f"quantization block_n = {bn}.")


def qplan(spec, rules: RuleSet, module: str, layers, role: str = "dense") -> QPlan | None:
    """The QPlan of a linear module (checkpoint name without .weight, '*' for the layer), or None if
    unquantized."""
    q = spec.quant
    if q is None or q.scheme == "mxfp4":  # gpt-oss: MXFP4 covers the experts only, every Linear stays bf16
        return None
    first = (layers or [0])[0]
    if not q.quantizes(module.replace("*", str(first), 1).replace("*", "0")):
        return None
    return QPlan(q, rules, role, spec.hidden_size, spec.dtype_bytes)
