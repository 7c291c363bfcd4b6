"""The live model for one rank: the embedding (first stage, or every stage as vLLM builds it), this stage's
decoder layers (each family's block, blocks.decoder_layer), the final norm and the lm_head (last stage)."""
import torch
from torch import nn

from tpviz.layers import ParallelLMHead, VocabParallelEmbedding
from tpviz.live.model.blocks import decoder_layer, final_norm
from tpviz.live.model.config import LiveConfig, Stage, check_supported
from tpviz.live.model.dp import DpRows


def cut(stage: Stage, role: str, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """(ways cut, rank) of a role: its own group in a carved SGLang layout, else the stage's tp."""
    return stage.cuts.of(role) if stage.cuts else (tp_size, tp_rank)


class Elsewhere(nn.Module):
    """A decoder layer held by another pipeline stage (vLLM's PPMissingLayer): no parameters here."""


class DecoderModel(nn.Module):
    """`model.*` of the checkpoint: embedding (the first stage; every stage where vLLM's model file builds it
    so), this stage's decoder layers, final norm (last)."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, stage: Stage, rows: DpRows):
        super().__init__()
        s = cfg.spec
        if stage.embed:  # every stage's, where vLLM's model file builds it so; the first runs it
            embed = cut(stage, "embed", tp_size, tp_rank)
            self.embed_tokens = VocabParallelEmbedding(s.vocab_size, s.hidden_size, *embed, rules=cfg.rules)
        self.layers = nn.ModuleList(decoder_layer(cfg, tp_size, tp_rank, i, stage.experts, stage.cuts, rows)
                                    if i in stage.layers else Elsewhere() for i in range(s.num_hidden_layers))
        if stage.last:
            self.norm = final_norm(cfg)


class LiveForCausalLM(nn.Module):
    """The model for one rank; forward returns (logits, gathered to the last stage's TP rank 0, else None;
    the hidden state after each of this stage's steps, the last of which a pipeline stage sends on). Under
    SGLang's attention DP the hidden states are this GPU's group's rows (rows.own)."""

    def __init__(self, cfg: LiveConfig, tp_size: int = 1, tp_rank: int = 0, stage: Stage | None = None):
        super().__init__()
        check_supported(cfg.spec)
        self.cfg, self.tp_size, self.tp_rank = cfg, tp_size, tp_rank
        self.stage = stage = stage or Stage(tuple(range(cfg.spec.num_hidden_layers)))
        self.rows = DpRows(stage.cuts)  # attention DP: this GPU's rows of the batch (one for every layer)
        self.model = DecoderModel(cfg, tp_size, tp_rank, stage, self.rows)
        if stage.last:
            # same padded row block per rank: one Parameter
            tied = cfg.spec.tie_word_embeddings and stage.embed
            # a tied head allocates nothing
            with torch.device("meta" if tied else torch.get_default_device()):
                self.lm_head = ParallelLMHead(cfg.spec.vocab_size, cfg.spec.hidden_size,
                                              *cut(stage, "lm_head", tp_size, tp_rank), rules=cfg.rules)
            if tied:
                self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, h: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Logits [B, S, vocab] (padding trimmed) on the last stage, and the hidden state after each step;
        `h` is what the previous pipeline stage sent (None on the first stage)."""
        rows = self.rows
        rows.begin(input_ids.shape[0])
        embed, head = (self.stage.cuts.of(role)[0] if self.stage.cuts else self.tp_size
                       for role in ("embed", "lm_head"))
        own = rows.own(input_ids)  # attention DP: this group's rows; h from the stage before holds them too
        positions = torch.arange(own.shape[1], device=own.device).expand_as(own)
        hidden = {}
        if self.stage.first:
            h = rows.run(self.model.embed_tokens, own, embed)
            # Gemma: the scale rounded to the activation dtype first, as transformers does
            if self.cfg.embed_scale:
                h = h * torch.tensor(self.cfg.embed_scale, dtype=h.dtype, device=h.device)
            hidden["embed"] = h
        for i in self.stage.layers:
            h = hidden[f"layer {i}"] = self.model.layers[i](positions, h)
        if not self.stage.last:
            return None, hidden
        h = hidden["final norm"] = self.model.norm(h)
        # None on TP ranks but 0: rank 0 gathered the whole vocabulary; an lm_head over more GPUs than the
        # attention group (SGLang without --enable-dp-lm-head) computes every group's rows; rank 0 keeps them
        logits = self.lm_head(rows.gather(h) if rows.gathers(head) else h)
        if logits is not None and self.cfg.final_softcap:  # Gemma: elementwise, on the gathered logits
            logits = torch.tanh(logits / self.cfg.final_softcap) * self.cfg.final_softcap
        return logits, hidden
