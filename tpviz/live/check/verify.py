"""The check: the same input ids through a tp_size run and a single-device run, compared stage by stage.

fp32 passes when max|Δlogit| <= 1e-4 (scaled by the logits when they exceed 1). bf16/fp16 cannot meet
that, so the tolerance is calibrated: the noise floor is how far the low-precision tp=1 run is from an
fp32 tp=1 run, and TP passes when its gap stays within NOISE_MULTIPLE times that floor.

MoE: the fp32 run computes with the low-precision run's expert choices, so the floor is rounding alone. Routed
on its own it would swap experts at near ties, and the floor would then hold whole expert swaps: large enough
that a skipped all-reduce passed in bf16 (measured: gap 4.8 within a tolerance of 16; following the bf16
choices the tolerance is 0.23). Where TP itself routes a token differently, result.routing says whether float
noise at a near tie explains it (routing.py); when it does, the verdict is taken on the positions before each
row's first flip, which both runs compute alike (causal attention), and otherwise on every position.
"""
import json
import time
from dataclasses import dataclass, field, replace

import torch

from tpviz.errors import TPSizeError
from tpviz.live.errors import LiveError
from tpviz.live.check.inject import Injection, check_injections, describe_injections
from tpviz.live.errors import IDS_FLAG, PROMPT_FLAG, check_timeout
from tpviz.live.check.generate import build_generation, check_generate, eos_token_ids
from tpviz.live.run.inprocess import run_within
from tpviz.live.load.inputs import (TextTokenizer, check_input_ids, is_ids_text,
                                    parse_ids_text, random_input_ids,
                               tokenize)
from tpviz.live.check.memory import check_fits, input_shape
from tpviz.live.load.dtypes import DTYPE_CHOICES, checkpoint_dtype, run_dtype
from tpviz.live.check.results import Environment, LayerDiff, RankReport, VerifyResult
from tpviz.live.check.compare import compare
from tpviz.live.check.routing import split as split_routing
from tpviz.live.run.runner import choose_backend, run_group
from tpviz.live.run.slot import check_ranks
from tpviz.live.load.source import ModelSource, read_model, resolve_model
from tpviz.live.run.job import Job
from tpviz.live.run.worker import REF_TOKENS_KEY, run_model
from tpviz.errors import LayoutError
from tpviz.rules import Layout, ruleset
from tpviz.rules.layout import CARVED



@dataclass
class Prepared:
    """Everything validated before any rank starts: bad input fails here, in one line."""
    source: ModelSource
    input_ids: torch.Tensor
    injections: list[Injection]
    env: Environment
    job: Job
    notes: list[str] = field(default_factory=list)


def prepare(model, tp_size: int, *, device: str = "auto", dtype: str = "float32", input_ids=None,
            inject: list[str] | None = None, layers: int | None = None, seed: int = 0, batch: int = 2,
            seq_len: int = 32, env: Environment | None = None, pp: int = 1, ep: bool = False,
            placement: str = "linear", random_weights: bool = False, download_progress=None,
            prompt: str | None = None, generate: int = 0, rules: str = "vllm",
            carve: dict | None = None) -> Prepared:
    """Resolve the model, check tp/pp/ep/dtype/ids/injections, choose the backend, and build the rank job.

    A preset or hub id downloads its real weights (reporting `download_progress(message, done, total)`)
    unless random_weights asks for seeded random ones. A prompt is tokenized with the model's own tokenizer;
    generate=N continues the prompt (or the one row of input ids) by N greedy tokens. dtype 'auto' runs in
    the dtype the checkpoint is stored in. `rules` names the rule set the ranks split by; SGLang's layout
    fields carved out of tp (attn_dp, ep_size, dense_tp1, dp_lm_head, shared_tp1) come in `carve`."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise TPSizeError(f"tp={tp_size!r} must be a positive integer")
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise LayoutError(f"pp={pp!r} must be a positive integer")
    if dtype not in DTYPE_CHOICES:
        raise LiveError(f"dtype {dtype!r} must be one of: {', '.join(DTYPE_CHOICES)}")
    if prompt is not None and input_ids is not None:
        raise LiveError(f"give {PROMPT_FLAG} or {IDS_FLAG}, not both")
    names = check_injections(inject)
    layout = carved_layout(rules, tp_size, pp, ep, carve or {})
    ruleset(rules).expert_placement(1, 1, placement)  # an unknown placement fails here, in one line
    env = env or choose_backend(tp_size * pp, device)
    if input_ids is not None:  # its shape sizes the activations; the vocabulary is checked with the model
        input_ids = check_input_ids(input_ids)
    read = read_model(model)  # once: the memory check and the run share it
    if env.launcher == "spawn":  # torchrun's ranks are already running, maybe on other machines
        check_fits(read, tp_size, env, pp=pp, ep=ep, placement=placement, layers=layers, dtype=dtype,
                   random_weights=random_weights, rules=rules, layout=layout,
                   input_shape=input_shape(input_ids, batch, seq_len, prompt, generate))
    source = resolve_model(read, layers, seed, tp_size, ep=ep, random_weights=random_weights,
                           download=download_progress, rules=rules,
                           layout=layout)  # an invalid split fails before weights are made
    cfg = source.cfg
    # more stages than layers (or a bad override): one line
    ruleset(cfg.rules).pp_partition(cfg.spec.num_hidden_layers, pp)
    if env.launcher == "spawn":  # torchrun starts its own ranks
        check_ranks(tp_size, len(env.gpus), pp)
    vocab = cfg.spec.vocab_size
    if prompt is not None:
        if source.tokenizer_dir is not None:
            input_ids = tokenize(prompt, source.tokenizer_dir, vocab)
        elif is_ids_text(prompt):  # without a tokenizer, a prompt of token ids is taken as they are
            input_ids = parse_ids_text(prompt, vocab)
        else:
            why = ("random weights come from its config alone, with no tokenizer"
                   if source.random_weights else "its checkpoint has no tokenizer.json or tokenizer.model")
            raise LiveError(f"{source.name} has no tokenizer ({why}): give token ids such as "
                            "1 2 3 instead of text")
    ids = (random_input_ids(vocab, batch, seq_len, seed) if input_ids is None
           else check_input_ids(input_ids, vocab))
    n = check_generate(generate, None if input_ids is None else ids)
    if layout is not None and layout.attn_dp > 1:
        check_attn_dp_rows(layout.attn_dp, ids.shape[0], n)
    stored = checkpoint_dtype(source.checkpoint)
    # the model's own folder (a random checkpoint's config.json is rebuilt and names no EOS)
    own = source.tokenizer_dir or (None if source.random_weights else source.checkpoint)
    dtype, note = run_dtype(dtype, stored)
    job = Job(cfg, str(source.checkpoint), ids.tolist(), dtype, env.device, env.backend, tuple(names), pp, ep,
              placement, stored, n, eos_token_ids(own) if n else [], layout=layout)
    attn_dp = layout.attn_dp if layout else 1
    return Prepared(source, ids, describe_injections(names, cfg, tp_size, attn_dp), env, job,
                    [note] if note else [])


def carved_layout(rules: str, tp: int, pp: int, ep: bool, carve: dict) -> Layout | None:
    """The SGLang layout the ranks run (None under rule sets that do not carve tp), refused in one line as
    the map refuses it; carved fields under a rule set without them are refused there too."""
    rs = ruleset(rules)
    unknown = set(carve) - set(CARVED)
    if unknown:
        raise LayoutError(f"unknown layout field {sorted(unknown)[0]!r}; use {', '.join(CARVED)}")
    layout = Layout(tp, pp, 1, ep, **carve)
    if problem := rs.layout_problem(layout):
        raise LayoutError(problem)
    return layout if rs.carves else None


def check_attn_dp_rows(attn_dp: int, rows: int, generate: int) -> None:
    """Each attention-DP group runs its own rows of the batch: at least one each, and no generation (which
    continues one row)."""
    if generate:
        raise LiveError(f"--generate continues one row, and --attn-dp-size {attn_dp} gives each of its "
                        "groups its own rows: run --generate without --attn-dp-size")
    if rows < attn_dp:
        raise LiveError(f"the input has {rows} row(s) for --attn-dp-size {attn_dp}: each attention-DP group "
                        f"runs its own rows of the batch; give at least {attn_dp} "
                        f"(--batch {attn_dp}, or more {IDS_FLAG} rows)")


def reference(job: Job, device: torch.device) -> dict:
    """The single-device run(s): tp=1 in the run's dtype, plus fp32 when that dtype is low precision,
    computing with the first run's expert choices (so the floor is rounding, not a routing flip: routing.py).
    With job.generate the first generates its own greedy tokens and the fp32 run follows them: out["gen"]."""
    clean = replace(job, inject=(), pp_size=1, ep=False, ref_tokens=None, layout=None)
    out = {"logits": None, "hidden": None, "logits32": None, "hidden32": None, "gen": None}
    out["logits"], out["hidden"], report = run_model(clean, 0, 1, device)
    out["gen"] = report.get("generation")
    if job.dtype != "float32":
        follow = out["gen"]["gen.tokens"].tolist() if out["gen"] else None
        routes = {layer: r["ids"] for layer, r in split_routing(out["hidden"])[1].items()}
        out["logits32"], out["hidden32"], report = run_model(replace(clean, dtype="float32", follow=follow,
                                                                      follow_routing=routes), 0, 1, device)
        if out["gen"]:
            out["gen"]["gen.last32"] = report["generation"]["gen.last"]
    return out


def generation(prep: Prepared, gen: dict, ref: dict, layers: list[LayerDiff], device: torch.device,
               within=lambda fn, what: fn()):
    """The two continuations and their first difference; when it is past the first step, that step's forward
    pass is compared stage by stage: TP's kept outputs against a tp=1 run on the same common prefix, run by
    `within(fn, what)` (the run's timeout and stop)."""
    n, prompt, dtype = prep.job.generate, prep.input_ids[0].tolist(), prep.job.dtype
    d = int(gen["gen.diverged"][0])
    if d > 0:
        prefix = prompt + ref["gen"]["gen.tokens"][:d].tolist()
        ref_d = within(lambda: reference(replace(prep.job, input_ids=[prefix], generate=0), device),
                       f"the tp=1 re-run of new token #{d + 1} (to compare it stage by stage)")
        # in the check's stage order (safetensors hands the ranks' tensors back sorted by name)
        hidden = {x.name: gen[f"gen.hidden.{x.name}"] for x in layers if f"gen.hidden.{x.name}" in gen}
        layers = compare(gen["gen.logits"], hidden, ref_d, dtype)["layers"]
    tokenizer = prep.source.tokenizer_dir
    decode = TextTokenizer(tokenizer).decode if tokenizer is not None else None
    return build_generation(n, prompt, gen, ref["gen"], dtype, layers if d >= 0 else [], decode, prep.job.eos)


def build_result(prep: Prepared, tp_size: int, tp_logits, tp_hidden, ref: dict, reports: list[dict],
                 phases: dict, seed: int, gen: dict | None = None, device: torch.device | None = None,
                 within=lambda fn, what: fn()) -> VerifyResult:
    """Compare and wrap everything into the user-facing VerifyResult; `gen`: TP's gen.* tensors; `within(fn,
    what)` runs a tp=1 re-run under the run's timeout."""
    start = time.perf_counter()
    fields = compare(tp_logits, tp_hidden, ref, prep.job.dtype)
    if gen:
        fields["generation"] = generation(prep, gen, ref, fields["layers"],
                                          device or torch.device("cpu"), within)
        phases["generate"] = max(r.get("generate_s", 0.0) for r in reports)
    phases["compare"] = time.perf_counter() - start
    notes = list(prep.source.cfg.notes) + prep.notes
    notes += [f"--inject {i.name} has no effect here: {i.reason}" for i in prep.injections
              if not i.has_effect]
    if prep.job.ep and tp_size == 1:
        notes.append("expert parallelism over one rank per stage holds every expert: the "
                     "same split as without it")
    return VerifyResult(model=prep.source.name, tp_size=tp_size, dtype=prep.job.dtype,
                        input_shape=list(prep.input_ids.shape), ranks=[RankReport(**r) for r in reports],
                        environment=prep.env, injections=prep.injections, phases=phases, notes=notes,
                        random_weights=prep.source.random_weights, seed=seed, pp_size=prep.job.pp_size,
                        ep=prep.job.ep, rules=prep.source.cfg.rules,
                        carved=prep.job.layout.carved if prep.job.layout else {},
                        checkpoint_dtype=prep.job.stored_dtype, **fields)


def verify(model, tp_size: int, *, device: str = "auto", dtype: str = "float32", input_ids=None,
           inject: list[str] | None = None, layers: int | None = None, seed: int = 0, batch: int = 2,
           seq_len: int = 32, timeout: float = 300.0, progress=None, tick=None, pp: int = 1, ep: bool = False,
           placement: str = "linear", random_weights: bool = False, download_progress=None,
           prompt: str | None = None, generate: int = 0, rules: str = "vllm",
           carve: dict | None = None) -> tuple[VerifyResult, torch.Tensor]:
    """Run `model` at tp_size (x pp stages, experts whole with ep) and at tp=1 on the same ids; return the
    result and the TP logits. `tick()` is called every 0.1 s while ranks or the tp=1 run work; an exception
    from it stops the run. A preset or hub id runs its real weights, downloaded first (reported to
    `download_progress(message, bytes_done, bytes_total)`), unless random_weights asks for seeded ones.
    A prompt is tokenized with the model's tokenizer; generate=N also continues it by N greedy tokens on TP
    and on tp=1 (result.generation), in the same spawned group. `rules` and `carve` as prepare takes them
    (SGLang: attention DP and --ep carved out of tp)."""
    progress = progress or (lambda phase: None)
    timeout = check_timeout(timeout)
    t0 = time.perf_counter()
    prep = prepare(model, tp_size, device=device, dtype=dtype, input_ids=input_ids,
                   inject=inject, layers=layers,
                   seed=seed, batch=batch, seq_len=seq_len, pp=pp, ep=ep, placement=placement,
                   random_weights=random_weights, download_progress=download_progress, prompt=prompt,
                   generate=generate, rules=rules, carve=carve)
    phases = {"prepare": time.perf_counter() - t0}
    ref_device = torch.device("cuda", 0) if prep.env.device == "cuda" else torch.device("cpu")
    timed: dict = {}

    def timed_reference():  # with generation its picks go to the ranks: publish (spawned) or job (in-process)
        start = time.perf_counter()
        out = reference(prep.job, ref_device)
        timed["reference"] = time.perf_counter() - start
        return out

    progress("spawn")
    # covers everything from here on, to the diverging step's tp=1 re-run
    deadline = time.monotonic() + timeout

    def within(fn, what: str, marks=None):  # in-process work: this deadline, and tick()'s stop
        return run_within(fn, timeout, what, marks, tick, deadline)

    if tp_size * pp == 1:  # nothing to spawn: the "TP" run is one more in-process run, injections included
        ref = within(lambda mark: timed_reference(), "the tp=1 reference")
        job = replace(prep.job, ref_tokens=ref["gen"]["gen.tokens"].tolist() if ref["gen"] else None)
        logits, hidden, report = within(lambda mark: run_model(job, 0, 1, ref_device,
                                                               mark=mark), "the tp=1 run",
                                        progress)  # marks load, forward
        phases.update(spawn=0.0, load=report["load_s"], forward=report["forward_s"])
        gen, reports = report.pop("generation", None), [report]
    else:
        publish = ((lambda ref: {REF_TOKENS_KEY: json.dumps(ref["gen"]["gen.tokens"].tolist())})
                   if prep.job.generate \
            else None)
        group = run_group(prep.job, tp_size, timeout, lambda p: p in ("load", "forward") and progress(p),
                          overlap=timed_reference, tick=tick, publish=publish)
        logits, hidden, reports, ref = group.logits, group.hidden, group.reports, group.overlap_result
        phases.update(group.phases)
        gen = group.extra or None
        if gen:  # the group's forward phase ran every step; the first is the forward pass
            phases["forward"] = max(0.0, phases["forward"] - max(r.get("generate_s", 0.0) for r in reports))
    phases.update(timed)
    progress("compare")
    result = build_result(prep, tp_size, logits, hidden, ref, reports, phases, seed, gen, ref_device,
                          lambda fn, what: within(lambda mark: fn(), what))
    result.phases["total"] = time.perf_counter() - t0
    progress("done")
    return result, logits
