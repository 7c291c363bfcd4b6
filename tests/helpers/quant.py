"""The quantization_config of each scheme (research quant.md sections 0-6) and the Llama config that carries
them."""
BLOCK = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
CT = {"quant_method": "compressed-tensors", "format": "pack-quantized",
      "ignore": ["lm_head"], "config_groups": {
    "group_0": {"targets": ["Linear"], "format": "pack-quantized", "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}}}
NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
L, A = "model.layers.*.mlp.", "model.layers.*.self_attn."


def llama(q=None, **kw):
    """hidden 1024 = 8 heads x 128, 2 KV heads (replicated at tp 4 and 8), intermediate 1024: every per-GPU
    size is a multiple of 128 up to tp 8, so every scheme is valid there. q None: unquantized (no
    quantization_config)."""
    cfg = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
           "head_dim": 128, "intermediate_size": 1024, "vocab_size": 256, "num_hidden_layers": 1,
           "torch_dtype": "bfloat16", **kw}
    return cfg if q is None else {**cfg, "quantization_config": q}
