"""The GPUs a layout runs on: a catalog of accelerators (gpus.json, each entry with its source) or a custom
one from its numbers, and the topology that says which GPUs share a scale-up link and which talk across
nodes."""
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tpviz.errors import TpvizError

CATALOG = Path(__file__).with_name("gpus.json")
# --gpu custom:KEY=VALUE,...: the keys and what each sets (units as in gpus.json)
CUSTOM_KEYS = {"mem": "mem_gib", "hbm": "hbm_gb_s", "bf16": "bf16", "fp8": "fp8", "fp4": "fp4",
               "link": "link_gb_s", "domain": "domain", "net": "scale_out_gbit"}
CUSTOM_EXAMPLE = "custom:mem=80,hbm=3350,bf16=989,fp8=1979,link=450,domain=8"


class HardwareError(TpvizError):
    """An unknown GPU name, a malformed custom GPU or an impossible topology."""


@dataclass(frozen=True)
class GpuType:
    """One accelerator's figures: memory, HBM bandwidth, dense tensor peaks, and its links."""
    name: str
    label: str
    mem_gib: float
    hbm_gb_s: float
    tflops: dict = field(hash=False)  # dense peak per format: bf16, fp8, fp4 (0: it has none)
    link: str = "NVLink"
    link_gb_s: float = 450.0
    domain: int = 8  # GPUs one scale-up domain joins (0: a node's GPUs, over PCIe)
    scale_out_gbit: float = 400.0
    latency_us: float = 2.0
    scale_out_latency_us: float = 5.0
    source: str = ""

    def peak(self, fmt: str) -> float:
        """FLOP/s at a compute format; a format the part lacks runs at bf16 (weight-only kernels upcast)."""
        return (self.tflops.get(fmt) or self.tflops["bf16"]) * 1e12

    @property
    def hbm(self) -> float:
        return self.hbm_gb_s * 1e9


@cache
def catalog() -> dict[str, GpuType]:
    data = json.loads(CATALOG.read_text())
    lat = {"latency_us": data["latency_us"], "scale_out_latency_us": data["scale_out_latency_us"]}
    return {name: GpuType(name, e["label"], e["mem_gib"], e["hbm_gb_s"], dict(e["tflops"]), e["link"],
                          e["link_gb_s"], e["domain"], e["scale_out_gbit"], source=e["source"], **lat)
            for name, e in data["gpus"].items()}


def gpu_type(name: str) -> GpuType:
    """A catalog GPU by its lowercase name, or `custom:mem=...,hbm=...,bf16=...` from its numbers."""
    text = str(name).strip().lower()
    if text.startswith("custom:"):
        return custom_gpu(text[len("custom:"):])
    if text not in catalog():
        raise HardwareError(f"unknown GPU {name!r}: use one of {', '.join(catalog())}, or {CUSTOM_EXAMPLE}")
    return catalog()[text]


def custom_gpu(text: str) -> GpuType:
    """mem (GiB), hbm (GB/s) and bf16 (TFLOPS) are needed; fp8, fp4, link, domain and net are optional."""
    values = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key.strip() not in CUSTOM_KEYS:
            raise HardwareError(f"custom GPU: unknown key {key.strip()!r}; keys are {', '.join(CUSTOM_KEYS)} "
                                f"(for example {CUSTOM_EXAMPLE})")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise HardwareError(f"custom GPU: {key.strip()}={value!r} is not a number") from None
        if values[key.strip()] < 0:
            raise HardwareError(f"custom GPU: {key.strip()}={value} must not be negative")
    if missing := [k for k in ("mem", "hbm", "bf16") if not values.get(k)]:
        raise HardwareError(f"custom GPU needs {', '.join(missing)} (for example {CUSTOM_EXAMPLE})")
    return GpuType("custom", "custom GPU", values["mem"], values["hbm"],
                   {"bf16": values["bf16"], "fp8": values.get("fp8", 0), "fp4": values.get("fp4", 0)},
                   "scale-up link", values.get("link", 450), int(values.get("domain", 8)),
                   values.get("net", 400))


@dataclass(frozen=True)
class Topology:
    """GPUs of one type, gpus_per_node to a node; ranks are numbered node by node."""
    gpu: GpuType
    gpus_per_node: int = 8

    def __post_init__(self):
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) \
                or not 1 <= self.gpus_per_node <= 72:
            raise HardwareError(f"gpus per node = {self.gpus_per_node!r} must be an integer from 1 to 72")

    @property
    def scale_up(self) -> int:
        """GPUs that reach each other over the scale-up link: a node (PCIe cards, or an HGX board of at most
        its domain), or a rack-scale NVLink domain (NVL72) across its trays."""
        domain = self.gpu.domain
        return self.gpus_per_node if not domain else domain if domain > 8 else min(domain, self.gpus_per_node)

    def crosses(self, ranks) -> bool:
        """Whether a group of ranks spans more than one scale-up domain."""
        return len({r // self.scale_up for r in ranks}) > 1

    def link(self, ranks) -> tuple[float, float]:
        """(bytes/s each GPU sends at, latency in seconds) for a collective over these ranks."""
        if self.crosses(ranks):
            return self.gpu.scale_out_gbit / 8 * 1e9, self.gpu.scale_out_latency_us * 1e-6
        return self.gpu.link_gb_s * 1e9, self.gpu.latency_us * 1e-6
