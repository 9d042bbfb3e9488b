"""Every kind of report in a real browser (Chromium from the OS packages, driven by Playwright):
it loads offline with no console error and no network request, the verdict is inside the first
viewport, tables sort and filter, links between a run, its serving pages and the index resolve.
Screenshots of each first screen go to reports/screenshots/.

The reports are rendered by the real writers from results files that real runs produced
(tests/data/reports/, see scripts/report_fixtures.py), and one run goes through the plugin end to
end. Skips only when no Chromium is installed (scripts/test installs it; CI has it).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from harness.report import bench_html, index, run_html

DATA = Path(__file__).parent / "data" / "reports"
# a tuple or dict repr, or a bare None/True/False as a value (not "is_available() is True" in prose)
PYTHON_REPRS = [r"\('[^']*', ", r"\{'[^']*': ", r"(^|[:=,(\[]\s*)(None|True|False)\b"]
VIEWPORT = {"width": 1280, "height": 800}
RUN_KINDS = ["hw-gpu", "hw-cpu", "vram", "nan", "modeldir", "serving", "timings"]
BENCH_KINDS = {  # kind -> the bench results it renders (baseline first), fixture name: file name
    "serving-gate": {"gate-baseline": "gate-new", "gate-new-max-num-seqs-1": "gate-new-max-num-seqs-1"},
    "upgrade-rehearsal": {"gate-old": "gate-old", "gate-new": "gate-new"},
    "bench": {"sweep-new": "sweep-new"},
}


def chromium() -> str | None:
    for name in (os.environ.get("HARNESS_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def load(name: str) -> dict:
    return json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))


@pytest.fixture(scope="module")
def browser():
    path = chromium()
    if path is None:
        pytest.skip("no Chromium installed (apt-get install chromium; scripts/test does it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(report_dir) -> Path:
    out = Path(report_dir) / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


class Visit:
    """A page opened offline: what it asked the network for, what it logged as an error."""

    def __init__(self, browser, path: Path):
        self.page = browser.new_page(viewport=VIEWPORT)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)
        self.url = path.resolve().as_uri()
        self.page.goto(self.url, wait_until="load")

    def _route(self, route):
        url = route.request.url
        if url.startswith("file://"):
            route.continue_()
        else:  # nothing may leave the machine: record it and refuse
            self.requests.append(url)
            route.abort()

    def box(self, selector: str) -> dict:
        element = self.page.query_selector(selector)
        assert element is not None, f"{selector} not on the page"
        return element.bounding_box()

    def check_first_screen(self, shot: Path) -> None:
        assert self.errors == [], self.errors
        assert self.requests == [], self.requests
        files = [r for r in self.page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")]
        assert files == [], files  # no image, script or style fetched, not even from disk
        verdict = self.box("#verdict")
        assert 0 <= verdict["y"] and verdict["y"] + min(verdict["height"], 120) <= VIEWPORT["height"], verdict
        machine = self.box("#machine")
        assert machine["y"] < VIEWPORT["height"], f"machine line below the first screen: {machine}"
        # What the report itself wrote (verdicts, machine line, counts, table cells; not the
        # failure texts it quotes) carries no Python repr.
        text = self.page.evaluate(
            "Array.from(document.querySelectorAll('#verdict, #machine, #counts, table:not(#tests) td'))"
            ".filter(e => !e.querySelector('pre')).map(e => e.textContent).join('\\n')")
        for pattern in PYTHON_REPRS:
            match = re.search(pattern, text, re.M)
            assert match is None, f"Python repr on the page: ...{text[max(0, match.start() - 60):match.end() + 20]}..."
        self.page.screenshot(path=str(shot))


def _render_run(kind: str, out: Path) -> Path:
    page = out / f"{kind}.html"
    page.write_text(run_html.render(load(kind), index_href=None), encoding="utf-8")
    return page


def _render_bench(kind: str, out: Path) -> Path:
    names = BENCH_KINDS[kind]
    page = out / f"{kind}.html"
    page.write_text(bench_html.render([f"{f}.json" for f in names.values()], [load(n) for n in names]),
                    encoding="utf-8")
    return page


@pytest.mark.parametrize("kind", RUN_KINDS)
def test_run_report_first_screen(browser, shots, tmp_path, kind):
    visit = Visit(browser, _render_run(kind, tmp_path))
    visit.check_first_screen(shots / f"{kind}.png")
    data = load(kind)
    if kind == "hw-gpu":
        assert "Ready" in visit.page.inner_text("#verdict")
    if kind == "hw-cpu":
        assert "No GPU found" in visit.page.inner_text("#verdict")
    n = len(data["tests"])
    assert f"{n} test" in visit.page.inner_text("#counts")  # the count is the tests that ran


@pytest.mark.parametrize("kind", list(BENCH_KINDS))
def test_serving_page_first_screen(browser, shots, tmp_path, kind):
    visit = Visit(browser, _render_bench(kind, tmp_path))
    visit.check_first_screen(shots / f"{kind}.png")
    verdict = visit.page.inner_text("#verdict")
    names = list(BENCH_KINDS[kind])
    if len(names) == 2:  # the page's answer is the gate's own (same noise model, same thresholds)
        from harness.serving import compare as cmp
        from harness.serving.results import FINGERPRINT_FIELDS

        result = cmp.compare(load(names[0]), load(names[1]), allow=FINGERPRINT_FIELDS, min_repeats=1)
        expected = ("Regressed" if result.regressed else
                    "Inconclusive" if any(c.verdict.startswith("inconclusive") for c in result.changes)
                    else "Not regressed")
        assert expected in verdict.splitlines()[1], verdict
    if kind == "upgrade-rehearsal":
        assert "upgrade rehearsal" in visit.page.title()


def test_vram_memory_picture_section(browser, shots, tmp_path):
    """The memory picture of a QLoRA step and a generation, predicted beside measured, as the vram
    report draws it from suites/vram/test_memory_picture.py's run on the committed H200 snapshots."""
    visit = Visit(browser, _render_run("vram-picture", tmp_path))
    assert visit.errors == [] and visit.requests == []
    section = visit.page.locator("xpath=//div[@class='harness-section'][h3[starts-with(., 'Where the memory goes')]]")
    assert section.locator("svg").count() == 2  # one QLoRA step, one generation
    assert "measured" in section.inner_text()
    section.screenshot(path=str(shots / "vram-picture.png"))


def test_index_first_screen_and_links(browser, shots, tmp_path):
    for kind in RUN_KINDS:
        data = load(kind)
        name = f"{data['suite']}-{kind}.json"
        data["html"] = name.replace(".json", ".html")
        (tmp_path / name).write_text(json.dumps(data))
        (tmp_path / data["html"]).write_text(run_html.render(data))
    (tmp_path / "serving").mkdir()
    for names in BENCH_KINDS.values():
        for n in names:
            (tmp_path / "serving" / f"{n}.json").write_text(json.dumps(load(n)))
    _render_bench("serving-gate", tmp_path / "serving")
    index.write(tmp_path)
    visit = Visit(browser, tmp_path / "index.html")
    visit.check_first_screen(shots / "index.png")
    rows = visit.page.query_selector_all("#runs tbody tr")
    assert len(rows) == len(RUN_KINDS)
    assert len(visit.page.query_selector_all("#pages tbody tr")) == 1
    assert "TTFT p50 per vLLM version" in visit.page.content()
    # every link resolves to a page that loads without errors
    hrefs = visit.page.eval_on_selector_all("#runs a, #pages a", "els => els.map(e => e.href)")
    assert len(hrefs) == 2 * len(RUN_KINDS) + 1
    for href in hrefs:
        assert Path(href.removeprefix("file://")).is_file(), href


def test_tables_sort_and_filter(browser, tmp_path):
    visit = Visit(browser, _render_run("vram", tmp_path))
    table = "details.fold:has(summary:has-text('predicted vs measured')) table"
    visit.page.click(f"{table} >> xpath=ancestor::details/summary")  # unfold the 402-row table
    rows = f"{table} tbody tr"
    assert len(visit.page.query_selector_all(rows)) == 402
    header = visit.page.query_selector_all(f"{table} thead th")
    columns = [h.inner_text().replace("↕", "").strip() for h in header]
    seq = columns.index("seq")

    def column(i):
        return visit.page.eval_on_selector_all(rows, f"rs => rs.filter(r => r.style.display !== 'none')"
                                                     f".map(r => r.cells[{i}].textContent)")

    header[seq].click()
    values = [int(v.replace(",", "")) for v in column(seq)]
    assert values == sorted(values)
    header[seq].click()
    values = [int(v.replace(",", "")) for v in column(seq)]
    assert values == sorted(values, reverse=True)
    visit.page.fill(f"{table} >> xpath=preceding-sibling::input[1]", "phi")
    assert column(0) == []  # no phi-3 in the main matrix
    visit.page.fill(f"{table} >> xpath=preceding-sibling::input[1]", "qwen2.5-0.5b")
    assert column(0) and set(column(0)) == {"qwen2.5-0.5b"}
    assert visit.errors == []


SERVING_LIKE_RUN = """
import json, pathlib
from harness.report.bench_html import render

def test_writes_a_serving_page(report_dir, record):
    data = json.loads(pathlib.Path({bench!r}).read_text())
    out = pathlib.Path(report_dir) / "serving" / "bench.html"
    out.parent.mkdir(exist_ok=True)
    out.write_text(render(["sweep-new.json"], [data]))
    record.row("Readiness", {{"check": "driver", "value": "580.1", "verdict": "pass", "fix": ""}})
"""


def test_plugin_run_links_report_pages_and_index(browser, pytester, tmp_path, monkeypatch):
    """A real pytest run through the plugin: its report links the page it produced, the page
    links back, the index lists the run; all three load cleanly and the links resolve."""
    bench = tmp_path / "sweep-new.json"
    bench.write_text(json.dumps(load("sweep-new")))
    pytester.makepyfile(test_serving_like=SERVING_LIKE_RUN.format(bench=str(bench)))
    root = str(Path(__file__).resolve().parents[1])  # this checkout's harness, also under another install
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    result = pytester.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    reports = pytester.path / "reports"
    run = json.loads((reports / "latest.json").read_text())
    assert run["links"] == [{"title": "Serving benchmark", "path": "serving/bench.html"}]
    report = Visit(browser, reports / run["html"])
    assert report.errors == [] and report.requests == []
    report.page.click("#links >> text=Serving benchmark")
    report.page.wait_for_load_state()
    assert report.page.url.endswith("serving/bench.html") and report.errors == []
    back = report.page.get_attribute("#links a", "href")
    assert (reports / "serving" / back).resolve() == (reports / run["html"]).resolve()
    report.page.click("#links a")
    report.page.wait_for_load_state()
    assert report.page.url.endswith(run["html"])
    report.page.click("#links >> text=all runs")
    report.page.wait_for_load_state()
    assert report.page.url.endswith("index.html") and report.errors == [] and report.requests == []
    assert len(report.page.query_selector_all("#runs tbody tr")) == 1
