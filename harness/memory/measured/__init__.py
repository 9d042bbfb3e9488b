"""Memory measured on a GPU and read back: the inference and training matrices, the snapshot and MoE
offload cases (each in a fresh process), and the families runs against the estimate.
"""
