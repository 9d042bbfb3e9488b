"""A pytest run's results JSON, read back for `report`: validated against the schema shipped beside
this module (run_results.schema.json) so that a malformed file is one line and exit 2."""

from __future__ import annotations

from pathlib import Path

from ..serving.results import read_json, validate

SCHEMA_FILE = Path(__file__).with_name("run_results.schema.json")


def load(path: str | Path) -> dict:
    return validate(read_json(path), str(path), SCHEMA_FILE, "pytest run results file")
