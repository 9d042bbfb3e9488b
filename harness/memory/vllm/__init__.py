"""vLLM's memory plan, predicted without vLLM: the engine's weights and allocator, the KV cache layout
per release, quantization rules, start-up log checks, servers started here, tiny checkpoints, and
why plans differ between releases.
"""
