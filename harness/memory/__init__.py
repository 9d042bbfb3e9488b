"""Will it fit: predicted peak VRAM (estimate), what fits a budget (budget/plan), measured truth.

Modules: estimate (the analytic model), budget (plan and budget emulation), measure (allocator
and NVML tracking on a GPU), matrix (the measurement matrix the estimator is checked against).
"""
