"""A training step traced on the meta device and replayed through torch's caching allocator: the trace,
its cache on disk, memoized meta kernels, the allocator replay, and plan --train's limits found with
it.
"""
