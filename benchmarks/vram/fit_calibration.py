"""Fit the transient coefficients of harness/memory/estimate.py (CALIBRATION) to measured matrix rows.

    python benchmarks/vram/fit_calibration.py [--holdout arch,arch] ROWS.json...

For each calibration key (mode/precision group[/gc]) it solves a non-negative least-squares fit of
(measured peak - the exactly modelled terms) on the key's features, weighting each row by
1/measured so the fit minimises relative error, and prints the dict to paste into CALIBRATION.
With --holdout, those architectures are left out of the fit (to report out-of-sample error).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.memory import estimate as E  # noqa: E402
from harness.memory.matrix import load_matrix, measured_bytes, row_query  # noqa: E402

FEATURES = {  # physically meaningful terms only: fewer features generalise to unseen shapes
    "weights": ["tied_emb_src", "largest_linear_src"],
    "prefill/fp32": ["const", "tok_h", "tok_i", "tok_qkv", "scores"],
    "prefill": ["const", "tok_h", "tok_i", "tok_qkv"],
    # checkpointing keeps each layer's input; backward recomputes one layer at a time
    "train/gc": ["const", "L_tok_h", "tok_h", "tok_i", "tok_qkv", "tok_v", "scores"],
    # without it every layer's activations stay until backward reaches them
    "train/nogc": ["const", "L_tok_h", "L_tok_i", "L_tok_qkv", "L_scores", "tok_v"],
}


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Lawson-Hanson-lite: least squares, dropping features that come out negative."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def load_rows(paths):
    rows, _ = load_matrix(paths)
    return [r for r in rows if measured(r) is not None]


measured = measured_bytes
query = row_query


def key_of(row) -> str:
    return E.calibration_key(query(row))


def fit(rows, keys=None):
    by_key: dict[str, list] = {}
    for r in rows:
        if r["mode"] == "generate":
            continue  # generate reuses the prefill coefficients; it is validated, not fitted
        by_key.setdefault(key_of(r), []).append(r)
    out = {}
    for key, group in sorted(by_key.items()):
        if keys and key not in keys:
            continue
        parts = key.split("/")
        names = FEATURES.get(key) or FEATURES.get(f"{parts[0]}/{parts[-1]}") or FEATURES[parts[0]]
        a, b = [], []
        for r in group:
            shape = E.model_shape(r["arch"])
            q = query(r)
            fixed = E.estimate(shape, q, calibration={key: {}}).peak_bytes
            feats = E.features_for(shape, q)
            w = 1.0 / measured(r)
            a.append([feats[n] * w for n in names])
            b.append((measured(r) - fixed) * w)
        coef = nnls(np.array(a), np.array(b))
        out[key] = {n: float(f"{c:.4g}") for n, c in zip(names, coef) if c > 0}
    return out


def report(rows, calibration=None):
    errs = []
    for r in rows:
        shape = E.model_shape(r["arch"])
        pred = E.estimate(shape, query(r), calibration=calibration).peak_bytes
        errs.append((pred - measured(r)) / measured(r))
    errs = np.abs(np.array(errs))
    return float(np.median(errs)), float(errs.max()), len(errs)


def worst(rows, calibration=None, n=15):
    out = []
    for r in rows:
        shape = E.model_shape(r["arch"])
        pred = E.estimate(shape, query(r), calibration=calibration).peak_bytes
        out.append(((pred - measured(r)) / measured(r), r))
    out.sort(key=lambda t: -abs(t[0]))
    for e, r in out[:n]:
        print(f"{e:+.2%} {r['arch']} {r['precision']} {r['mode']} s={r['seq_len']} b={r['batch']} "
              f"r={r.get('lora_r')} gc={r.get('grad_checkpointing')} measured={measured(r)/2**20:.0f}MiB",
              file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--holdout", default="")
    args = ap.parse_args()
    rows = load_rows(args.rows)
    hold = set(a for a in args.holdout.split(",") if a)
    train = [r for r in rows if r["arch"] not in hold]
    test = [r for r in rows if r["arch"] in hold]
    cal = dict(E.CALIBRATION)
    cal.update(fit(train))
    print(json.dumps(cal, indent=1))
    print("fitted on %d rows: median %.2f%% worst %.2f%% (n=%d)" % ((len(train),) + tuple(
        x * 100 if i < 2 else x for i, x in enumerate(report(train, cal)))), file=sys.stderr)
    worst(train, cal)
    if test:
        m, w, n = report(test, cal)
        print(f"held out ({','.join(sorted(hold))}): median {m:.2%} worst {w:.2%} (n={n})", file=sys.stderr)


if __name__ == "__main__":
    main()

