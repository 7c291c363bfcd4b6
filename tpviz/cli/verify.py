"""`tpviz verify MODEL --tp N`: run a real TP forward pass and check it against tp=1.

Exit codes: 0 pass, 1 mismatch, 2 bad input or a run that could not finish (one line on stderr).
Also runs as one rank under `torchrun --nproc-per-node N -m tpviz verify MODEL ...`.
"""
import argparse
import json
import sys
import time
from pathlib import Path

from tpviz.errors import TpvizError
from tpviz.cli.outpaths import writable_file
from tpviz.live.check.inject import INJECTIONS
from tpviz.live.check.memory import available_memory, check_memory, input_shape, plan_memory
from tpviz.live.check.verify import carved_layout, verify
from tpviz.live.errors import check_timeout
from tpviz.live.errors import for_cli
from tpviz.live.load.download import human_size
from tpviz.live.load.inputs import read_input_ids, write_logits
from tpviz.live.run.runner import choose_backend
from tpviz.live.run.runner import interrupt_on_sigterm
from tpviz.live.run.torchrun import SharedError, launched_by_torchrun, torchrun_rank
from tpviz.live.run.torchrun import verify_torchrun
from tpviz.deploy.parallel import placement_flag
from tpviz.cli.map import layout_from_args
from tpviz.rules import RULES, ruleset

EXIT_PASS, EXIT_MISMATCH, EXIT_BAD_INPUT = 0, 1, 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise _UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The verify command line."""
    p = _Parser(prog="tpviz verify",
                description="Run MODEL split over tp ranks and check it against one device.")
    p.add_argument("model",
                   help="checkpoint folder, preset/hub id (its safetensors are downloaded into the Hugging "
                                 "Face cache), or config.json (random weights)")
    p.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel size (default: WORLD_SIZE under torchrun)")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline stages of tp ranks each, passing hidden states on")
    p.add_argument("--rules", choices=RULES, default="vllm",
                   help="the rule set the ranks split by (sglang: --tp is the stage, attention DP and --ep N "
                        "carved out of it)")
    p.add_argument("--ep", nargs="?", type=int, const=0, default=None, metavar="N",
                   help="expert parallelism: vLLM, routed experts whole on the tp ranks; SGLang, N expert "
                        "groups each cutting its experts tp / N ways (bare --ep: N = tp)")
    p.add_argument("--attn-dp-size", type=int, default=1, metavar="N",
                   help="SGLang: N attention-DP groups of tp / N ranks, each running its own rows "
                        "of the batch")
    p.add_argument("--moe-dense-tp-size", type=int, metavar="N",
                   help="SGLang: 1 keeps the dense MLPs whole on every rank (DeepSeek)")
    p.add_argument("--enable-dp-lm-head", action="store_true",
                   help="SGLang: the lm_head cut over the attention-DP group")
    p.add_argument("--placement", choices=ruleset().placements, default=None,
                   help="how experts are placed on the ranks with --ep")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="float32",
                   help="the run's dtype; auto: the dtype the checkpoint is stored in "
                        "(float32 checks exactly)")
    p.add_argument("--input-ids", metavar="FILE",
                   help=".safetensors with int64 input_ids [batch, seq], or .json")
    p.add_argument("--prompt", metavar="TEXT",
                   help="text input, tokenized with the checkpoint's own tokenizer "
                                                    "(a checkpoint without one takes token "
                                                    "ids such as '1 2 3')")
    p.add_argument("--generate", type=int, metavar="N",
                   help="also continue the prompt (or one row of --input-ids) "
                                                              "by N greedy tokens on TP and "
                                                              "on tp=1, side by side")
    p.add_argument("--dump-logits", metavar="FILE", help="write the TP run's float32 logits as safetensors")
    p.add_argument("--inject", action="append", choices=list(INJECTIONS), default=[], help="inject a TP bug")
    p.add_argument("--json", metavar="FILE", help="write the full result as JSON ('-' for stdout)")
    p.add_argument("--layers", type=int, help="keep only the first K layers (a quick check of a big model)")
    p.add_argument("--batch", type=int, default=None,
                   help="random input rows (without --input-ids; default 2, or --attn-dp-size when more)")
    p.add_argument("--seq-len", type=int, default=32, help="random input length (without --input-ids)")
    p.add_argument("--random-weights", action="store_true",
                   help="seeded random weights instead of the checkpoint's: nothing is downloaded")
    p.add_argument("--seed", type=int, default=0, help="seed for random weights and random input ids")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a hung group is stopped")
    p.add_argument("--quiet", action="store_true", help="print only the verdict line")
    p.add_argument("--dry-run", action="store_true",
                   help="print the memory estimate (weights per rank and in the "
                                                          "tp=1 reference) and exit: nothing "
                                                          "is downloaded or run")
    return p


def dry_run(args, ids) -> None:
    """--dry-run: print the memory estimate, refusing as the run itself would; nothing is downloaded or
    run."""
    for flag, value in (("--tp", args.tp), ("--pp", args.pp)):
        if value < 1:
            raise TpvizError(f"{flag} {value} must be a positive integer")
    env = choose_backend(args.tp * args.pp, args.device)
    shape = input_shape(ids, args.batch, args.seq_len, args.prompt, args.generate)
    layout = carved_layout(args.rules, args.tp, args.pp, args.ep, args.carve)
    est = plan_memory(args.model, args.tp, pp=args.pp, ep=args.ep, rules=args.rules, layout=layout,
                      placement=args.placement, layers=args.layers,
                      dtype=args.dtype, device=env.device, gpus=len(env.gpus),
                      random_weights=args.random_weights, input_shape=shape)
    available = available_memory(env.device, len(env.gpus))
    what = "the prompt's own tokens, " if args.prompt is not None else ""
    print(f"memory estimate: {est.summary(available)}\n(not counted: {what}each process's own "
          "torch and CUDA context)")
    check_memory(est, available)


def _run(args) -> int:

    check_timeout(args.timeout)  # before anything is read or started
    if args.json is not None and args.json != "-":  # output paths too: a typo must not cost a finished run
        writable_file(args.json, "--json", "verify.json")
    if args.dump_logits is not None:
        writable_file(args.dump_logits, "--dump-logits", "logits.safetensors")
    if args.generate is not None and args.generate <= 0:
        raise TpvizError(f"--generate {args.generate} must be a positive number of new tokens")
    if args.prompt is not None and args.input_ids:
        raise TpvizError("give --prompt or --input-ids, not both")
    args.dp, tp = 1, args.tp
    args.tp = args.tp or 1  # under torchrun: WORLD_SIZE, checked there
    layout = layout_from_args(args)  # SGLang's --ep N, --attn-dp-size, ... in its own words
    args.tp, args.ep = tp, layout.ep
    carve = args.carve = layout.carved
    if carve and launched_by_torchrun():
        raise TpvizError("SGLang's carved layouts (--attn-dp-size, --ep N) run with the built-in launcher "
                         "(tpviz verify, no torchrun)")
    if args.batch is None:
        args.batch = max(2, layout.attn_dp)
    args.placement = placement_flag(args.placement, args.ep)
    # read early so a bad file fails before any rank starts; the vocabulary range is checked with the model
    input_ids = read_input_ids(args.input_ids) if args.input_ids else None
    options = dict(device=args.device, dtype=args.dtype, input_ids=input_ids,
                   inject=args.inject, layers=args.layers,
                   seed=args.seed, batch=args.batch, seq_len=args.seq_len, timeout=args.timeout, pp=args.pp,
                   ep=args.ep, placement=args.placement, random_weights=args.random_weights,
                   download_progress=download_progress(), prompt=args.prompt, generate=args.generate or 0,
                   rules=args.rules, carve=carve)
    if not launched_by_torchrun():
        if args.tp is None:
            raise TpvizError("--tp N is required (outside torchrun)")
        if args.dry_run:
            dry_run(args, input_ids)
            return EXIT_PASS
    if launched_by_torchrun():
        result, logits, passed = verify_torchrun(args.model, args.tp, **options)
        if result is None:  # not rank 0: rank 0 reports
            return EXIT_PASS if passed else EXIT_MISMATCH
    else:
        result, logits = verify(args.model, args.tp, **options)
    if args.quiet:  # still say when an injection could not do anything
        print("\n".join([result.headline(),
                         *(f"  note: {n}" for n in result.notes if n.startswith("--inject"))]))
        if result.generation is not None:
            print(f"  generated: {result.generation.divergence(result.layout)}")
    else:
        print(result.summary())
    if args.dump_logits:
        write_logits(args.dump_logits, logits)
    if args.json:
        text = json.dumps(result.to_dict(), indent=2)
        if args.json == "-":
            print(text)
        else:
            try:
                Path(args.json).write_text(text)
            except OSError as e:
                raise TpvizError(f"cannot write {args.json} ({e.strerror or e})") from None
    return EXIT_PASS if result.passed else EXIT_MISMATCH


def download_progress():
    """Report a checkpoint download on stderr: a line when it starts and ends, and every 10% when stderr is no
    terminal (on a terminal huggingface_hub draws its own bars)."""
    state = {"start": None, "step": 0, "ended": False}
    tty = sys.stderr.isatty()

    def report(message: str, done: int, total: int) -> None:
        if state["start"] is None:
            state["start"] = time.perf_counter()
            print(f"tpviz verify: {message}", file=sys.stderr, flush=True)
        elif done >= total:
            if not state["ended"]:
                state["ended"] = True
                print(f"tpviz verify: downloaded in {time.perf_counter() - state['start']:.0f} s",
                      file=sys.stderr, flush=True)
        elif not tty and (step := int(10 * done / max(total, 1))) > state["step"]:
            state["step"] = step
            print(f"tpviz verify:   {10 * step}% of {human_size(total)}", file=sys.stderr, flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m tpviz verify` and `python -m tpviz.cli.verify`; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        with interrupt_on_sigterm():
            return _run(args)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except _UsageError as e:
        print(f"error: tpviz verify: {e}", file=sys.stderr)  # as the other commands' usage errors
        return EXIT_BAD_INPUT
    except TpvizError as e:
        if launched_by_torchrun() and torchrun_rank() != 0:
            if isinstance(e, SharedError):
                return EXIT_BAD_INPUT  # rank 0 prints the same line
            print(f"error: rank {torchrun_rank()}: {for_cli(str(e))}", file=sys.stderr)
        else:
            print(f"error: {for_cli(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:  # a write that failed after the checks (disk full, a path removed meanwhile)
        print(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tpviz verify: interrupted", file=sys.stderr)
        return 130
