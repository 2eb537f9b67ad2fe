"""Checkpoints and formats: FlintConfig, weight containers, NVFP4, the BF16 safetensors and NVFP4 GGUF readers and writers, synthetic checkpoints."""
