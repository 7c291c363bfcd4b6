"""The live model for one rank: the embedding (first stage), this stage's decoder layers (each family's block,
blocks.decoder_layer), the final norm and the lm_head (last stage)."""
import torch
from torch import nn

from tpviz.layers import ParallelLMHead, VocabParallelEmbedding
from tpviz.live.model.blocks import decoder_layer, final_norm
from tpviz.live.model.config import LiveConfig, Stage, check_supported


class Elsewhere(nn.Module):
    """A decoder layer held by another pipeline stage (vLLM's PPMissingLayer): no parameters here."""


class DecoderModel(nn.Module):
    """`model.*` of the checkpoint: embedding (first stage), this stage's decoder layers, final norm
    (last)."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, stage: Stage):
        super().__init__()
        s = cfg.spec
        if stage.first:
            self.embed_tokens = VocabParallelEmbedding(s.vocab_size, s.hidden_size, tp_size,
                                                       tp_rank, rules=cfg.rules)
        self.layers = nn.ModuleList(decoder_layer(cfg, tp_size, tp_rank, i, stage.experts)
                                    if i in stage.layers else Elsewhere() for i in range(s.num_hidden_layers))
        if stage.last:
            self.norm = final_norm(cfg)


class LiveForCausalLM(nn.Module):
    """The model for one rank; forward returns (logits, gathered to the last stage's TP rank 0, else None;
    the hidden state after each of this stage's steps, the last of which a pipeline stage sends on)."""

    def __init__(self, cfg: LiveConfig, tp_size: int = 1, tp_rank: int = 0, stage: Stage | None = None):
        super().__init__()
        check_supported(cfg.spec)
        self.cfg, self.tp_size, self.tp_rank = cfg, tp_size, tp_rank
        self.stage = stage = stage or Stage(tuple(range(cfg.spec.num_hidden_layers)))
        self.model = DecoderModel(cfg, tp_size, tp_rank, stage)
        if stage.last:
            # same padded row block per rank: one Parameter
            tied = cfg.spec.tie_word_embeddings and stage.first
            # a tied head allocates nothing
            with torch.device("meta" if tied else torch.get_default_device()):
                self.lm_head = ParallelLMHead(cfg.spec.vocab_size, cfg.spec.hidden_size, tp_size, tp_rank,
                                              rules=cfg.rules)
            if tied:
                self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, h: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Logits [B, S, vocab] (padding trimmed) on the last stage, and the hidden state after each step;
        `h` is what the previous pipeline stage sent (None on the first stage)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        hidden = {}
        if self.stage.first:
            h = self.model.embed_tokens(input_ids)
            # Gemma: the scale rounded to the activation dtype first, as transformers does
            if self.cfg.embed_scale:
                h = h * torch.tensor(self.cfg.embed_scale, dtype=h.dtype, device=h.device)
            hidden["embed"] = h
        for i in self.stage.layers:
            h = hidden[f"layer {i}"] = self.model.layers[i](positions, h)
        if not self.stage.last:
            return None, hidden
        h = hidden["final norm"] = self.model.norm(h)
        logits = self.lm_head(h)  # None on TP ranks but 0: rank 0 gathered the whole vocabulary
        if logits is not None and self.cfg.final_softcap:  # Gemma: elementwise, on the gathered logits
            logits = torch.tanh(logits / self.cfg.final_softcap) * self.cfg.final_softcap
        return logits, hidden
