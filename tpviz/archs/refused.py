"""Architectures tpviz does not model, each refused in one line naming the part (never drawn as attention)."""
from tpviz.archs.base import Arch

UNMODELLED = {"minimax": "lightning attention (MiniMax)",
              "minimax_m1": "lightning attention (MiniMax)",
              "minimax_text_01": "lightning attention (MiniMax)",
              "bamba": "Bamba's Mamba2 + attention layers",  # vLLM retired it (0.23.0) before tpviz had it
              "rwkv": "RWKV time mixing", "recurrent_gemma": "RG-LRU recurrent layers (RecurrentGemma)"}
# vLLM 0.33's voxtral.py (and voxtral_realtime.py, its subclass) reads audio_config.downsample_factor, which
# only its Mistral-format config adapter sets (transformers_utils/configs/mistral.py), and loads Mistral's
# tensor names (mm_whisper_embeddings.*)
MISTRAL_ONLY = ("vLLM 0.33 serves it only from Mistral's own format (params.json and "
                "consolidated.safetensors: --tokenizer-mode mistral --config-format mistral --load-format "
                "mistral), which tpviz does not read; its class reads audio_config.downsample_factor, "
                "which a Hugging Face config.json lacks")

RECORDS = [Arch(model_type, known=False, refused=part) for model_type, part in UNMODELLED.items()]
RECORDS += [Arch(t, known=False, refused=MISTRAL_ONLY, whole_reason=True)
            for t in ("voxtral", "voxtral_realtime")]
