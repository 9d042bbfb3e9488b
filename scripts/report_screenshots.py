#!/usr/bin/env python3
"""The docs' screenshots (docs/reports.md): the browser tests' first screens (reports/screenshots/*.png) and
the report sections they shoot (SECTIONS: the vram report's memory picture, in the README) scaled to 800 px
and reduced to a 128-colour palette, written to docs/screenshots/.

    .venv/bin/python -m pytest tests/test_report_browser.py && .venv/bin/python scripts/report_screenshots.py
"""

import sys
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["hw-gpu", "hw-cpu", "vram", "nan", "modeldir", "serving-gate", "upgrade-rehearsal", "index"]
SECTIONS = ["vram-picture"]  # one section of a report, not its first screen


def main() -> int:
    src, out = ROOT / "reports" / "screenshots", ROOT / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    missing = [k for k in KINDS + SECTIONS if not (src / f"{k}.png").is_file()]
    if missing:
        print(f"missing in {src}: {', '.join(missing)} (run tests/test_report_browser.py first)", file=sys.stderr)
        return 2
    total = 0
    for kind in KINDS + SECTIONS:
        image = Image.open(src / f"{kind}.png").convert("RGB")
        image = image.resize((800, round(image.height * 800 / image.width)), Image.LANCZOS)
        image.quantize(colors=128, method=Image.Quantize.FASTOCTREE).save(out / f"{kind}.png", optimize=True)
        total += (out / f"{kind}.png").stat().st_size
    print(f"wrote {len(KINDS) + len(SECTIONS)} screenshots to {out}, {total / 1024:.0f} KiB in all", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
