"""Past one process: one GPU per pytest-xdist worker on a host, and the suites on every node of a
Ray cluster, gathered into a fleet report (per-node readiness, versions, figures and outliers).

Modules: gpus (which GPUs a host shows and which worker gets which), merge (worker results sent
to the xdist controller), node_run (what runs on a node: stdlib only, shipped by value), cluster
(Ray: connect, one pinned task per node, timeouts, partial results), aggregate (nodes -> fleet
verdicts and outliers), html (the self-contained fleet page) and writer (the report's files).
Ray is imported only by cluster, and only when a fleet run starts.
"""
