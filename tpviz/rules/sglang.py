"""SGLang 0.5.23, one RuleSet: what it does differently from vLLM, read in the wheel's sglang/srt.

--tp-size is a whole stage's GPUs; attention DP and expert parallelism are carved out of it
(runtime_context.py derive_parallel_widths): attn_tp = tp / attn_dp, moe_tp = tp / ep. Attention-TP groups
and MoE-TP groups are blocks of consecutive GPUs, the EP index outer (distributed/parallel_state.py). Each
model file picks the group of every weight (Groups, on the architecture's record). The vocabulary is padded
to 64, or to 64 x tp when that does not divide (layers/vocab_parallel_embedding.py); the remainder layers of
a pipeline go to the last stages (distributed/utils.py get_pp_indices); routed experts are placed in
contiguous, equal blocks (layers/moe/fused_moe_triton/layer.py). FP8 blocks have no merged-layer exemption and
no MoE refinement (layers/quantization/fp8.py).
"""
import os
from dataclasses import replace

from tpviz.errors import LayoutError, TPSizeError
from tpviz.rules.layout import Layout
from tpviz.rules.served import architecture, backend_served
from tpviz.rules.ruleset import Flags, RuleSet, Widths, divide
from tpviz.rules.sglang_files import (HYBRID_SWA, Groups, classes, group_width, mm_off, record,
                                      transformers_served)

PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE
FILE = "SGLang 0.5.23's"
TOWER_LEFT_OUT = ("SGLang's split of the vision tower (attention over attn_tp, MLP over tp) is not modelled: "
                  "the tower is left out of this map, its memory and its tp checks; vLLM rules draw it")
TOWER_OFF = ("SGLang 0.5.23 builds no vision tower for this model unless --enable-multimodal "
             "(configs/model_config.py), so this map, as its default, holds none; with the flag, the tower's "
             "split is not modelled")


class SglangRuleSet(RuleSet):
    """SGLang's rules where they are not vLLM's; the fields it shares are set in SGLANG_0_5_23."""

    def padded_vocab(self, vocab_size: int, tp: int = 1) -> int:
        """Padded to 64, or to 64 x tp when tp does not divide that (VocabParallelEmbedding.__init__)."""
        pad = PADDING if (-(-vocab_size // PADDING) * PADDING) % tp == 0 else PADDING * tp
        return -(-vocab_size // pad) * pad

    def vocab_rows(self, vocab_size: int, tp_size: int) -> int:
        return divide(self.padded_vocab(vocab_size, tp_size), tp_size, "vocab_size")

    def attn_tp(self, layout: Layout) -> int:
        return layout.tp // max(layout.attn_dp, 1)

    def widths(self, layout: Layout, arch=None) -> Widths:
        g, tp, attn = self.groups(arch), layout.tp, self.attn_tp(layout)
        dp = layout.attn_dp > 1
        under_dp = {"attn_tp": "attn_tp", "dp_whole": "replicated"}  # embeddings attention DP cuts otherwise
        embed = (under_dp[g.embed] if dp else "tp") if g.embed in under_dp else g.embed
        head = "attn_tp" if g.lm_head == "attn_tp" and layout.dp_lm_head and dp else (
            "tp" if g.lm_head == "attn_tp" else g.lm_head)
        return Widths(group_width(g.attention, tp, attn), group_width(g.dense, tp, attn, layout.dense_tp1),
                      tp // layout.ep_size, layout.ep_size, group_width(embed, tp, attn),
                      group_width(head, tp, attn), group_width(g.shared, tp, attn, layout.shared_tp1))

    def groups(self, arch) -> Groups:
        g = record(arch)
        if g is None:
            what = getattr(arch, "model_type", "") or "this model"
            raise TPSizeError(f"tpviz does not model {FILE} {what} model file (its weight groups and "
                              "checks); choose vLLM rules for it")
        return g

    def mla_fused_a(self, arch) -> str:
        g = record(arch)
        return g.fused_a if g else ""

    def param_name(self, arch, name: str) -> str:
        g = record(arch)
        return dict(g.params).get(name, name) if g else name

    def cut_note(self, role: str, cut: int, tp: int) -> str:
        if cut == tp:
            return ""
        return {"attention": f"attention is cut over attn_tp_size = tp / attn_dp_size = {cut}: ",
                "experts": f"each expert is cut over moe_tp_size = tp / ep_size = {cut}: ",
                "embed": f"the embedding is cut over attn_tp_size = {cut}: ",
                "lm_head": f"the lm_head is cut over attn_tp_size = {cut}: "}.get(role, "")

    def layout_problem(self, layout: Layout, spec=None) -> str | None:
        """What SGLang refuses about the layout, before any weight: its own words where it has them, and the
        flag that fixes a bare assert."""
        tp, a, ep = layout.tp, layout.attn_dp, layout.ep_size
        if layout.ep:
            return ("SGLang's expert parallelism is --ep N (a divisor of --tp): vLLM's "
                    "--enable-expert-parallel over tp x dp is --ep tp here")
        if a < 1:
            return f"--attn-dp-size must be positive (got {a})."
        if a > 1 and layout.dp > 1:
            return (f"--dp-size {layout.dp} with --attn-dp-size {a}: data-parallel replicas combined with "
                    "attention data parallelism are not supported.")
        if tp % a:
            return (f"--attn-dp-size {a} does not divide --tp {tp} (SGLang asserts tp_size % attn_dp_size "
                    f"== 0): use a divisor of {tp}")
        if ep < 1 or ep > tp or tp % ep:
            return (f"--ep {ep} does not divide --tp {tp} (SGLang: parallel topology is inconsistent, "
                    f"tp_size == moe_ep_size * moe_dp_size * moe_tp_size): use a divisor of {tp}")
        if spec is None:
            return None
        if cls := transformers_served(spec.config):  # not with the groups of the file tpviz read for its type
            return (f"{FILE} model registry has no {cls}, so SGLang would try its Transformers backend "
                    "(model_loader/utils.py), which tpviz does not model; choose vLLM rules for it")
        g = self.groups(spec.arch)
        if g.check and (problem := g.check(spec, layout)):
            return f"{FILE} {g.file} {problem}"
        if layout.pp > 1 and g.pp_broken and architecture(spec.config) == g.pp_broken[0]:
            return f"{FILE} {g.pp_broken[1]}: tpviz does not map it at --pp-size > 1; use --pp-size 1"
        if layout.pp > 1 and not g.pp:
            return f"Pipeline Parallel is not compatible with this model. ({FILE} {g.file} has no PP)"
        if layout.pp > 1 and g.head_every_stage and spec.tie_word_embeddings:
            return (f"{FILE} {g.file} ties the lm_head to embed_tokens, which only the first pipeline stage "
                    "holds: tpviz does not model tied embeddings at --pp-size > 1 there")
        deep = spec.tower.deepstack if spec.tower and g.deepstack_first and layout.pp > 1 else 0
        if deep and self.pp_partition(spec.num_hidden_layers, layout.pp)[0] < deep:
            return (f"start_layer should be greater than or equal to len(deepstack_visual_indexes) ({FILE} "
                    f"{g.file}: the first pipeline stage must hold the {deep} layers the vision tower's "
                    "deepstack feeds): use fewer stages or SGLANG_PP_LAYER_PARTITION")
        if a > 1 and g.attention == "tp":  # pool_configurator sizes the KV cache per attention group
            return (f"{FILE} {g.file} cuts attention over the whole --tp even with --attn-dp-size {a}, while "
                    "its KV cache is sized per attention group: tpviz does not model that mismatch (use "
                    "--dp-size replicas; Qwen3, Qwen3-MoE and DeepSeek cut attention over the group)")
        if (ep > 1 or layout.dense_tp1 or layout.shared_tp1) and not spec.is_moe:
            return f"{spec.name} has no experts: --ep, --moe-dense-tp-size 1 and SGLANG_SHARED_EXPERT_TP1 " \
                   "are for MoE models"
        if spec.is_moe and spec.num_experts % ep:
            # eplb/expert_location.py and FusedMoE assert it bare
            return (f"--ep {ep} does not divide the {spec.num_experts} routed experts (SGLang places them "
                    f"in equal contiguous blocks): use an --ep that divides {spec.num_experts}")
        if layout.dense_tp1 and g.dense != "switch":
            return f"--moe-dense-tp-size 1 does not change {g.file}'s dense MLPs (it reads it for " \
                   "DeepSeek and GLM-4 MoE only)"
        if layout.shared_tp1 and g.shared != "switch":
            return f"SGLANG_SHARED_EXPERT_TP1 does not change {g.file}'s shared experts"
        if layout.shared_tp1 and self.fused(layout, spec):
            return (f"SGLANG_SHARED_EXPERT_TP1 does not change {spec.arch.sglang.fuses_shared}'s shared "
                    "expert at --ep 1: SGLang fuses it into the routed experts there (use --ep > 1 to "
                    "keep it apart and whole)")
        if spec.is_moe and g.expert_limit:
            width = tp if g.expert_limit == "tp" else tp // ep
            if width > spec.num_experts:
                return (f"Tensor parallel size {width} is greater than the number of "
                        f"experts {spec.num_experts}.")
        return None

    def load_problem(self, layout: Layout, spec) -> str | None:
        """ModelRunner.__init__'s check_quantized_moe_compatibility (moe_ep_setup.py), after loading: for any
        config whose quantization_config has weight_block_size and whose text config has
        moe_intermediate_size, whether the experts are quantized or not (NVIDIA; AMD's aiter skips it)."""
        q, text = spec.quant, spec.config.get("text_config")
        inter = (text if isinstance(text, dict) else spec.config).get("moe_intermediate_size")
        if (q is None or q.method != "fp8" or not q.block or isinstance(inter, bool)
                or not isinstance(inter, int)):
            return None
        tp, ep, n = layout.tp, layout.ep_size, q.block[0]
        moe_tp = tp // ep
        if inter % moe_tp:
            return (f"moe_intermediate_size {inter} must be divisible by moe_tp_size ({moe_tp}) which is "
                    f"tp_size ({tp}) divided by moe_ep_size ({ep}).")
        if not layout.shared_tp1 and (inter // moe_tp) % n:
            return (f"For quantized MoE models, please make sure (moe_intermediate_size={inter} / "
                    f"moe_tp_size={moe_tp}) % weight_block_size_n={n} == 0 where moe_tp_size is equal to "
                    f"tp_size ({tp}) divided by ep_size ({ep}). You can fix this by setting arguments `--tp` "
                    "and `--ep` correctly.")
        return None

    def head_on_every_stage(self, arch) -> bool:
        g = record(arch)
        return bool(g and g.head_every_stage)

    def embed_on_every_stage(self, arch) -> bool:
        """As the model file builds embed_tokens: most read (llama.py, qwen2.py, qwen2_moe.py, mixtral.py,
        deepseek_v2.py, glm4_moe.py) on the first stage alone, minimax_m2.py on every stage; gemma2/3 support
        no pipeline parallelism."""
        g = record(arch)
        return bool(g and g.embed_every_stage)

    def fused(self, layout: Layout, spec) -> bool:
        """Whether the model file fuses the shared expert into the MoE: DeepSeek-V3/R1 on NVIDIA at --ep 1
        (deepseek_v2.py shared_experts_fusion_disable_reason: 256 routed experts, one shared, moe_ep_size
        1), GLM-4.5 on NVIDIA from Ampere on at --ep 1 (glm4_moe.py's)."""
        g = record(spec.arch)
        return bool(g and g.fuses_shared and layout.ep_size == 1 and spec.shared_expert_intermediate_size
                    and (g.fuses_shared != "DeepSeek-V3" or spec.num_experts == 256))

    def caps_window(self, spec) -> bool:
        return bool(set(classes(spec.config)) & set(HYBRID_SWA))

    def joint_reduce(self, spec) -> bool:
        g = record(spec.arch)
        return spec.joint_reduce and not (g and g.reduces_apart)

    def dense_replicated(self, arch) -> str:
        """SGLang's own files split the MLPs that vLLM's Transformers backend keeps whole (gpt_bigcode.py)."""
        return "" if record(arch) else arch.dense_replicated

    def router_fp32(self, arch) -> bool:
        g = record(arch)
        return arch.router_fp32 and not (g and g.router_in_model_dtype)

    def qkv_order(self, arch) -> str:
        g = record(arch)
        return g.qkv_order if g else ""

    def regroups_qkv(self, arch) -> bool:
        return arch.regroups_qkv and not self.qkv_order(arch)

    def own_notes(self, spec) -> list[str]:
        """SGLang's own file serves it: the record's note on vLLM's path (its Transformers backend, or a
        Groups.note standing for it) gives way, and the file's own note joins."""
        g, arch = record(spec.arch), spec.arch
        if g is None:
            return spec.notes
        vllm_only = arch.note and (g.note is not None or backend_served(arch.hf_class))
        notes = [n for n in spec.notes if not (vllm_only and n == arch.note)]
        return notes + ([g.note] if g.note and g.note not in notes else [])

    def tower_notes(self, spec) -> list[str]:
        if not spec.tower:
            return []
        return [TOWER_OFF if mm_off(spec.config) else TOWER_LEFT_OUT]

    def layout_notes(self, layout: Layout, spec) -> list[str]:
        notes = super().layout_notes(layout, spec)  # an embedding on every stage
        if self.fused(layout, spec):
            who = spec.arch.sglang.fuses_shared
            where = ("on Ampere and Hopper" if who == "DeepSeek-V3" else "on NVIDIA GPUs from Ampere on")
            notes.append(f"SGLang fuses {who}'s shared expert into the routed experts at --ep 1 {where} (as "
                         f"expert {spec.num_experts}, cut tp ways: the rows drawn for the shared expert; its "
                         "FP8 checks are the MoE's)" + ("; Blackwell's default TRT-LLM runner keeps it apart"
                                                        if who == "DeepSeek-V3" else ""))
        sliding = sum(1 for layer in spec.layers if getattr(layer.mixer, "window", 0))
        if sliding and not self.caps_window(spec):
            notes.append(f"SGLang 0.5.23 keeps no sliding-window pool for this model "
                         f"(configs/model_config.py is_hybrid_swa_model): its {sliding} sliding layers cache "
                         "every token of the context, so the cache is counted as full attention's")
        tower, attn = spec.tower, self.attn_tp(layout)
        if tower and tower.heads % attn:  # the tower is left out (plan/tower.py): nor is its tp checked
            notes.append(("with --enable-multimodal, " if mm_off(spec.config) else "") +
                         "SGLang may refuse this layout for the vision tower, which tpviz does not check: "
                         f"its {tower.heads} heads do not divide attn_tp_size = {attn}, and {FILE} "
                         "VisionAttention (layers/attention/vision.py) divides them by it unless the model "
                         "file runs the encoder data-parallel (--mm-enable-dp-encoder, where it reads the "
                         "flag)")
        return notes

    def pp_override(self, text: str, num_layers: int, pp: int) -> list[int] | None:
        """SGLANG_PP_LAYER_PARTITION, ignored at pp 1, checked in get_pp_indices' own words."""
        if pp == 1:
            return None
        try:
            parts = [int(x) for x in text.split(",")]
        except ValueError:
            raise LayoutError(f"Invalid partition string: {text}") from None
        if len(parts) != pp:
            raise LayoutError(f"len(partitions)={len(parts)} does not match pp_size={pp}.")
        if sum(parts) != num_layers:
            raise LayoutError(f"sum(partitions)={sum(parts)} does not match num_hidden_layers={num_layers}.")
        return parts

    def pp_even(self, num_layers: int, pp: int) -> list[int]:
        """get_pp_indices: an even share, the remainder on the last stages."""
        base, extra = divmod(num_layers, pp)
        return [base + (1 if stage >= pp - extra else 0) for stage in range(pp)]

    def expert_placement(self, num_experts: int, ep_size: int, placement: str = "linear") -> list[list[int]]:
        """Equal contiguous blocks (_map_global_expert_id_to_local_expert_id); uneven is refused."""
        if placement not in self.placements:
            raise LayoutError(f"expert placement {placement!r}: SGLang places experts in contiguous blocks")
        if ep_size < 1 or num_experts % ep_size:
            raise LayoutError(f"--ep {ep_size} does not divide the {num_experts} routed experts")
        n = num_experts // ep_size
        return [list(range(r * n, (r + 1) * n)) for r in range(ep_size)]

    def candidates(self, gpus: int, moe: bool) -> list[Layout]:
        """Every tp x pp x dp = gpus, and inside each tp (one replica) its attention-DP and EP sizes."""
        out = []
        for plain in super().candidates(gpus, False):
            tp = plain.tp
            divisors = [n for n in range(1, tp + 1) if tp % n == 0]
            for attn_dp in divisors if plain.dp == 1 else [1]:
                for ep in divisors if moe else [1]:
                    out.append(replace(plain, attn_dp=attn_dp, ep_size=ep))
        return out

    def launch(self, model: str, layout: Layout, placement: str = "linear") -> str:
        parts = ([f"{self.pp_env}={os.environ[self.pp_env]}"]
                 if layout.pp > 1 and os.environ.get(self.pp_env) else [])
        parts += ["SGLANG_SHARED_EXPERT_TP1=1"] if layout.shared_tp1 else []
        parts += [self.flags.command.format(model=model), f"--tp-size {layout.tp}"]
        for flag, value, default in (("--pp-size", layout.pp, 1), ("--dp-size", layout.dp, 1),
                                     ("--attn-dp-size", layout.attn_dp, 1), ("--ep-size", layout.ep_size, 1)):
            if value != default:
                parts.append(f"{flag} {value}")
        parts += ["--moe-dense-tp-size 1"] if layout.dense_tp1 else []
        parts += ["--enable-dp-lm-head"] if layout.dp_lm_head else []
        return " ".join(parts)


SGLANG_0_5_23 = SglangRuleSet(
    "sglang", "SGLang", "0.5.23",
    "SGLang 0.5.23: --tp is the stage; attention DP and --ep are carved out of it; vocab padded to 64 "
    "(64 x tp when that does not divide); no FP8 merged-layer exemption, no MoE scale refinement; pipeline "
    "remainder on the last stages.",
    Flags("python -m sglang.launch_server --model-path {model}", "--tp-size", "--pp-size", "--dp-size",
          "--ep-size"),
    fp8_merged_exempt=False, fp8_moe_refine=False, fp8_merged_at_tp1=True, model_checks=False,
    pp_env="SGLANG_PP_LAYER_PARTITION", placements=("linear",), carves=True, hybrid_pages=False,
    dp_moe_exchange=False,
    # at most 4096 running requests per worker by default (model_executor/pool_configurator.py
    # _resolve_max_running_requests_per_worker: clamped to 2048..4096, and to half the token pool)
    max_num_seqs=(4096, 4096),
    notes={"ep_hint": " --ep N cuts each expert tp / N ways instead (--ep equal to --tp keeps them whole)."})
