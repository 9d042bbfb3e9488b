"""Fit the transient coefficients of harness/memory/fit/calibration.py (CALIBRATION) to measured matrix rows.

    python benchmarks/vram/fit_calibration.py [--holdout arch,arch] ROWS.json...
    python benchmarks/vram/fit_calibration.py --train [--holdout arch,arch] [--holdout-targets attn] TRAIN_ROWS.json

--train fits the training keys to the fresh-process training matrix (train_rows.json of
benchmarks/vram/memory_truth.py: the matrix rows, never the capped boundary rows) and prints the
out-of-sample error of the held-out architectures (and, with --holdout-targets, of a LoRA recipe
the fit never saw), checkpointing on and off separately.

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

from harness.memory.fit import estimate as E  # noqa: E402
from harness.memory.fit.calibration import CALIBRATION, calibration_key, features_for, linear_sum  # noqa: E402
from harness.memory.fit.shape import model_shape  # noqa: E402
from harness.memory.measured.matrix_readback import load_matrix, measured_bytes, row_query  # noqa: E402

FEATURES = {  # physically meaningful terms only: fewer features generalise to unseen shapes
    "weights": ["tied_emb_src", "largest_linear_src"],
    "prefill/fp32": ["const", "tok_h", "tok_i", "tok_qkv", "scores"],
    "prefill": ["const", "tok_h", "tok_i", "tok_qkv"],
    # checkpointing keeps each layer's input; backward recomputes one layer at a time (with the
    # LoRA inputs of that layer's wrapped modules); gradients of the adapter build up in backward
    "train/gc": ["const", "L_tok_h", "tok_h", "tok_i", "tok_qkv", "tok_lora_in", "tok_v", "scores", "grads"],
    # without it every layer's activations stay until backward reaches them (the wrapped modules'
    # LoRA inputs are exact: train_transient.saved_activations)
    "train/nogc": ["const", "L_tok_h", "L_tok_i", "L_tok_qkv", "L_scores", "tok_v", "grads"],
}


# With checkpointing the loss/logits peak (end of forward, start of backward) and the peak of the
# layer recomputed in backward (its attention scores, MLP and LoRA inputs) are at different times:
# transient = common + max(phase, phase), fitted by alternating the assignment of rows to phases.
PHASES = {
    "train/gc": {"common": ["const", "L_tok_h", "grads"],
                 "phases": [["tok_v", "tok_h"], ["scores", "tok_i", "tok_qkv", "tok_lora_in", "tok_h"]]},
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
    return calibration_key(query(row))


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
        phased = PHASES.get(f"{parts[0]}/{parts[-1]}")
        if phased:
            out[key] = fit_phases(key, group, phased)
            continue
        names = FEATURES.get(key) or FEATURES.get(f"{parts[0]}/{parts[-1]}") or FEATURES[parts[0]]
        a, b = [], []
        for r in group:
            shape = model_shape(r["arch"])
            q = query(r)
            if q.mode == "train":  # weights, LoRA weights and optimizer states are exact
                parts = E.train_parts(shape, q)
                fixed, feats = parts["static"] + sum(parts["saved"].values()), parts["features"]
            else:
                fixed = E.estimate(shape, q, calibration={key: {}}).peak_bytes
                feats = features_for(shape, q)
            w = 1.0 / measured(r)
            a.append([feats[n] * w for n in names])
            b.append((measured(r) - fixed) * w)
        coef = nnls(np.array(a), np.array(b))
        out[key] = {n: float(f"{c:.4g}") for n, c in zip(names, coef) if c > 0}
    return out


def _target(r):
    shape = model_shape(r["arch"])
    parts = E.train_parts(shape, query(r))
    return parts["static"] + sum(parts["saved"].values()), parts["features"]


def fit_phases(key, group, spec, iterations=30):
    common, phases = spec["common"], spec["phases"]
    data = [(_target(r), measured(r)) for r in group]
    union = list(dict.fromkeys(n for p in phases for n in p))
    # start: every row in the phase whose features weigh most under a plain linear fit
    a = np.array([[f[n] / m for n in common + union] for (_, f), m in data])
    b = np.array([(m - st) / m for (st, _), m in data])
    coef = dict(zip(common + union, nnls(a, b)))
    active = [int(np.argmax([sum(coef[n] * f[n] for n in p) for p in phases])) for (_, f), _ in data]
    result = {}
    for _ in range(iterations):
        cols = common + [f"{i}:{n}" for i, p in enumerate(phases) for n in p]
        a = np.array([[f[c] / m if ":" not in c else (f[c.split(":")[1]] / m if int(c.split(":")[0]) == act else 0.0)
                       for c in cols] for ((_, f), m), act in zip(data, active)])
        x = dict(zip(cols, nnls(a, b)))
        result = {n: float(f"{x[n]:.4g}") for n in common if x[n] > 0}
        result["max"] = [{n: float(f"{x[f'{i}:{n}']:.4g}") for n in p if x[f"{i}:{n}"] > 0} for i, p in enumerate(phases)]
        new = [int(np.argmax([linear_sum(ph, f) for ph in result["max"]])) for (_, f), _ in data]
        if new == active:
            break
        active = new
    return result


def report(rows, calibration=None):
    errs = []
    for r in rows:
        shape = model_shape(r["arch"])
        pred = E.estimate(shape, query(r), calibration=calibration).peak_bytes
        errs.append((pred - measured(r)) / measured(r))
    errs = np.abs(np.array(errs))
    return float(np.median(errs)), float(errs.max()), len(errs)


def worst(rows, calibration=None, n=15):
    out = []
    for r in rows:
        shape = model_shape(r["arch"])
        pred = E.estimate(shape, query(r), calibration=calibration).peak_bytes
        out.append(((pred - measured(r)) / measured(r), r))
    out.sort(key=lambda t: -abs(t[0]))
    for e, r in out[:n]:
        print(f"{e:+.2%} {r['arch']} {r['precision']} {r['mode']} s={r['seq_len']} b={r['batch']} "
              f"r={r.get('lora_r')} gc={r.get('grad_checkpointing')} {r.get('targets', '')} {r.get('optimizer', '')} "
              f"measured={measured(r)/2**20:.0f}MiB",
              file=sys.stderr)


def train_rows(paths):
    from harness.memory.measured.matrix_readback import load_matrix as load_train

    rows, _ = load_train(paths)
    return [r for r in rows if r.get("role") == "matrix" and measured(r) is not None]


def by_checkpointing(rows, calibration):
    out = {}
    for gc_on in (True, False):
        sub = [r for r in rows if r["grad_checkpointing"] is gc_on]
        if sub:
            out["on" if gc_on else "off"] = report(sub, calibration)
    return out


def main_train(args):
    rows = train_rows(args.rows)
    hold = set(a for a in args.holdout.split(",") if a)
    fit_rows = [r for r in rows if r["arch"] not in hold]
    cal = dict(CALIBRATION)
    cal.update(fit(fit_rows))
    print(json.dumps({k: v for k, v in cal.items() if k.startswith("train/")}, indent=1))
    print("fitted on %d rows: median %.2f%% worst %.2f%%" % (len(fit_rows), *(100 * x for x in report(fit_rows, cal)[:2])),
          file=sys.stderr)
    worst(fit_rows, cal, n=8)
    test = [r for r in rows if r["arch"] in hold]
    for gc, (m, w, n) in by_checkpointing(test, cal).items():
        print(f"held out ({','.join(sorted(hold))}), checkpointing {gc}: median {m:.2%} worst {w:.2%} (n={n})",
              file=sys.stderr)
    worst(test, cal, n=8)
    if args.holdout_targets:  # a recipe the fit never saw: fit without it, test on it (all archs)
        recipe = [r for r in rows if r["targets"] == args.holdout_targets]
        cal2 = dict(CALIBRATION)
        cal2.update(fit([r for r in fit_rows if r["targets"] != args.holdout_targets]))
        for gc, (m, w, n) in by_checkpointing(recipe, cal2).items():
            print(f"recipe {args.holdout_targets} held out too, checkpointing {gc}: median {m:.2%} worst {w:.2%} (n={n})",
                  file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--holdout", default="")
    ap.add_argument("--train", action="store_true", help="fit the training keys to a fresh-process training matrix")
    ap.add_argument("--holdout-targets", default="", help="with --train: also leave this LoRA recipe (attn, all) out")
    args = ap.parse_args()
    if args.train:
        return main_train(args)
    rows = load_rows(args.rows)
    hold = set(a for a in args.holdout.split(",") if a)
    train = [r for r in rows if r["arch"] not in hold]
    test = [r for r in rows if r["arch"] in hold]
    cal = dict(CALIBRATION)
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

