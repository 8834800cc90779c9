"""The shared vision-language prefix (SigLIP/DINOv2, projector, Llama/Qwen2/Gemma) and its tokenizer."""
