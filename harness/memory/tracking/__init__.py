"""The instruments for memory on a GPU, with no harness imports: the tracker (allocator peaks, an NVML
sampler, CUDA context size, host RSS) and torch's allocator history summarised by where each
allocation came from.
"""
