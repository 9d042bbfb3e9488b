#!/usr/bin/env python3
"""The figures the docs quote, regenerated from committed results, so text and data cannot disagree.

    .venv/bin/python scripts/docs_figures.py           # rewrite every figures block in README.md and docs/*.md
    .venv/bin/python scripts/docs_figures.py --check   # exit 1 naming the blocks that are out of date

A block is the text between `<!-- figures:begin NAME -->` and `<!-- figures:end -->`; NAME is one of
BLOCKS below. A begin marker at the end of its line makes a block of lines (a table), one inside a
sentence an inline figure. The inputs are committed: the H200 measurements under
measurements/ (measurements/manifest.json lists them), the published vLLM start-up logs in
tests/data/vllm_logs/, and the results files the report screenshots were rendered from
(tests/data/reports/). Figures computed with the estimator use the current code: change the
estimator and this script shows what its figures are now (tests/test_docs.py fails until they
are written). Figures of live runs (timings, serving throughput) are not here: docs/figures.md
quotes them with their date and script.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import re
import statistics
import struct
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"<!-- figures:begin ([a-z0-9-]+) -->(.*?)<!-- figures:end -->", re.S)
GB = 1e9


def pct(x: float, digits: int = 2) -> str:
    return f"{100 * x:.{digits}f}%"


def signed_pct(x: float, digits: int = 2) -> str:
    return f"{100 * x:+.{digits}f}%"


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# vram: the inference matrix, the training truth, offload


@functools.cache
def _matrix(which: str):
    import measurements
    from harness.memory.measured.matrix_readback import evaluate, load_matrix

    rows, env = load_matrix(measurements.matrix_rows(f"vram/{which}"))
    return evaluate(rows, env)


def vram_matrix_inline() -> str:
    m, h = _matrix("matrix"), _matrix("holdout")
    return (f"median |error| {pct(m.median_abs_error)}, worst {pct(m.worst_abs_error)} over {m.n} rows, and on "
            f"architectures measured after the fit was frozen, `holdout/`: phi-3-mini-4k and qwen2.5-3b, "
            f"median {pct(h.median_abs_error)}, worst {pct(h.worst_abs_error)} over {h.n} rows")


def vram_matrix() -> str:
    out = []
    for name, label in (("matrix", "matrix (fit architectures)"), ("holdout", "held out (phi-3-mini-4k, qwen2.5-3b)")):
        s = _matrix(name)
        out.append([label, s.n, pct(s.median_abs_error), pct(s.worst_abs_error), pct(s.accelerate_median_abs_error, 1),
                    f"{s.budget_agreement:.1%} of {s.budget_cases}" if s.budget_cases else "-"])
    head = table(["rows of measurements/vram/", "rows", "median abs error", "worst", "accelerate's estimate, median",
                  "6 GiB verdict agrees with the real OOM"], out)
    groups = _matrix("matrix").by_group()
    by_mode = table(["precision/mode", "rows", "median abs error", "worst"],
                    [[g, n, pct(med), pct(worst)] for g, (n, med, worst) in groups.items()])
    return (head + "\n\n<details><summary>Per precision and mode (the matrix)</summary>\n\n" + by_mode
            + "\n\n</details>")


@functools.cache
def _truth():
    import measurements
    from harness.memory.measured.train_matrix import HOLDOUT_ARCHS, evaluate_training, load_truth

    rows, _ = load_truth(measurements.truth_runs())
    return HOLDOUT_ARCHS, evaluate_training(rows)


def vram_training() -> str:
    held, s = _truth()
    rows = []
    for run in ("run1", "validation"):
        for gc in (True, False):
            errs = [abs(r["error"]) for r in s.rows if r["run"] == run and r["arch"] in held and r["grad_checkpointing"] is gc]
            if errs:
                rows.append([run, "on" if gc else "off", len(errs), pct(statistics.median(errs)), pct(max(errs))])
    fit = table(["run", "checkpointing", "held-out rows", "median abs error", "worst"], rows)
    verdicts = []
    for run in ("run1", "validation"):
        b = s.boundary_of(run)
        agree = sum(r["planner_fits"] == r["actually_fits"] for r in b)
        missed = sum(1 for r in b if not r["planner_fits"] and r["actually_fits"])
        verdicts.append([run, len(b), f"{agree} ({agree / len(b):.0%})", len(s.false_fits_of(run)), missed])
    return (fit + "\n\n" + table(["run", "cases near 6 GiB", "plan --train verdict agrees", "predicted fit, ran out",
                                  "predicted no fit, fitted"], verdicts))


def _held_out(s, held, run: str, gc: bool) -> list[float]:
    return [abs(r["error"]) for r in s.rows if r["run"] == run and r["arch"] in held and r["grad_checkpointing"] is gc]


def vram_training_inline() -> str:
    held, s = _truth()
    on, off, val = _held_out(s, held, "run1", True), _held_out(s, held, "run1", False), _held_out(s, held, "validation", False)
    return (f"checkpointing on median {pct(statistics.median(on))}, worst {pct(max(on))} ({len(on)} rows); off median "
            f"{pct(statistics.median(off))}, worst {pct(max(off))} ({len(off)} rows), and in a second run drawn after the "
            f"estimator was fixed (`truth/validation/`) off median {pct(statistics.median(val))}, worst {pct(max(val))} "
            f"({len(val)} more rows")


def vram_boundary_inline() -> str:
    _, s = _truth()
    parts = []
    for run, what in (("run1", "On the first run's {n} cases, where that allowance was chosen"),
                      ("validation", "On {n} fresh cases drawn after it was fixed (`truth/validation/`, about half on "
                                     "each side of the verdict)")):
        b = s.boundary_of(run)
        agree = sum(r["planner_fits"] == r["actually_fits"] for r in b)
        missed = sum(1 for r in b if not r["planner_fits"] and r["actually_fits"])
        parts.append(f"{what.format(n=len(b))}: {agree} agree ({agree / len(b):.0%}); predicted fits that ran out: "
                     f"{len(s.false_fits_of(run))}; predicted no-fits that fitted: {missed}")
    return ". ".join(parts)


@functools.cache
def _families():
    import measurements
    from harness.memory.measured import families_truth as T

    return T, T.evaluate_families(measurements.families_runs())


def vram_families() -> str:
    """Issue 27: per family, the estimator's error on the committed H200 rows (measurements/vram/families/)."""
    T, s = _families()
    rows = []
    for arch in sorted(set(s.inference) | set(s.train_gc) | set(s.train_nogc)):
        cells = [f"{arch}" + (" (held out)" if arch in T.HELD_OUT else "")]
        for table_ in (s.inference, s.train_gc, s.train_nogc):
            st = table_.get(arch)
            cells += [f"{st.n}: {pct(st.median, 1)} / {pct(st.worst, 1)} / {pct(st.worst_under, 1)}" if st else "-"]
        rows.append(cells)
    return table(["family", "inference (rows: median / worst / worst under)", "training, checkpointing on",
                  "training, checkpointing off"], rows)


def vram_families_boundary_inline() -> str:
    _, s = _families()
    missed = sum(1 for r in s.boundary if not r["planner_fits"] and r["actually_fits"])
    return (f"{len(s.boundary)} boundary cases, verdict agrees on {pct(s.agreement, 1)}; predicted fits that ran out: "
            f"{len(s.false_fits)}; predicted no-fits that fitted: {missed}")


def vram_families_picture() -> str:
    _, s = _families()
    rows = []
    for p in s.pictures:
        what = f"{p['arch']} {p['precision']} {p['mode']} {p['seq_len']}x{p['batch']}"
        rows.append([what, "peak", f"{p['predicted_peak'] / 2**30:.2f}", f"{(p['measured_peak'] or 0) / 2**30:.2f}"])
        rows += [[what, c["component"], f"{c['predicted'] / 2**30:.2f}", f"{c['measured'] / 2**30:.2f}"]
                 for c in p["components"]]
    return table(["case", "part", "predicted GiB", "measured GiB (allocator snapshot)"], rows)


def vram_offload_inline() -> str:
    rows = json.loads((ROOT / "measurements/vram/truth/offload2/offload_rows.json").read_text())["rows"]
    bw = {r["kind"]: r for r in rows if r["kind"].startswith("bandwidth")}
    gpu = next(r for r in rows if r["kind"] == "all_gpu")
    off = [r for r in rows if r["kind"] == "offload"]
    predicted = " and ".join(f"{r['predicted_decode_ms']:.0f}" for r in off)
    measured = " and ".join(f"{r['decode_ms_per_token']:.0f}" for r in off)
    errors = ", ".join(signed_pct(r["predicted_decode_ms"] / r["decode_ms_per_token"] - 1, 1) for r in off)
    speeds = " and ".join(f"{r['tokens_per_s']:.2f}" for r in off)
    return (f"{bw['bandwidth']['offload_gbps']:.1f} GB/s, {bw['bandwidth_after']['offload_gbps']:.1f} GB/s when measured "
            f"again after the placements): {predicted} ms/token against {measured} measured ({errors}), against "
            f"{gpu['decode_ms_per_token']:.1f} ms/token all on the GPU ({gpu['tokens_per_s']:.1f} tokens/s against {speeds})")


def vram_offload() -> str:
    data = json.loads((ROOT / "measurements/vram/truth/offload2/offload_rows.json").read_text())
    rows = data["rows"]
    bw = {r["kind"]: r for r in rows if r["kind"].startswith("bandwidth")}
    gpu = next(r for r in rows if r["kind"] == "all_gpu")
    out = [["all on the GPU", "-", "-", f"{gpu['decode_ms_per_token']:.1f}", "-", f"{gpu['tokens_per_s']:.2f}"]]
    for r in (r for r in rows if r["kind"] == "offload"):
        err = r["predicted_decode_ms"] / r["decode_ms_per_token"] - 1
        out.append([f"{r['budget_bytes'] / 2**30:.0f} GiB budget", f"{r['loaded_bytes'] / GB:.2f} GB",
                    f"{r['predicted_decode_ms']:.0f}", f"{r['decode_ms_per_token']:.0f}", signed_pct(err, 1),
                    f"{r['tokens_per_s']:.2f}"])
    return (table([f"{gpu['arch']} bf16", "on the GPU", "predicted ms/token", "measured ms/token", "error", "tokens/s"], out)
            + f"\n\nHost-to-device copy tensor by tensor from a mapped file: {bw['bandwidth']['offload_gbps']:.1f} GB/s "
              f"before the placements, {bw['bandwidth_after']['offload_gbps']:.1f} GB/s after "
              f"(`measurements/vram/truth/offload2/offload_rows.json`).")


# ---------------------------------------------------------------------------------------------
# vLLM plan against published logs


@functools.cache
def _vllm_checks():
    from harness.memory.vllm import vllm_logcheck as L

    data = ROOT / "tests" / "data" / "vllm_logs"
    checks = [L.check(r, data) for r in L.load_records(data)]
    return checks, L.summary(checks)


def vllm_plan_inline() -> str:
    checks, s = _vllm_checks()
    return (f"median |error| of KV tokens {s['median_abs_error_pct']}%, worst {s['worst_abs_error_pct']}% "
            f"(`{s['worst_log']}`), start or refusal right {s['starts_matched']}/{s['logs']}")


def vllm_plan() -> str:
    checks, s = _vllm_checks()
    rows = [[f"`{c.id}`", c.version, c.engine, f"{c.predicted_tokens:,}", f"{c.logged_tokens:,}",
             signed_pct(c.error), f"{'yes' if c.predicted_starts else 'no'} / {'yes' if c.logged_started else 'no'}"]
            for c in sorted(checks, key=lambda c: c.id)]
    head = (f"{s['logs']} logs, {len(s['gpus'])} cards, {len(s['models'])} models, vLLM {s['versions'][0]} .. "
            f"{s['versions'][-1]}: median |error| of KV tokens {s['median_abs_error_pct']}%, worst "
            f"{s['worst_abs_error_pct']}%, start or refusal right {s['starts_matched']}/{s['logs']}.")
    return head + "\n\n" + table(["log (tests/data/vllm_logs/)", "vLLM", "engine", "predicted KV tokens",
                                  "logged", "error", "starts: predicted / logged"], rows)


# ---------------------------------------------------------------------------------------------
# quant: the W4A16 checkpoint measured on the H200


@functools.cache
def _quant():
    from harness.memory.fit.estimate import Query, estimate
    from harness.memory.fit.shape import model_shape

    m = json.loads((ROOT / "measurements/quant/h200-qwen2.5-1.5b.json").read_text())
    run2 = m["run2"]
    est = estimate(model_shape(run2["arch"]), Query("w4a16", "weights")).breakdown
    loaded = run2["gptq"]["transformers_loaded"]
    return m, est, loaded


def quant_inline() -> str:
    m, est, loaded = _quant()
    stored = m["run1"]["gptq"]["stored"]
    exact = "predicted exactly" if stored["predicted_bytes"] == stored["measured_bytes"] else (
        f"predicted {signed_pct(stored['predicted_bytes'] / stored['measured_bytes'] - 1)}")
    return (f"stored bytes {exact}, held after `from_pretrained` {loaded['held_bytes'] / GB:.3f} GB "
            f"(predicted {signed_pct(est['weights'] / loaded['held_bytes'] - 1)}), after the first forward "
            f"{loaded['after_forward_held_bytes'] / GB:.3f} GB (predicted "
            f"{signed_pct(est['transformers_decompressed_weights'] / loaded['after_forward_held_bytes'] - 1)})")


def quant() -> str:
    m, est, loaded = _quant()
    rows = []
    for method in ("gptq", "awq"):
        r = m["run1"][method]
        st = r["stored"]
        rows.append([f"{method} ({r['scheme']})", f"{st['measured_bytes']:,}", f"{st['predicted_bytes']:,}",
                     signed_pct(st["predicted_bytes"] / st["measured_bytes"] - 1), f"{r['quantize_s']:.1f}",
                     f"{r['peak_gpu_bytes'] / GB:.2f} GB", f"{r['drift']['mean_kl']:.3f}"])
    stored = table([f"{m['run1']['arch']} on the {m['machine']['gpu']}", "stored bytes", "predicted", "error",
                    "quantize s", "GPU peak", "mean KL (random weights)"], rows)
    held = table(["transformers holds (GPTQ, run 2)", "measured", "predicted", "error"], [
        ["after from_pretrained (packed)", f"{loaded['held_bytes'] / GB:.3f} GB", f"{est['weights'] / GB:.3f} GB",
         signed_pct(est["weights"] / loaded["held_bytes"] - 1)],
        ["after the first forward (decompressed to bf16)", f"{loaded['after_forward_held_bytes'] / GB:.3f} GB",
         f"{est['transformers_decompressed_weights'] / GB:.3f} GB",
         signed_pct(est["transformers_decompressed_weights"] / loaded["after_forward_held_bytes"] - 1)]])
    return stored + "\n\n" + held


# ---------------------------------------------------------------------------------------------
# the report screenshots and the runs they show


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    return struct.unpack(">II", head[16:24])


@functools.cache
def _vram_fixture() -> tuple[str, dict, dict]:
    data = json.loads(gzip.decompress((ROOT / "tests/data/reports/vram.json.gz").read_bytes()))
    day = datetime.fromtimestamp(data["started"], timezone.utc).strftime("%Y-%m-%d")
    rec = {t["nodeid"].rsplit("::", 1)[-1]: t.get("record") or {} for t in data["tests"]}
    return day, rec["test_prediction_matches_measurement"], rec["test_held_out_architectures_within_tolerance"]


def vram_screenshot_inline() -> str:
    """The fold line of the matrix table as the vram report (and its screenshot) prints it."""
    from harness.report import run_html

    data = json.loads(gzip.decompress((ROOT / "tests/data/reports/vram.json.gz").read_bytes()))
    page = run_html.render(data, index_href=None)
    folds = re.findall(r"(\d+) rows: median \|error\| [0-9.]+ %, worst [0-9.]+ %", page)
    lines = re.findall(r"\d+ rows: median \|error\| [0-9.]+ %, worst [0-9.]+ %", page)
    if not lines:
        raise SystemExit("the vram report has no folded table summary: docs/reports.md's example needs another source")
    largest = max(zip(map(int, folds), lines))[1]  # the matrix table, the one the example means
    day, _, _ = _vram_fixture()
    return f"\"{largest}\" in the vram run of {day} the screenshot shows"


def _constant(path: str, name: str):
    """A literal module constant, read without importing the module (it needs PIL or playwright)."""
    import ast

    tree = ast.parse((ROOT / path).read_text())
    return next(ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == name)


def screenshots() -> str:
    kinds = _constant("scripts/report_screenshots.py", "KINDS")
    viewport = _constant("tests/test_report_browser.py", "VIEWPORT")
    day, m, h = _vram_fixture()
    sizes = {p.stem: _png_size(p) for p in sorted((ROOT / "docs/screenshots").glob("*.png"))}
    scaled = sorted({sizes[k] for k in kinds if k in sizes})
    others = {k: v for k, v in sizes.items() if k not in kinds}
    now = _matrix("matrix")
    lines = [f"The first screens of {', '.join(k for k in kinds if k in sizes)} are "
             f"{' and '.join(f'{w} x {h_} px' for w, h_ in scaled)}: taken at the browser tests' "
             f"{viewport['width']} x {viewport['height']} viewport and scaled by `scripts/report_screenshots.py`."]
    sources = {"vram-picture": "the memory picture section of `tests/data/reports/vram-picture.json.gz`, a CPU run of "
                               "`suites/vram/test_memory_picture.py` on the committed H200 snapshots",
               "upgrade-rehearsal-h200": "the upgrade rehearsal's report from the second H200 hold, 0.25.1 -> 0.26.0, "
                                         "`upgrade.html` in `measurements/vllm_plan/h200-vllm-0.26.0-hold2-raw.tgz`, "
                                         "shot with chromium at 1280 x 900"}
    lines += [f"`{k}.png` is {w} x {h_} px ({sources.get(k, '`benchmarks/fleet/three_nodes.py`')})."
              for k, (w, h_) in others.items()]
    lines.append(f"The vram screenshot renders `tests/data/reports/vram.json.gz`, a CPU run of {day} with the "
                 f"estimator of that day: {m['rows']} rows, median |error| {pct(m['median_abs_error'])}, worst "
                 f"{pct(m['worst_abs_error'])}; held out {h['rows']} rows, median {pct(h['median_abs_error'])}, worst "
                 f"{pct(h['worst_abs_error'])}. The current estimator on the same committed rows: {now.n} rows, "
                 f"median {pct(now.median_abs_error)}, worst {pct(now.worst_abs_error)} (the table in [figures.md](figures.md#will-it-fit-the-estimator-against-the-h200)).")
    return "\n\n".join(lines)


# ---------------------------------------------------------------------------------------------
# reference tables generated from the code (not figures, but the same rule: docs cannot drift)


def pytest_options() -> str:
    from harness.settings import options

    rows = [[f"`{o.flag}`" + ("" if o.switch else " VALUE"), f"`{o.env}`" if o.env else "-",
             (o.shown or "-").replace("|", "\\|"), o.help.replace("|", "\\|")] for _, o in options()]
    return table(["option", "environment variable", "default", "help (as `pytest --help` shows it)"], rows)


BLOCKS = {
    "vram-matrix-inline": vram_matrix_inline,
    "vram-matrix": vram_matrix,
    "vram-training": vram_training,
    "vram-offload": vram_offload,
    "vram-training-inline": vram_training_inline,
    "vram-boundary-inline": vram_boundary_inline,
    "vram-offload-inline": vram_offload_inline,
    "vram-families": vram_families,
    "vram-families-boundary-inline": vram_families_boundary_inline,
    "vram-families-picture": vram_families_picture,
    "vllm-plan-inline": vllm_plan_inline,
    "vllm-plan": vllm_plan,
    "quant-inline": quant_inline,
    "quant": quant,
    "vram-screenshot-inline": vram_screenshot_inline,
    "screenshots": screenshots,
    "pytest-options": pytest_options,
}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def rewrite(text: str, cache: dict[str, str], where: str) -> str:
    def sub(match: re.Match) -> str:
        name, old = match.group(1), match.group(2)
        if name not in BLOCKS:
            raise SystemExit(f"{where}: unknown figures block {name!r} (known: {', '.join(BLOCKS)})")
        if name not in cache:
            cache[name] = BLOCKS[name]().strip()
        body = f"\n{cache[name]}\n" if old.startswith("\n") else cache[name]
        return f"<!-- figures:begin {name} -->{body}<!-- figures:end -->"
    return MARKER.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block is out of date")
    args = ap.parse_args(argv)
    from harness.atomic import write_text

    cache: dict[str, str] = {}
    stale = []
    for path in doc_files():
        old = path.read_text(encoding="utf-8")
        new = rewrite(old, cache, str(path.relative_to(ROOT)))
        if new != old:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                write_text(path, new)
    if args.check and stale:
        print(f"figures out of date in {', '.join(stale)}: run .venv/bin/python scripts/docs_figures.py", file=sys.stderr)
        return 1
    print(f"{'out of date' if stale else 'up to date'}: {len(cache)} blocks"
          + (f"; rewrote {', '.join(stale)}" if stale and not args.check else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
