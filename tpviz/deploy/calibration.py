"""The speed bound beside published measurements (bench/data/perf_measurements.json): each measurement's
model served as it was (weights and KV cache format), on its GPUs and layout, at its lengths and concurrency.
A bound holds when no measurement beats it; the ratio measured / bound is the efficiency engines reach."""
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from tpviz.config.quant import Quant
from tpviz.config.sources import load_spec
from tpviz.deploy.hardware import Topology, gpu_type
from tpviz.deploy.perf import Speed, Workload
from tpviz.deploy.ranking import rank_layouts
from tpviz.deploy.sizing import Sizer
from tpviz.rules import Layout, ruleset

DATA = Path(__file__).resolve().parents[2] / "bench" / "data" / "perf_measurements.json"
# weights as served, when the checkpoint is stored wider: FP8 per tensor, NVFP4 (a scale per 16)
SERVED_QUANT = {"fp8": Quant("fp8", "fp8_tensor"), "fp4": Quant("modelopt", "nvfp4", group=16, bits=4)}
HIGHER_IS_BETTER = {"out_tok_s", "out_tok_s_per_gpu", "total_tok_s_per_gpu"}
UTILIZATION = 0.98  # TensorRT-LLM and SGLang give the KV cache more of the memory than vLLM's 0.9


@dataclass
class Checked:
    """One measurement and the bound for it: ratio = measured / bound for rates, bound / measured for
    times, so 1.0 is the bound reached and above 1 the bound beaten."""
    m: dict
    bound: float
    layout: str

    @property
    def ratio(self) -> float:
        value = self.m["value"]
        return value / self.bound if self.m["metric"] in HIGHER_IS_BETTER else self.bound / value


def measurements(path: Path = DATA) -> list[dict]:
    return json.loads(Path(path).read_text())["measurements"]


def served(model: str, dtype: str, kv_dtype: str):
    """The model's spec with its weights and KV cache as the measurement served them."""
    spec = load_spec(model)
    if dtype in ("bf16", "fp16"):
        spec = spec.served("bfloat16" if dtype == "bf16" else "float16")
    elif dtype in SERVED_QUANT and SERVED_QUANT[dtype].bits < (spec.quant.bits if spec.quant else 16):
        spec = replace(spec, quant=SERVED_QUANT[dtype], quantization=SERVED_QUANT[dtype].method)
    # a KV format left unstated is taken as FP8 for quantized weights (TensorRT-LLM's FP8 and FP4 builds
    # set it so), which only raises the bound
    fp8_kv = kv_dtype == "fp8" or kv_dtype == "auto" and spec.quant is not None
    return spec.served(kv_cache_dtype="fp8" if fp8_kv else "auto")


def layout_of(m: dict) -> Layout:
    """vLLM's spelling of the measured layout: attention DP with EP is DP x EP over tp = 1."""
    if m.get("attention_dp"):
        return Layout(1, m["pp"], m["gpus"] // m["pp"], ep=True)
    return Layout(m["tp"], m["pp"], m["dp"], ep=bool(m["ep"]))


def check(m: dict) -> Checked:
    """The bound for one measurement. Engines other than vLLM run past vLLM's default sequence cap; a
    layout the source leaves unstated takes the best bound of any layout of its GPUs; attention DP runs
    its experts' all-to-all as DeepEP does."""
    spec = served(m["model"], m["dtype"], m["kv_dtype"])
    rules = ruleset("vllm")  # the bound's traffic is vLLM 0.33's; other engines run past its sequence cap
    rules = rules if m["engine"] == rules.engine.lower() else replace(rules, max_num_seqs=None)
    gpu = gpu_type(m["gpu"])
    topo = Topology(gpu, 4 if gpu.name.startswith("gb") else 8)
    output = m["output_len"] or 1024  # a decode-only measurement: its sequences' length alone matters
    rate, split = m["metric"] in HIGHER_IS_BETTER, bool(m.get("disaggregated"))  # split: decode GPUs alone
    concurrency = m["concurrency"]
    concurrency = None if concurrency in ("max", None) and rate else 1 if concurrency is None else \
        None if concurrency == "max" else int(concurrency)
    work = Workload(m["input_len"], output, concurrency)
    sizer = Sizer(spec, rules)
    all2all = "deepep" if m.get("attention_dp") else "allgather_reducescatter"
    if m.get("layout_uncertain"):
        rows = rank_layouts(spec, m["gpus"], gpu.mem_gib, rules, UTILIZATION, sizer=sizer, topology=topo,
                            workload=work)
        perfs = [(r.perf, r.layout) for r in rows if r.perf]
        perf, layout = (max if rate else min)(perfs, key=lambda p: value_of(p[0], m["metric"], work, split))
    else:
        layout = layout_of(m)
        row = sizer.row(layout, gpu.mem_gib * 2**30, UTILIZATION, work.context)
        perf = Speed(sizer, topo, work, all2all).perf(row)
        if perf is None:
            raise ValueError(f"{m['id']}: {layout.label} has no bound ({row.problem or 'does not fit'})")
    return Checked(m, value_of(perf, m["metric"], work, split), layout.label)


def value_of(perf, metric: str, work: Workload, decode_only: bool = False) -> float:
    per_gpu = perf.decode_tok_s_per_gpu if decode_only else perf.out_tok_s_per_gpu
    return {"out_tok_s": perf.out_tok_s, "out_tok_s_per_gpu": per_gpu,
            "total_tok_s_per_gpu": perf.out_tok_s_per_gpu * work.context / work.output_len,
            "tpot_ms": perf.tpot_ms, "ttft_ms": perf.ttft_ms}[metric]


def efficiency(checked: list[Checked]) -> float:
    """The median measured / bound over the measurements of throughput."""
    return statistics.median(c.ratio for c in checked if c.m["metric"] in HIGHER_IS_BETTER)
