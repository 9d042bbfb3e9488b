"""Did the new vLLM get slower or break: launcher, load client, workload, metrics, results, gate.

Modules: launcher (a vLLM server as a managed process), client and runner (the async load test),
workload, stats, metrics (/metrics scraping), results (the bench JSON), compare (the gate),
sdk (the same request through the official openai SDK).
"""
