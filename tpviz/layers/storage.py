"""The tensors a quantized linear layer stores, per scheme, as vLLM 0.33 creates them (quantization/*.py).

Each QTensor says how its dims follow the layer's output features N and input features K, in units: a
block scale has one row per block_n outputs, GPTQ packs 8 int4 values of K into one int32. The layer
classes create one parameter per QTensor and load it with the generic rules in layers/linear.py.
"""
import math
from dataclasses import dataclass

from tpviz.config.quant import Quant

DTYPE_BYTES = {"float8_e4m3fn": 1, "float32": 4, "int32": 4, "uint8": 1, "int64": 8,
               "bfloat16": 2, "float16": 2, "float8_e8m0fnu": 1}


@dataclass(frozen=True)
class QTensor:
    """One stored tensor of a quantized linear layer ([out, in] order unless out_dim says otherwise)."""
    name: str  # the checkpoint suffix after the module name: weight, weight_scale_inv, qweight, ...
    dtype: str  # as stored; None-like "" means the model dtype (scales of GPTQ/AWQ)
    out_dim: int | None = 0  # the dim that follows the output features (None: held whole by every rank)
    in_dim: int | None = 1
    out_unit: int = 1  # output features per element along out_dim (block_n, or 8 packed int4 in AWQ)
    in_unit: int = 1  # input features per element along in_dim (block_k, group size, packing)
    per_shard: bool = False  # a scalar per logical shard (per-tensor scales): [1 | 2 | 3] slots
    note: str = ""
    vector: bool = False  # one value per input feature (GPTQ's g_idx [K])
    in_split: bool = True  # False: the input dim is held whole even on row-parallel layers (act-order scales)

    def shape(self, n: int, k: int) -> tuple[int, ...]:
        """The full (unsplit) shape for n outputs and k inputs."""
        if self.per_shard:
            return (1,)
        if self.vector:
            return (k,)
        dims = [1, 1]
        if self.out_dim is not None:
            dims[self.out_dim] = math.ceil(n / self.out_unit)
        if self.in_dim is not None:
            dims[self.in_dim] = math.ceil(k / self.in_unit)
        if self.out_dim is None and self.in_dim is None:
            return (2,)  # compressed-tensors weight_shape
        if self.out_dim is None:  # per-input only: the other dim is 1 ([1, K] never happens; [N, 1] does)
            dims[1 - self.in_dim] = 1
        if self.in_dim is None:
            dims[1 - self.out_dim] = 1
        return tuple(dims)

    def element_bytes(self, model_bytes: int) -> int:
        return DTYPE_BYTES.get(self.dtype, model_bytes)


def linear_tensors(q: Quant, row_parallel: bool = False, act_order_split: bool = False) -> list[QTensor]:
    """The stored tensors of a quantized Linear (column- or row-parallel) under scheme q."""
    if q.scheme == "fp8_block":
        bn, bk = q.block
        scale = "weight_scale" if q.method == "compressed-tensors" else "weight_scale_inv"
        return [QTensor("weight", "float8_e4m3fn"),
                QTensor(scale, "float32", out_unit=bn, in_unit=bk, note=f"one scale per {bn}×{bk} block")]
    if q.scheme == "fp8_tensor":
        out = [QTensor("weight", "float8_e4m3fn"), QTensor("weight_scale", "float32", per_shard=True,
                                                             note="one scale per projection, on every GPU")]
        if q.method == "modelopt":  # static activation scales
            out.append(QTensor("input_scale", "float32", per_shard=True, note="static activation scale"))
        return out
    if q.scheme == "fp8_channel":
        return [QTensor("weight", "float8_e4m3fn"), QTensor("weight_scale", "float32", in_dim=None,
                                                             note="one scale per output row")]
    if q.scheme == "nvfp4":
        return [QTensor("weight", "uint8", in_unit=2, note="2 fp4 values per uint8"),
                QTensor("weight_scale", "float8_e4m3fn", in_unit=q.group,
                        note=f"one FP8 scale per {q.group} values"),
                QTensor("weight_scale_2", "float32", per_shard=True),
                QTensor("input_scale", "float32", per_shard=True)]
    if q.scheme in ("int4_group", "int8_group"):
        pack = 32 // q.bits
        per_channel = q.group == -1
        group_in = None if per_channel and row_parallel else 0  # a per-channel scale is whole on row layers
        if q.packing == "gptq" and q.desc_act and act_order_split:
            # act-order up to vLLM 0.29: the input dim is permuted, so a row layer keeps every group's scales
            # and zeros whole on each GPU, and g_idx (one group index per input feature) is loaded by rows
            return [QTensor("qweight", "int32", out_dim=1, in_dim=0, in_unit=pack,
                            note=f"{pack} int{q.bits} per int32"),
                    QTensor("scales", "", out_dim=1, in_dim=0, in_unit=q.group, in_split=False,
                            note="act-order: every GPU holds every group's scales"),
                    QTensor("qzeros", "int32", out_dim=1, in_dim=0, out_unit=pack,
                            in_unit=q.group, in_split=False),
                    QTensor("g_idx", "int32", out_dim=None, in_dim=0, vector=True,
                            note="act-order group of each input")]
        if q.packing == "gptq":  # [K/8, N] int32; scales [K/g, N]; zeros [K/g, N/8]
            return [QTensor("qweight", "int32", out_dim=1, in_dim=0, in_unit=pack,
                            note=f"{pack} int{q.bits} per int32"),
                    QTensor("scales", "", out_dim=1, in_dim=group_in,
                            in_unit=q.group if not per_channel else 1 << 30),
                    QTensor("qzeros", "int32", out_dim=1, in_dim=group_in, out_unit=pack,
                            in_unit=q.group if not per_channel else 1 << 30)]
        if q.packing == "awq":  # [K, N/8] int32; zeros [K/g, N/8]; scales [K/g, N]
            return [QTensor("qweight", "int32", out_dim=1, in_dim=0, out_unit=pack,
                            note=f"{pack} int{q.bits} per int32"),
                    QTensor("qzeros", "int32", out_dim=1, in_dim=0, out_unit=pack, in_unit=q.group),
                    QTensor("scales", "", out_dim=1, in_dim=0, in_unit=q.group)]
        # compressed-tensors pack-quantized: [N, K/8] int32; scales [N, K/g]
        return [QTensor("weight_packed", "int32", in_unit=pack, note=f"{pack} int{q.bits} per int32"),
                QTensor("weight_scale", "", in_dim=None if per_channel and row_parallel else 1,
                        in_unit=q.group if not per_channel else 1 << 30),
                QTensor("weight_shape", "int64", out_dim=None, in_dim=None)]
    raise ValueError(f"no linear storage for {q.scheme}")
