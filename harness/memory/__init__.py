"""Will it fit: predicted peak VRAM, what fits a budget, vLLM's plan, measured truth.

Rooms: fit (the estimate and budget plans), family (family traits and verification), vllm (the vLLM
plan per version), replay (the step trace and allocator replay), tracking (GPU instruments),
measured (GPU runs and their rows read back). docs/architecture.md has the map.
"""
