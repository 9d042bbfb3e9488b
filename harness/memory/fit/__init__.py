"""The estimate and what fits a budget: the analytic peak (config -> shape -> weights, KV cache, LoRA,
recompute, calibrated transients), the fit planner and budget emulation, advice, two models on a
card, offload placement, the memory picture, GGUF, card table.
"""
