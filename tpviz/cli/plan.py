"""`python -m tpviz plan MODEL --gpus N (--gpu NAME | --gpu-mem GIB)`: every layout of N GPUs, ranked by fit
and KV room, or (with --gpu) by a speed bound for a workload."""
import json

from tpviz.cli.tables import print_warnings
from tpviz.config.sources import load_spec
from tpviz.deploy.fit import capped_context
from tpviz.deploy.hardware import Topology, gpu_type
from tpviz.deploy.perf import BOUND_NOTE, EFFICIENCY, EP_SAME, ROUTING, TERM_LABELS, Workload, left_out
from tpviz.deploy.ranking import plan_notes, plan_rows, rank_engines
from tpviz.deploy.traffic import LEAST_NOTE
from tpviz.errors import TpvizError
from tpviz.render.text import fmt_bytes
from tpviz.rules import engines_of, ruleset


def speed_inputs(args) -> tuple[Topology | None, Workload | None, float, int]:
    """The topology and workload of a speed ranking (none without --gpu), the GPU memory and the context."""
    lengths = args.input_len is not None or args.output_len is not None
    speed_only = [f for f, v in (("--input-len", args.input_len), ("--output-len", args.output_len),
                                 ("--concurrency", args.concurrency), ("--tpot-ms", args.tpot_ms),
                                 ("--ttft-ms", args.ttft_ms)) if v is not None]
    if args.gpu is None:
        if args.gpu_mem is None:
            raise TpvizError("plan needs --gpu NAME (h100, h200, b200, mi300x, ...) or --gpu-mem GIB")
        if speed_only:
            raise TpvizError(f"{speed_only[0]} sets the speed ranking's workload: add --gpu NAME (h100, "
                             "h200, b200, mi300x, ...) to rank by speed")
        return None, None, args.gpu_mem, 8192 if args.context is None else args.context
    if lengths and args.context is not None:
        raise TpvizError("give --context or --input-len/--output-len, not both (the context is their sum)")
    gpu = gpu_type(args.gpu)
    output = args.output_len or (min(1024, args.context // 2) if args.context and args.context > 1 else 1024)
    prompt = args.input_len or ((args.context - output) if args.context and args.context > 1 else 1024)
    text = args.concurrency
    if text is not None and text != "max" and not text.isdigit():
        raise TpvizError(f"--concurrency {text!r}: give a number of requests, or max")
    concurrency = (None if args.goal == "throughput" else 1) if text is None else \
        None if text == "max" else int(text)
    work = Workload(prompt, output, concurrency, args.goal, args.tpot_ms, args.ttft_ms)
    return Topology(gpu, args.gpus_per_node), work, args.gpu_mem or gpu.mem_gib, work.context


def cmd_plan(args) -> int:
    """Every layout of --gpus GPUs: accepted ones ranked (by speed with --gpu, else fit then KV room),
    rejected ones with their rule."""
    if args.concurrency == "max" and args.goal == "latency":
        raise TpvizError("--goal latency ranks by TPOT at a concurrency: give --concurrency N, not max")
    topo, work, gpu_gib, context = speed_inputs(args)
    spec = load_spec(args.model)
    spec = spec.served(mm_encoder=args.mm_encoder_tp_mode)
    engines = engines_of(args.rules)
    pairs = rank_engines(spec, args.gpus, gpu_gib, engines, args.util, context, topo, work)
    rows, row_rules = [r for _, r in pairs], [rs for rs, _ in pairs]
    notes = list(dict.fromkeys(n for e in engines for n in plan_notes(spec, e, any(r.fits for r in rows),
                                                                        context)))
    both = len(engines) > 1
    label = (lambda rs, r: f"{rs.label}: {r.layout.label}") if both else (lambda rs, r: r.layout.label)
    if work:
        notes.append(f"{BOUND_NOTE.format(EFFICIENCY)} ({left_out(spec)})")
        notes += [ROUTING] if spec.is_moe else []
        notes += [EP_SAME] if any(r.perf and r.layout.ep for r in rows) else []
    if args.json:
        out = {"schema": "tpviz.plan/2" if work else "tpviz.plan/1", "model": spec.name, "rules": args.rules,
               "engine": " + ".join(ruleset(e).label for e in engines),
               "gpus": args.gpus, "gpu_mem_gib": gpu_gib, "utilization": args.util, "context": context,
               "notes": notes, "layouts": plan_rows(rows, speed=work is not None)}
        if work:
            out |= {"gpu": topo.gpu.name, "gpus_per_node": topo.gpus_per_node,
                    "workload": {"input_len": work.input_len, "output_len": work.output_len,
                                 "concurrency": work.concurrency or "max", "goal": work.goal,
                                 "tpot_ms": work.tpot_ms, "ttft_ms": work.ttft_ms},
                    "efficiency": EFFICIENCY}
        for row, r, rs in zip(out["layouts"], rows, row_rules):
            row |= {"engine": rs.label, **({"launch": rs.launch(spec.name, r.layout) if r.problem is None
                                            else None} if work else {})}
        print(json.dumps(out, indent=1))
        return 0
    context = capped_context(spec, context)[0]
    named = " + ".join(ruleset(e).label for e in engines)
    head = f"{spec.name} on {args.gpus} × {gpu_gib:g} GiB ({named} rules, context {context:,})"
    if work:
        head = (f"{spec.name} on {args.gpus} × {topo.gpu.label}, {topo.gpus_per_node} per node "
                f"({named} rules): {work.input_len:,} in + {work.output_len:,} out, concurrency "
                f"{work.concurrency or 'max'}, goal {work.goal}"
                + (f", TPOT ≤ {work.tpot_ms:g} ms" if work.tpot_ms else "")
                + (f", TTFT ≤ {work.ttft_ms:g} ms" if work.ttft_ms else ""))
    print(head)
    wide = max([28] + [len(label(rs, r)) for rs, r in pairs])
    speed_head = (f"{'TPOT ms':>8} {'tok/s/GPU':>10} {'TTFT ms':>8} {'batch':>6}  {'bottleneck':<26}"
                  if work else "")
    print(f"{'layout':<{wide}} {'weights/GPU':>12} {'KV tokens':>11} {'sequences':>10} "
          f"{'comm/token':>11} {speed_head} verdict")
    for rs, r in pairs:
        verdict = ("fits" if r.fits else "does not fit") + (" (warning below)" if r.warnings else "") \
            if r.problem is None else f"rejected: {r.problem}"
        if work and r.fits and not r.max_sequences:
            verdict = "the weights fit, not one whole sequence of the workload"
        if work and r.perf:
            p = r.perf
            verdict += "" if p.meets else " (misses the limit)"
            verdict += f" (crosses nodes: {', '.join(p.crosses)})" if p.crosses else ""
        numbers = (f"{fmt_bytes(r.weights):>12} {r.kv_tokens:>11,} {r.max_sequences:>10,} "
                   f"{fmt_bytes(r.comm_per_token) if r.comm_per_token is not None else 'n/a':>11}"
                   if r.problem is None else f"{'':>12} {'':>11} {'':>10} {'':>11}")
        if work:
            p = r.perf
            numbers += (f" {p.tpot_ms:>8.2f} {p.out_tok_s_per_gpu:>10,.0f} {p.ttft_ms:>8.1f} {p.batch:>6,}  "
                        f"{p.bottleneck_label:<26}" if p else f" {'':>8} {'':>10} {'':>8} {'':>6}  {'':<26}")
        print(f"{label(rs, r):<{wide}} {numbers}  {verdict}")
    print_warnings({w for r in rows if r.problem is None for w in r.warnings},
                   "plan --json gives each layout's")
    if any(r.problem is None and r.comm_per_token is None for r in rows):
        notes = [*notes, "comm/token n/a: SGLang's attention-DP gathers and expert-parallel sums are not "
                         "modelled exactly" + (f"; {LEAST_NOTE}" if work else "")]
    if work and (first := next(((rs, r) for rs, r in pairs if r.perf), None)):
        best_rules, best = first
        terms = ", ".join(f"{TERM_LABELS[k]} {v:.2f}" for k, v in sorted(best.perf.terms.items(),
                                                                        key=lambda kv: -kv[1]))
        print(f"first: {best_rules.launch(spec.name, best.layout)}")
        print(f"  its terms (ms per output token): {terms}")
    for note in notes:
        print(f"note: {note}")
    return 0
