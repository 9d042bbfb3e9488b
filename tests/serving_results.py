"""Synthetic bench results whose truth is known, shaped like what `bench` writes (schema 1)."""

from __future__ import annotations

import random

from harness.serving.stats import summary


def make_results(*, ttft_ms=50.0, tput=1000.0, runs=3, requests=40, noise=0.15, seed=0, flags=(),
                 version="1.0", run_drift=0.03, failed=0, output_len=16, client_time_share=0.01,
                 cpu_pressure_share=0.2, loop_lag_ms=0.2, valid=True) -> dict:
    rng = random.Random(seed)
    out_runs = []
    for rep in range(runs):
        drift = 1 + rng.uniform(-run_drift, run_drift)
        reqs, t = [], 0.0
        for i in range(requests):
            ttft = ttft_ms * drift * (1 + rng.gauss(0, noise))
            e2e = ttft + (output_len - 1) * 10 * drift * (1 + rng.gauss(0, noise / 3))
            reqs.append({"index": i, "scheduled_s": t, "dispatched_s": t, "sent_s": t, "end_s": t + e2e / 1000,
                         "chunk_s": [], "status": 200, "error": None, "prompt_tokens": 64,
                         "requested_prompt_tokens": 64, "completion_tokens": output_len, "ttft_ms": ttft,
                         "e2e_ms": e2e})
            t += e2e / 4000
        for i in range(failed):
            reqs.append({"index": requests + i, "scheduled_s": t, "dispatched_s": t, "sent_s": t, "end_s": t,
                         "chunk_s": [], "status": 500, "error": "http_500", "ttft_ms": None, "e2e_ms": 1.0,
                         "completion_tokens": None, "prompt_tokens": None})
        ok = [r for r in reqs if not r["error"]]
        tpots = [(r["e2e_ms"] - r["ttft_ms"]) / (output_len - 1) / 1000 for r in ok] if output_len > 1 else []
        out_runs.append({
            "concurrency": 4, "request_rate": None, "repeat": rep, "requests_ok": requests,
            "requests_failed": failed, "errors": {"http_500": failed} if failed else {},
            "output_throughput": tput * drift, "request_throughput": tput * drift / output_len,
            "ttft_ms": summary(r["ttft_ms"] / 1000 for r in ok), "tpot_ms": summary(tpots),
            "e2e_ms": summary(r["e2e_ms"] / 1000 for r in ok), "itl_ms": summary(tpots),
            "token_accounting": {"findings": [], "agree": True},
            # the server's own TTFT histogram over the run, here the same requests' mean
            "server_metrics": {"ttft_count": float(len(ok)),
                               "ttft_mean_ms": sum(r["ttft_ms"] for r in ok) / len(ok) if ok else None},
            "client_noise": {"client_time_share": client_time_share, "cpu_pressure_share": cpu_pressure_share,
                             "loop_lag_mean_ms": loop_lag_ms},
            "requests": reqs,
        })
    return {"schema_version": 1, "environment": {"model_id": "tiny", "flags": list(flags), "server_version": version,
                                                 "machine": {"cpu_model": "x", "cpu_count": 2}},
            "workload": {"input_len": 64, "output_len": output_len, "api": "completions", "num_prompts": requests},
            "runs": out_runs, "complete": True, "valid": valid,
            "invalid_reasons": [] if valid else ["prompt lengths missed the request: 40 of 40 requests off"]}
