"""A multimodal checkpoint's towers as vLLM 0.33 builds them beside the text decoder (the vision tower of
config/tower.py or config/tower_hf.py, the audio tower of config/tower_audio.py or config/tower_hf.py), and
the notes that say what of them the map holds and what it leaves out."""
from tpviz.archs import arch_of
from tpviz.config.tower import HF_KINDS, Tower, read_tower
from tpviz.config.tower_audio import SPLIT_AUDIO, read_audio
from tpviz.config.tower_hf import read_hf_tower


VISION_NOTE = "multimodal checkpoint: its vision tower ("  # how the note on a mapped tower begins


def read_towers(outer: dict) -> tuple[Tower | None, Tower | None]:
    """(vision tower, audio tower), None where the model has none tpviz models."""
    return (read_tower(outer) or read_hf_tower(outer, "vision"),
            read_audio(outer) or read_hf_tower(outer, "audio"))


def tower_notes(tower: Tower | None, audio: Tower | None, outer: dict, wrapped: bool) -> list[str]:
    """What the map holds of the towers, and what it leaves out."""
    notes = []
    if tower:
        how = ("builds it: transformers' own modules, whole on every GPU, and its embedder"
               if tower.kind in HF_KINDS else "splits it")
        notes.append(f"{VISION_NOTE}{tower.depth} blocks, {tower.heads} heads) "
                     f"is mapped as vLLM 0.33 {how} ({tower.file}), held by the first pipeline stage; its "
                     "time per image is not in the speed bound")
    elif audio is None and (wrapped or isinstance(outer.get("vision_config"), dict)):
        notes.append("multimodal checkpoint: only the text decoder is mapped; the vision tower (and any "
                     "projector or audio tower) is left out of the map and of every memory figure, and its "
                     "own TP split is not drawn")
    if a := audio:
        how = (f"split over its {a.heads} heads where they divide tp, else whole on every GPU (disable_tp)"
               if a.kind in SPLIT_AUDIO else "plain torch layers, whole on every GPU")
        if a.kind == "gemma3n_audio":
            how += "; gemma3n_mm.py splits its embedder's table and projection"
        notes.append(f"its audio tower ({a.depth} blocks, {a.hidden} wide) and projector are mapped as "
                     f"vLLM 0.33 builds them ({a.file}): {how}, held by the first pipeline stage; its time "
                     "per clip is not in the speed bound")
        if isinstance(vc := outer.get("vision_config"), dict) and not tower:  # Gemma-3n's timm MobileNet-V5
            what = ", ".join(vc[k] for k in ("model_type", "architecture") if isinstance(vc.get(k), str))
            named = f" ({what})" if what else ""
            notes.append(f"its vision tower{named} is not modelled: it is left out of the map and of every "
                         "memory figure")
    wrapper = arch_of(str(outer.get("model_type", "")))
    if outer.get("quantization_config") and {wrapper.tower, wrapper.audio} & set(HF_KINDS):
        notes.append("a quantized checkpoint: vLLM 0.33 quantizes its transformers-built towers by their "
                     "sizes (_get_tower_quant_config), which tpviz does not model, so they are left out")
    return notes
