"""Will it fit: predicted peak VRAM (estimate), what fits a budget (budget/plan), measured truth.

Modules: estimate (the analytic model: weights, KV cache, activations, LoRA targets and optimizer
states), budget (plan, the model's context limit, budget emulation), offload (accelerate's placement
for a budget and the decode time it costs), measure (allocator and NVML tracking on a GPU), matrix
(the inference measurement matrix), train_matrix (one training case as users run it, in a fresh
process, and the committed H200 training rows).
"""
