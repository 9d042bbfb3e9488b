"""The must-show fleet run: `harness fleet` on a real three-node Ray cluster on this machine
(node-a healthy, node-b with a corrupt vLLM native extension, node-c killed mid-run), timed, with
a screenshot of the fleet report's first screen when headless Chromium is installed.

    .venv/bin/python benchmarks/fleet/three_nodes.py        # -> reports/fleet-bench/

Writes reports/fleet-bench/three_nodes.json (wall times, each node's verdict and reason, the
outliers), the fleet report itself (fleet-latest.html/.json) and first-screen.png.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the local-cluster scenario is shared with tests/test_fleet_ray.py

from fleet_helpers import three_node_run  # noqa: E402


def screenshot(html: Path, png: Path) -> str | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return "no headless chromium (apt-get install -y chromium)"
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--screenshot={png}", "--window-size=1500,950", html.as_uri()],
                          capture_output=True, text=True, timeout=120)
    return None if png.exists() else f"chromium failed: {proc.stderr.strip()[-300:]}"


def main() -> int:
    out = ROOT / "reports" / "fleet-bench"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        run = three_node_run(Path(tmp), out)
    report = json.loads((out / "fleet-latest.json").read_text())
    problem = screenshot(out / "fleet-latest.html", out / "first-screen.png")
    figures = {k: v for k, v in run.items() if k.endswith("_s") or k == "returncode"}
    figures["nodes"] = {n["name"]: {"verdict": n["verdict"], "reason": n["reason"], "tests_done": n["tests_done"]}
                        for n in report["nodes"]}
    figures["outliers"] = report["outliers"]
    figures["screenshot"] = problem or str(out / "first-screen.png")
    (out / "three_nodes.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(run["stdout"])
    print(json.dumps({k: v for k, v in figures.items() if k != "outliers"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
