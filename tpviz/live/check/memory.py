"""Memory in the run's dtype and in the checkpoint's own (live/load/dtypes.py): a rank holding half of a
bfloat16 checkpoint holds as many bytes as the whole checkpoint once the run upcasts it to float32, so both
are reported. Also dtype 'auto', and the estimate before a run: each rank's weights read off the shard map
(tpviz.deploy.deployment), the tp=1 reference's, and their peak against the memory free for them, refused in
one line when they would not fit."""
import os
from dataclasses import dataclass, field, replace

from tpviz.errors import TpvizError
from tpviz.config.spec import ModelSpec
from tpviz.deploy.deployment import deploy
from tpviz.live.load.source import ModelRead, check_size, check_split, live_config, read_model
from tpviz.render.text import fmt_bytes
from tpviz.rules import Layout, ruleset
import torch
from tpviz.live.errors import LiveError
from tpviz.live.check.results import layout_name
from tpviz.live.load.dtypes import ITEMSIZE, checkpoint_dtype, run_dtype
from tpviz.live.load.weights import checkpoint_files

# Before a run: the weights each process will hold, from the shard map, against the memory free for them.
# worker.run_model builds a model in torch's default dtype, then casts it to the run's
BUILD_DTYPE = "float32"
RANDOM_STORED = "bfloat16"  # random_weights writes its checkpoints in bf16 (dtype auto runs in it)
MEMORY_ENV = "TPVIZ_LIVE_MEMORY"  # GiB a live run may take of each memory it uses; "off" lifts the check


class OverMemory(LiveError):
    """A run whose weights would not fit: `pool` ('RAM', 'cuda:0'), bytes `need` and `available`."""

    def __init__(self, message: str, pool: str, need: int, available: int):
        super().__init__(message)
        self.pool, self.need, self.available = pool, need, available


@dataclass
class MemoryEstimate:
    """Weight bytes of a live run, read off the shard map before it starts, plus each process's activations
    for the input; each process's own torch and CUDA context are not counted."""
    name: str
    dtype: str  # the run's
    layers: int  # kept
    # bytes each rank holds in the run's dtype: the per-rank "held" of the report after the run
    ranks: list[int]
    reference: int  # the tp=1 reference in this process: the whole kept model in the run's dtype
    device: str = "cpu"
    gpus: int = 0
    activations: int = 0  # bytes each process keeps for the input (activation_bytes)
    request: dict = field(default_factory=dict, repr=False)  # what it was made from, to try what would fit

    def peak(self, held: int) -> int:
        """Bytes while a model is built: in BUILD_DTYPE, then cast (a bf16/fp16 reference also runs in float32
        for the noise floor, so it peaks there too)."""
        return held * max(ITEMSIZE[BUILD_DTYPE], ITEMSIZE[self.dtype]) // ITEMSIZE[self.dtype]

    def where(self, rank: int) -> str:
        """The memory a rank's weights go to: RAM, or GPU rank % gpus as the spawned ranks pick theirs."""
        return f"cuda:{rank % max(1, self.gpus)}" if self.device == "cuda" else "RAM"

    def pools(self) -> dict[str, int]:
        """Peak bytes of each memory: spawned ranks and the reference build at once; a lone tp=1 run follows
        the reference in the same process, so then the larger counts."""
        out: dict[str, int] = {}
        for rank, held in enumerate(self.ranks):
            out[self.where(rank)] = out.get(self.where(rank), 0) + self.peak(held) + self.activations
        ref, ref_peak = self.where(0), self.peak(self.reference) + self.activations
        out[ref] = out.get(ref, 0) + ref_peak if len(self.ranks) > 1 else max(out.get(ref, 0), ref_peak)
        return out

    def over(self, available: dict[str, int]) -> tuple[str, int, int] | None:
        """(memory, bytes needed, bytes available) of the first memory it does not fit in, or None."""
        return next(((k, v, available[k]) for k, v in self.pools().items()
                     if k in available and v > available[k]), None)

    @property
    def layout(self) -> str:
        r = self.request
        carved = r["layout"].carved if r.get("layout") is not None else None
        return layout_name(r.get("tp", len(self.ranks)), r.get("pp", 1), r.get("ep", False), carved)

    def summary(self, available: dict[str, int]) -> str:
        """One line: what each rank and the reference hold, and each memory's peak against what is free."""
        n, lo, hi = len(self.ranks), fmt_bytes(min(self.ranks)), fmt_bytes(max(self.ranks))
        built = f" (built in {BUILD_DTYPE})" if self.peak(2**20) > 2**20 else ""
        peaks = ", ".join(f"{k} {fmt_bytes(v)}{built}"
                          + (f" of {fmt_bytes(available[k])} available" if k in available else "")
                          for k, v in self.pools().items())
        held = (f"{n} ranks × {lo if lo == hi else f'{lo} to {hi}'} in {self.dtype} + the tp=1 reference "
                f"{fmt_bytes(self.reference)} (the whole kept model)" if n > 1 else
                "the tp=1 run and its reference, one after the other: "
                f"{fmt_bytes(self.reference)} in {self.dtype}")
        act = f" + activations {fmt_bytes(self.activations)} per process" if self.activations else ""
        return f"{held}{act}; peak {peaks}"

    def rows(self) -> list[dict]:
        """One row per rank and one for the reference: where its weights go, held in the run's dtype (the
        report's per-rank "held" after the run) and the peak while built."""
        mib = lambda b: round(b / 2**20, 3)  # noqa: E731
        rows = ([(f"rank {i}", self.where(i), b) for i, b in enumerate(self.ranks)]
                if len(self.ranks) > 1 else [])
        return [{"who": who, "memory": where, f"held MiB ({self.dtype})": mib(b),
                 "peak MiB": mib(self.peak(b))}
                for who, where, b in rows + [("tp=1 reference", self.where(0), self.reference)]]


def activation_bytes(spec, batch: int, seq: int) -> int:
    """About what one process keeps for a [batch, seq] input, as float32: logits and their gathered or
    compared copy, every layer's hidden states (the comparison keeps them all), and eager attention's scores
    and probabilities (batch x heads x seq x seq) while a layer runs."""
    heads = max((layer.mixer.heads for layer in spec.layers), default=0)
    return 4 * (batch * seq * (2 * spec.vocab_size + (spec.num_hidden_layers + 2) * spec.hidden_size)
                + 2 * batch * heads * seq * seq)


def input_shape(ids, batch, seq_len, prompt: str | None, generate: int) -> tuple[int, int]:
    """The [batch, seq] a run holds at its longest, before the model is read: `ids` a [batch, seq] tensor or
    None; a prompt's length is known only once tokenized (counted as its generated tokens alone); bad sizes
    are left to the checks that name them."""
    if prompt is not None:
        return 1, generate or 0
    if ids is not None:
        batch, seq_len = ids.shape
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (batch, seq_len)):
        return 0, 0
    return batch, seq_len + (generate or 0)


def estimate_weights(spec: ModelSpec, tp: int, *, pp: int = 1, ep: bool = False,
                     placement: str = "linear",
                     layers: int | None = None, dtype: str = "float32", device: str = "cpu",
                     gpus: int = 0, input_shape: tuple[int, int] = (0, 0), rules: str = "vllm",
                     layout: Layout | None = None) -> MemoryEstimate:
    """The weights a run of this config holds, per rank and in the tp=1 reference, in the run's dtype; an
    invalid split or a model over the parameter cap fails as the run would, in one line. `layout`: an SGLang
    layout (attention DP, --ep) the ranks run instead of tp x pp."""
    cfg = live_config(spec, layers, rules)
    check_split(cfg, tp, ep, layout)
    check_size(cfg, layers)
    ruleset(cfg.rules).pp_partition(cfg.spec.num_hidden_layers, pp)
    # the vLLM layout the ranks load, in the run's dtype; gpt-oss MXFP4 experts are dequantized while loading
    served = replace(cfg.spec.served(dtype), quantization="", quant=None)
    ran = layout or Layout(tp, pp, 1, ep)
    ranks = [g.weight_bytes for g in deploy(served, ran, cfg.rules, placement).gpus]
    whole = deploy(served, Layout(1), cfg.rules).gpus[0].weight_bytes
    return MemoryEstimate(spec.name, dtype, cfg.spec.num_hidden_layers, ranks, whole, device, gpus,
                          activation_bytes(cfg.spec, *input_shape),
                          dict(spec=spec, tp=tp, pp=pp, ep=ep, placement=placement,
                               device=device, gpus=gpus, input_shape=input_shape, rules=rules, layout=layout))


def plan_memory(model, tp: int, *, pp: int = 1, ep: bool = False, placement: str = "linear",
                layers: int | None = None, dtype: str = "float32", device: str = "cpu", gpus: int = 0,
                random_weights: bool = False, input_shape: tuple[int, int] = (0, 0), rules: str = "vllm",
                layout: Layout | None = None) -> MemoryEstimate:
    """estimate_weights for a model as the run reads it (folder, config, preset or hub id: its config alone,
    nothing downloaded); dtype 'auto' is the folder's stored dtype, else the config's (random weights:
    bf16)."""
    read = read_model(model)
    if dtype == "auto":
        raw = read.spec.config
        stored = RANDOM_STORED if random_weights else _folder_dtype(read) or str(
            raw.get("torch_dtype") or raw.get("dtype") or "")
        dtype = run_dtype(dtype, stored)[0]
    return estimate_weights(read.spec, tp, pp=pp, ep=ep, placement=placement, layers=layers, dtype=dtype,
                            device=device, gpus=gpus, input_shape=input_shape, rules=rules, layout=layout)


def check_fits(model, tp: int, env, **request) -> None:
    """Before anything is downloaded or spawned: refuse, in one line, a run whose weights would not fit in the
    memory `env` (runner.Environment) runs on. A config that cannot be read or split is left to the run, which
    says why."""
    try:
        est = plan_memory(model, tp, device=env.device, gpus=len(env.gpus), **request)
    except TpvizError:
        return
    check_memory(est)


def _folder_dtype(read: ModelRead) -> str:
    """The stored dtype of a local checkpoint folder's safetensors ('' for anything else)."""
    try:
        path = read.path if read.is_dir else None
        return checkpoint_dtype(path) if path is not None and checkpoint_files(path) else ""
    except OSError:
        return ""


def available_memory(device: str = "cpu", gpus: int = 0) -> dict[str, int]:
    """Bytes free for a run in each memory it uses: 'RAM' (/proc/meminfo's MemAvailable) or 'cuda:i' (the
    GPU's free memory), at most $TPVIZ_LIVE_MEMORY GiB; one that cannot be read is left out, and 'off' leaves
    all out."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if text.lower() == "off":
        return {}
    out = {}
    if device == "cuda":
        for i in range(gpus):
            try:
                out[f"cuda:{i}"] = torch.cuda.mem_get_info(i)[0]
            except (RuntimeError, AssertionError):  # no driver, or a GPU torch cannot open
                pass
    else:
        try:
            with open("/proc/meminfo") as f:
                kib = next((int(line.split()[1]) for line in f if line.startswith("MemAvailable:")), None)
            if kib is not None:
                out["RAM"] = kib * 1024
        except (OSError, ValueError, IndexError):  # not Linux
            pass
    if text:
        try:
            cap = int(float(text) * 2**30)
        except ValueError:
            cap = -1
        if cap <= 0:
            raise LiveError(f"{MEMORY_ENV}={text[:40]!r} must be a positive number of GiB, or off")
        pools = [f"cuda:{i}" for i in range(gpus)] if device == "cuda" else ["RAM"]
        out = {k: min(out.get(k, cap), cap) for k in pools}
    return out


def check_memory(est: MemoryEstimate, available: dict[str, int] | None = None) -> None:
    """Refuse, in one line, a run whose weights would not fit, naming the numbers and what would fit."""
    available = available_memory(est.device, est.gpus) if available is None else available
    over = est.over(available)
    if over is None:
        return
    pool, need, have = over
    ranks = sum(est.peak(b) for i, b in enumerate(est.ranks) if est.where(i) == pool)
    count = sum(est.where(i) == pool for i in range(len(est.ranks)))
    acts = est.activations * (count + (est.where(0) == pool) if len(est.ranks) > 1 else 1)
    weights = need - acts
    parts = f"{count} rank{'s' if count > 1 else ''} {fmt_bytes(ranks)}" + (
        f" + the tp=1 reference {fmt_bytes(weights - ranks)}" if weights > ranks else "")
    parts = parts if len(est.ranks) > 1 else "the tp=1 run and its reference, one after the other"
    built = f", built in {BUILD_DTYPE}" if est.peak(2**20) > 2**20 else ""
    batch, seq = est.request.get("input_shape", (0, 0))
    act = f" and {fmt_bytes(acts)} of activations for its {batch} × {seq} input" if acts else ""
    hints = (["a shorter input (batch × seq_len)"] if 2 * acts > need else []) + _what_fits(est, available)
    raise OverMemory(f"{est.name} ({est.layers} layer{'s' if est.layers != 1 else ''}, "
                     f"{est.dtype}) at {est.layout} needs about {fmt_bytes(need)} of {pool}: "
                     f"{fmt_bytes(weights)} for its weights ({parts}{built}){act}, but "
                     f"{fmt_bytes(have)} is available: "
                     f"{' or '.join(hints) if hints else 'even one layer would not fit'}, or set "
                     f"{MEMORY_ENV} (GiB, or off)", pool, need, have)


def _what_fits(est: MemoryEstimate, available: dict[str, int]) -> list[str]:
    """Changes that would fit, each tried on the shard map: a lower dtype, then fewer layers."""
    r = {k: v for k, v in est.request.items() if k not in ("spec", "tp")}

    def fits(layers: int, dtype: str) -> bool:
        try:
            again = estimate_weights(est.request["spec"], est.request["tp"], layers=layers, dtype=dtype, **r)
        except TpvizError:  # e.g. a layer count the split refuses
            return False
        return again.over(available) is None

    hints = ["dtype bfloat16"] if est.dtype == "float32" and fits(est.layers, "bfloat16") else []
    lo, hi, best = max(1, r.get("pp", 1)), est.layers - 1, None
    while lo <= hi:  # the weights grow with the layers kept: the most that fit
        mid = (lo + hi) // 2
        best, lo, hi = (mid, mid + 1, hi) if fits(mid, est.dtype) else (best, lo, mid - 1)
    if best:
        hints.append(f"keep at most {best} layer{'s' if best > 1 else ''} with --layers/Layers to keep")
    return hints
