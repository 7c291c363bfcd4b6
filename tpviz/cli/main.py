"""Command line: `python -m tpviz map|valid|plan|verify ...`. User errors exit 2 with one line on stderr."""
import argparse
import os
import sys
import threading
from importlib import import_module

from tpviz.config.spec import KV_DTYPES, SERVE_DTYPES
from tpviz.config.tower import MODES
from tpviz.errors import TpvizError
from tpviz.rules import BOTH, RULES, ruleset


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, exit 2
        raise TpvizError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m tpviz", description="See and check tensor-parallel weight sharding.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("map", help="print where every tensor goes, optionally write JSON / PNG")
    p.add_argument("model", help="preset or hub id (owner/name), or a local config.json / checkpoint folder")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    p.add_argument("--rules", choices=RULES, default="vllm")
    p.add_argument("--json", metavar="PATH", help="write the shard map (schema tpviz.shardmap/4)")
    p.add_argument("--png", metavar="DIR", help="write one PNG per figure into DIR")
    p.add_argument("--dtype", choices=SERVE_DTYPES, default="auto",
                   help="weight dtype served (auto: float32 -> bf16)")
    p.add_argument("--kv-cache-dtype", choices=list(KV_DTYPES), default="auto")
    p.add_argument("--mm-encoder-tp-mode", choices=MODES, default="weights",
                   help="a vision tower's weights split over tp (weights), or whole on every GPU (data)")
    p.add_argument("--gpu-mem", type=float, metavar="GIB",
                   help="GPU memory: print whether it fits and how many sequences")
    p.add_argument("--util", type=float, help="gpu_memory_utilization with --gpu-mem (default 0.9)")
    p.add_argument("--context", type=int, help="tokens per sequence with --gpu-mem (default 8192)")
    p.add_argument("--concurrency", type=int,
                   help="sequences that should fit at once, with --gpu-mem (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (vLLM's partition of the layers)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    p.add_argument("--ep", nargs="?", type=int, const=0, default=None, metavar="N",
                   help="expert parallelism: vLLM, whole experts on the tp x dp GPUs; SGLang, --ep N experts "
                        "groups each cutting its experts tp / N ways (bare --ep: N = tp)")
    p.add_argument("--attn-dp-size", type=int, default=1, metavar="N",
                   help="SGLang: N attention-DP groups of tp / N GPUs inside the tp GPUs")
    p.add_argument("--moe-dense-tp-size", type=int, metavar="N",
                   help="SGLang: 1 keeps the dense MLPs whole on every GPU (DeepSeek)")
    p.add_argument("--enable-dp-lm-head", action="store_true",
                   help="SGLang: the lm_head cut over the attention-DP group")
    p.add_argument("--placement", choices=ruleset().placements,
                   help="expert placement with --ep (default linear)")
    p.set_defaults(command_module="map", func="cmd_map")
    p = sub.add_parser("valid",
                       help="which tp sizes work, under every rule set (vLLM 0.33, vLLM 0.28, "
                            "SGLang 0.5.23, nano-vllm)")
    p.add_argument("model")
    p.add_argument("--max-tp", type=int, default=64, help="the largest tp size tried (default 64)")
    p.add_argument("--json", action="store_true", help="print the table as JSON (schema tpviz.valid/1)")
    p.set_defaults(command_module="tables", func="cmd_valid")
    p = sub.add_parser("plan", help="every tp x pp x dp (+ expert parallel) layout of N GPUs, ranked (by a "
                                    "speed bound with --gpu)")
    p.add_argument("model")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in total")
    p.add_argument("--mm-encoder-tp-mode", choices=MODES, default="weights",
                   help="a vision tower's weights split over tp (weights), or whole on every GPU (data)")
    p.add_argument("--gpu", metavar="NAME",
                   help="GPU type (h100, h200, b200, mi300x, ... or custom:mem=..,hbm=..,bf16=..): ranks by "
                        "a speed bound; its memory unless --gpu-mem")
    p.add_argument("--gpu-mem", type=float, metavar="GIB", help="memory of each GPU (needed without --gpu)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--rules", choices=(*RULES, BOTH), default="vllm",
                   help=f"a rule set, or {BOTH}: both engines in one ranking")
    p.add_argument("--util", type=float, default=0.9, help="gpu_memory_utilization (default 0.9)")
    p.add_argument("--context", type=int, help="tokens per sequence (default 8192; with --gpu: "
                                               "--input-len + --output-len)")
    p.add_argument("--input-len", type=int, help="prompt tokens per request, with --gpu (default 1024)")
    p.add_argument("--output-len", type=int, help="output tokens per request, with --gpu (default 1024)")
    p.add_argument("--concurrency", default=None, metavar="C|max",
                   help="requests at once, with --gpu (default: max for throughput, 1 for latency)")
    p.add_argument("--goal", choices=("throughput", "latency"), default="throughput",
                   help="most output tokens/s per GPU (within --tpot-ms), or the lowest TPOT")
    p.add_argument("--tpot-ms", type=float, help="TPOT limit with --gpu (ms per output token)")
    p.add_argument("--ttft-ms", type=float, help="TTFT limit with --gpu (ms)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (schema tpviz.plan/1; "
                                                                 "tpviz.plan/2 with --gpu)")
    p.set_defaults(command_module="plan", func="cmd_plan")
    p = sub.add_parser("compare",
                       help="vLLM 0.33's layouts of N GPUs beside the same deployment in SGLang 0.5.23")
    p.add_argument("model")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in total")
    p.add_argument("--gpu-mem", type=float, required=True, metavar="GIB", help="memory of each GPU")
    p.add_argument("--util", type=float, default=0.9, help="gpu_memory_utilization (default 0.9)")
    p.add_argument("--context", type=int, default=8192, help="tokens per sequence")
    p.add_argument("--json", action="store_true", help="print the pairs as JSON (schema tpviz.compare/1)")
    p.set_defaults(command_module="tables", func="cmd_compare")
    sub.add_parser("verify",
                   help="run a real TP forward pass and check it against one device (see verify -h)",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["verify"]:
        return import_module("tpviz.cli.verify").main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        # each command's module is imported when it runs: `valid` and `plan` never load the plots
        return getattr(import_module(f"tpviz.cli.{args.command_module}"), args.func)(args)
    except TpvizError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head
        return 0
    except OSError as e:  # e.g. an unwritable --json path
        print(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def leave(code: int) -> None:
    """Exit with `code`; when a timed-out tp=1 run is still inside torch on its abandoned thread, skip the
    interpreter's shutdown, which would abort on it (SIGABRT, "terminate called without an active
    exception")."""
    if any(t.name == "tpviz-in-process" and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
