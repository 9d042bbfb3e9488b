"""The answer first: one verdict per suite, read from a run's results (tests, tables, figures).

hw: machine ready / not ready (each failing check with its fix) / no GPU; vram: are the
predictions right, and what fits at the budget; nan: every injected fault caught; modeldir: the
merged directory safe and the broken ones refused; serving: regressed / not / inconclusive.
"""

from __future__ import annotations

from typing import Any

from . import fmt
from .html import Verdict

QUESTIONS = {
    "hw": "Is this machine ready?",
    "vram": "Are the memory predictions right?",
    "fit": "Will it fit?",
    "nan": "Are NaN faults caught and located?",
    "modeldir": "Is the model directory safe to load?",
    "serving": "Did the new vLLM get slower or break?",
    "timings": "How long do the in-process steps take?",
    "tests": "Do the harness's own tests pass?",
}
BAD_OUTCOMES = ("failed", "error")


def suite_of(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    if len(parts) >= 2 and parts[0] == "suites":
        return parts[1]
    return parts[0] if parts[0] == "tests" else "other"


def tests_by_suite(results: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in results.get("tests", []):
        out.setdefault(suite_of(t["nodeid"]), []).append(t)
    return out


def test_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1].removeprefix("test_")


def _failed(tests: list[dict]) -> list[dict]:
    return [t for t in tests if t["outcome"] in BAD_OUTCOMES]


def _counts(tests: list[dict]) -> str:
    counts: dict[str, int] = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _failure_lines(tests: list[dict], limit: int = 5) -> list[str]:
    lines = [f"{test_name(t['nodeid'])}: {t.get('message') or t['outcome']}" for t in _failed(tests)[:limit]]
    if len(_failed(tests)) > limit:
        lines.append(f"and {len(_failed(tests)) - limit} more failed (see Tests below)")
    return lines


def _record(tests: list[dict], name: str) -> dict:
    for t in tests:
        if t["nodeid"].split("::")[-1].split("[")[0] == name:
            return t.get("record") or {}
    return {}


def _outcome(tests: list[dict], name: str) -> str | None:
    for t in tests:
        if t["nodeid"].split("::")[-1].split("[")[0] == name:
            return t["outcome"]
    return None


def gpu_state(results: dict) -> tuple[str, str]:
    gpu = (results.get("machine") or {}).get("gpu") or {}
    if gpu:
        return gpu.get("state", "unknown"), gpu.get("reason", "")
    from .machine import readiness

    return readiness(results.get("environment") or {})


# ---------------------------------------------------------------------------------------------


def hw(results: dict, tests: list[dict]) -> Verdict:
    rows = (results.get("tables") or {}).get("Readiness", [])
    fails = [r for r in rows if str(r.get("verdict")).lower() == "fail"]
    warns = [r for r in rows if str(r.get("verdict")).lower() == "warn"]
    passed = [r for r in rows if str(r.get("verdict")).lower() == "pass"]
    state, reason = gpu_state(results)
    checked = {str(r.get("check")) for r in rows}
    other_failures = [t for t in _failed(tests) if test_name(t["nodeid"]).split("[")[0] not in checked]
    lines = [f"{r['check']}: {r.get('value') or ''}".rstrip(": ") for r in fails]
    fixes = [str(r.get("fix") or "") for r in fails]
    lines += _failure_lines(other_failures)
    fixes += [""] * (len(lines) - len(fixes))
    if fails or other_failures or state == "broken":
        if state == "broken" and not fails:
            lines.insert(0, f"GPU present but unusable: {reason}")
            fixes.insert(0, "")
        return Verdict(QUESTIONS["hw"], "Not ready", "bad", lines, fixes)
    if state == "absent":
        return Verdict(QUESTIONS["hw"], "No GPU found", "warn",
                       [f"{reason}: GPU checks skipped", f"{fmt.plural(len(passed), 'check')} passed without a GPU"],
                       ["install the NVIDIA driver (or run on the GPU machine); use --expect-gpu to fail instead", ""])
    lines = [f"{fmt.plural(len(passed), 'check')} passed on {reason}"]
    fixes = [""]
    skipped: dict[str, list[str]] = {}
    for r in rows:
        if str(r.get("verdict")).lower() == "skip":
            skipped.setdefault(str(r.get("value") or "skipped"), []).append(str(r.get("check")))
    for why, checks in skipped.items():
        lines.append(f"skipped {', '.join(checks[:4])}{' and more' if len(checks) > 4 else ''}: {why}")
        fixes.append("")
    for r in warns:
        lines.append(f"caveat, {r['check']}: {r.get('value') or ''}")
        fixes.append(str(r.get("fix") or ""))
    return Verdict(QUESTIONS["hw"], "Ready" if not warns else "Ready, with caveats", "good" if not warns else "warn",
                   lines, fixes)


def vram(results: dict, tests: list[dict]) -> list[Verdict]:
    out = []
    rec = _record(tests, "test_prediction_matches_measurement")
    held = _record(tests, "test_held_out_architectures_within_tolerance")
    agree = _record(tests, "test_planner_agrees_with_emulated_budget")
    lines = []
    if rec:
        lines.append(f"median |error| {fmt.percent(rec['median_abs_error'])}, worst {fmt.percent(rec['worst_abs_error'])}"
                     f" over {rec['rows']} measured cases (accelerate's estimate: median "
                     f"{fmt.percent(rec.get('accelerate_median_abs_error', float('nan')))})")
    if held:
        lines.append(f"held-out architectures: median {fmt.percent(held['median_abs_error'])}, worst "
                     f"{fmt.percent(held['worst_abs_error'])} over {held['rows']} cases")
    if agree:
        wrong = agree.get("disagreements") or []
        total = agree.get("budget_cases") or 0
        lines.append(f"planner agreed with the emulated card in {total - len(wrong)} of {total} cases")
    failures = _failed(tests)
    lines += _failure_lines(failures)
    if lines:
        state = "bad" if failures else "good"
        answer = "Off: see failures" if failures else "Within tolerance"
        out.append(Verdict(QUESTIONS["vram"], answer, state, lines))
    for fig in results.get("figures", []):
        if fig.get("kind") == "fit_map":  # prefill, and training when the suite drew its map too
            out.append(fit(fig["data"]))
    if not out:
        out.append(generic("vram", tests))
    return out


def fit(data: dict) -> Verdict:
    budget = fmt.size(data["budget_bytes"])
    lines, fitting = [], 0
    focus = data.get("focus")
    panels = [p for p in data["panels"] if not focus or p["model"] == focus] or data["panels"]
    for panel in panels:
        reach: dict[int, list[str]] = {}  # longest fitting context -> precisions
        for precision, row in zip(panel["precisions"], panel["cells"]):
            ok = [c for c, cell in zip(panel["contexts"], row) if cell["fits"]]
            reach.setdefault(max(ok) if ok else 0, []).append(precision)
        fitting += any(reach)
        parts = [f"{', '.join(ps)} to {fmt.tokens(c)}" for c, ps in sorted(reach.items(), reverse=True) if c]
        if 0 in reach:
            parts.append(f"{', '.join(reach[0])} not even at {fmt.tokens(min(panel['contexts']))}")
        lines.append(f"{panel['model']}: " + "; ".join(parts))
    if focus:
        answer = "Fits" if fitting else "Does not fit"
    else:
        answer = f"{fitting} of {len(panels)} models fit"
    state = "good" if fitting == len(panels) else "warn" if fitting else "bad"
    return Verdict(f"Will it fit in {budget}? ({data.get('what', 'longest prefill context, batch 1')})", answer, state, lines)


def nan(results: dict, tests: list[dict]) -> Verdict:
    """A fault counts once however many devices it is injected on: caught when a variant ran and
    passed, missed when a variant failed."""
    faults: dict[str, list[dict]] = {}
    for t in tests:
        name = test_name(t["nodeid"])
        if name.startswith("case"):
            faults.setdefault(name.split("[")[0], []).append(t)
    missed = [f for f, ts in faults.items() if _failed(ts)]
    caught = [f for f, ts in faults.items() if f not in missed and any(t["outcome"] == "passed" for t in ts)]
    skipped = [t for ts in faults.values() for t in ts if t["outcome"] == "skipped"]
    failures = _failed(tests)
    lines = [f"{len(caught)} of {fmt.plural(len(faults), 'injected fault')} caught and located"]
    if skipped:
        lines.append(f"{fmt.plural(len(skipped), 'variant')} skipped: {skipped[0].get('message') or 'skipped'}")
    lines += _failure_lines(failures)
    if failures:
        return Verdict(QUESTIONS["nan"], f"{len(missed)} missed" if missed else "Failures", "bad", lines)
    not_run = [f for f in faults if f not in caught and f not in missed]
    if not_run:
        lines.append(f"not run here: {', '.join(not_run)}")
    if len(caught) == len(faults) and faults:
        return Verdict(QUESTIONS["nan"], "All caught", "good", lines)
    if caught:
        return Verdict(QUESTIONS["nan"], f"All that ran caught ({len(caught)} of {len(faults)})", "good",
                       lines)
    return Verdict(QUESTIONS["nan"], "Not run", "neutral", lines)


def modeldir(results: dict, tests: list[dict]) -> Verdict:
    rows = (results.get("tables") or {}).get("modeldir: broken variants", [])
    refused = [r for r in rows if r.get("refused") in (True, "yes", "True")]
    lines = []
    merged = _outcome(tests, "test_merged_dir_passes_check_dir")
    rec = _record(tests, "test_merged_dir_passes_check_dir")
    if merged:
        lines.append("merged directory: " + ("passes check-dir" if merged == "passed" else f"check-dir {merged}")
                     + (f" ({rec['findings']} findings)" if "findings" in rec else ""))
    if rows:
        lines.append(f"{len(refused)} of {len(rows)} broken directories refused with their own code")
        for r in rows:
            if r not in refused:
                lines.append(f"not refused: {r.get('variant')} (expected {r.get('expected')})")
    failures = _failed(tests)
    lines += _failure_lines(failures)
    if failures:
        return Verdict(QUESTIONS["modeldir"], "Refused / check failed", "bad", lines)
    if merged == "passed":
        return Verdict(QUESTIONS["modeldir"], "Safe: merged directory passes", "good", lines)
    return Verdict(QUESTIONS["modeldir"], "Checked", "neutral", lines or [_counts(tests)])


def serving(results: dict, tests: list[dict]) -> Verdict:
    rows = (results.get("tables") or {}).get("Upgrade rehearsal", [])
    verdicts = [str(r.get("verdict", "")).lower() for r in rows]
    failures = _failed(tests)
    lines = []
    regressed = [r for r in rows if str(r.get("verdict")).lower() == "regressed"]
    unsure = [r for r in rows if str(r.get("verdict")).lower() == "inconclusive"]
    for r in regressed + unsure:
        lines.append(f"upgrade rehearsal, {r.get('metric')}: {r.get('verdict')}, "
                     f"change {fmt.value(r.get('change %'), 'change %')}")
    passed = [t for t in tests if t["outcome"] == "passed"]
    skipped = [t for t in tests if t["outcome"] == "skipped"]
    lines.append(f"{len(passed)} of {len(tests)} serving checks passed")
    lines += _failure_lines(failures)
    reasons = skip_reasons(skipped)
    lines += [f"{n} skipped: {why}" for why, n in reasons]
    if regressed:
        return Verdict(QUESTIONS["serving"], "Regressed", "bad", lines)
    if failures:
        return Verdict(QUESTIONS["serving"], "Broke: checks failed", "bad", lines)
    if unsure:
        return Verdict(QUESTIONS["serving"], "Inconclusive", "warn", lines)
    if skipped and not passed:
        return Verdict(QUESTIONS["serving"], "Not run", "neutral", [f"skipped: {skipped[0].get('message')}"])
    # A verdict over skipped checks says how many did not run and why (never a bare "No breakage")
    not_run = f"; {len(skipped)} skipped ({_short(reasons[0][0])}{', ...' if len(reasons) > 1 else ''})" if skipped else ""
    state = "warn" if skipped else "good"
    if verdicts:
        return Verdict(QUESTIONS["serving"], f"Not regressed{not_run}", state, lines)
    return Verdict(QUESTIONS["serving"], f"No breakage in {fmt.plural(len(passed), 'check')} run{not_run}", state, lines)


def skip_reasons(skipped: list[dict]) -> list[tuple[str, int]]:
    """(reason, how many tests it skipped), the most common first."""
    counts: dict[str, int] = {}
    for t in skipped:
        why = str(t.get("message") or "no reason given")
        counts[why] = counts.get(why, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])


def _short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def timings(results: dict, tests: list[dict]) -> Verdict:
    marks = results.get("benchmarks") or []
    failures = _failed(tests)
    lines = [f"{b['name']}: median {fmt.duration(b['median_s'])}" for b in
             sorted(marks, key=lambda b: -b["median_s"])[:4]]
    lines += _failure_lines(failures)
    answer = f"{len(marks)} timings measured" if marks else "No timings (benchmarks disabled?)"
    return Verdict(QUESTIONS["timings"], answer, "bad" if failures else "good" if marks else "neutral", lines)


def generic(suite: str, tests: list[dict]) -> Verdict:
    failures = _failed(tests)
    question = QUESTIONS.get(suite, f"Do the {suite} checks pass?")
    if failures:
        return Verdict(question, f"{len(failures)} failed", "bad", _failure_lines(failures))
    if all(t["outcome"] == "skipped" for t in tests):
        return Verdict(question, "Not run", "neutral", [f"skipped: {tests[0].get('message')}"])
    skipped = [t for t in tests if t["outcome"] == "skipped"]
    if skipped:  # what ran passed, but not everything ran: say how much and why, not a bare green
        reasons = skip_reasons(skipped)
        ran = len(tests) - len(skipped)
        answer = (f"All {fmt.plural(ran, 'check')} run passed; {len(skipped)} skipped "
                  f"({_short(reasons[0][0])}{', ...' if len(reasons) > 1 else ''})")
        return Verdict(question, answer, "warn", [_counts(tests)] + [f"{n} skipped: {why}" for why, n in reasons])
    return Verdict(question, "All passed", "good", [_counts(tests)])


SUITES = {"hw": hw, "vram": vram, "nan": nan, "modeldir": modeldir, "serving": serving, "timings": timings}
ORDER = ["hw", "vram", "nan", "modeldir", "serving", "timings", "tests", "other"]


def for_run(results: dict) -> list[Verdict]:
    """The verdict strip of a pytest run: one card (vram: two) per suite that ran."""
    out: list[Verdict] = []
    by_suite = tests_by_suite(results)
    for suite in sorted(by_suite, key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s)):
        tests = by_suite[suite]
        made: Any = SUITES.get(suite, lambda r, t: generic(suite, t))(results, tests)
        out += made if isinstance(made, list) else [made]
    status = results.get("status")
    if status in ("interrupted", "running"):
        out.insert(0, Verdict("Did the run finish?", "Interrupted" if status == "interrupted" else "Still running",
                              "warn", [f"{len(results.get('tests', []))} tests reported so far"]))
    if not out:
        out.append(Verdict("What ran?", "No tests ran", "neutral", []))
    return out


def headline(results: dict) -> tuple[str, str]:
    """One (answer, state) for the whole run: the worst card wins (index page)."""
    cards = for_run(results)
    rank = {"bad": 3, "warn": 2, "good": 1, "neutral": 0}
    worst = max(cards, key=lambda v: rank.get(v.state, 0))
    return worst.answer, worst.state
