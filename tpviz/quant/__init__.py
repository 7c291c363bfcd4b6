"""Quantized checkpoints: the scheme read from quantization_config, and the tensors each scheme stores."""
