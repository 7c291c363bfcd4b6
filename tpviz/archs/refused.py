"""Architectures tpviz does not model, each refused in one line naming the part (never drawn as attention)."""
from tpviz.archs.base import Arch

UNMODELLED = {"minimax": "lightning attention (MiniMax)",
              "minimax_m1": "lightning attention (MiniMax)",
              "minimax_text_01": "lightning attention (MiniMax)",
              "bamba": "Bamba's Mamba2 + attention layers",  # vLLM retired it (0.23.0) before tpviz had it
              "zamba2": "Mamba2 + shared attention blocks (Zamba2)",
              "rwkv": "RWKV time mixing", "recurrent_gemma": "RG-LRU recurrent layers (RecurrentGemma)"}

RECORDS = [Arch(model_type, known=False, refused=part) for model_type, part in UNMODELLED.items()]
