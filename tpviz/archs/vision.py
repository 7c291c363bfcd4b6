"""Multimodal wrappers whose text decoder is another family's record and whose vision tower tpviz leaves out
(the map's notes name it): GLM-4.5V, whose text_config vLLM 0.33's glm4_1v.py builds as Glm4MoeForCausalLM
(glm4_moe.py), under the same checkpoint names (model.language_model.*, the tower under model.visual.*)."""
from dataclasses import replace

from tpviz.archs.glm import RECORDS as GLM

_GLM4_MOE = next(a for a in GLM if a.model_type == "glm4_moe")

RECORDS = [
    replace(_GLM4_MOE, model_type="glm4v_moe", hf_class="Glm4vMoeForConditionalGeneration",
            text_model="glm4v_moe_text"),
    replace(_GLM4_MOE, model_type="glm4v_moe_text", hf_class="Glm4vMoeForConditionalGeneration"),
]
