"""The committed measurements (measurements/manifest.json): every entry's data is what the manifest
says it is, each packed run's summary is what its raw files give today, each says what produced it
and what reads it, and nothing lies in the tree that no entry accounts for."""

from __future__ import annotations

import json
from pathlib import Path

import measurements as M
import pytest

REPO = M.HERE.parent
ENTRIES = M.entries()
TREE_FILES = {"__init__.py", "manifest.json", "README.md", "vram/README.md"}  # the reader and its notes


def _files(e: dict) -> list[Path]:
    if "archive" in e:
        return [M.HERE / e["archive"], M.HERE / e["summary"]] + ([M.HERE / e["notes"]] if e.get("notes") else [])
    return [M.HERE / e["folder"] / f for f in e["files"]]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_entry_is_its_data_and_says_where_it_came_from(entry):
    for p in _files(entry):
        assert p.is_file(), f"{entry['name']}: {p} is missing"
    if "archive" in entry:
        assert M.sha256(M.path(entry["name"])) == entry["sha256"], f"{entry['name']}: the archive changed"
    else:
        changed = [f for f, digest in entry["files"].items() if M.sha256(M.folder(entry["name"]) / f) != digest]
        assert not changed, (f"{entry['name']}: changed since recorded: {changed} (rewritten on purpose? "
                             f"python scripts/pack_measurement.py --refresh {entry['name']})")
    made = entry["produced_by"]
    assert made["script"] and made["date"], entry["name"]
    script = made["script"].split()[0]
    assert (REPO / script).exists() or not script.endswith((".py", ".sh")), f"{entry['name']}: no {script}"
    assert entry["read_by"], f"{entry['name']}: nothing reads it"
    for reader in entry["read_by"]:
        assert (REPO / reader.split()[0]).exists(), f"{entry['name']}: reader {reader} does not exist"


PACKED = [e for e in ENTRIES if "archive" in e]


@pytest.mark.parametrize("entry", PACKED, ids=[e["name"] for e in PACKED])
def test_summary_is_what_the_raw_run_gives(entry):
    committed = json.loads((M.HERE / entry["summary"]).read_text())
    assert M.summarise(entry["name"]) == committed


def test_every_file_in_the_tree_belongs_to_one_entry():
    owned: dict[Path, str] = {}
    for e in ENTRIES:
        for p in _files(e):
            assert p not in owned, f"{p} is in {owned.get(p)} and {e['name']}"
            owned[p] = e["name"]
    stray = [str(p.relative_to(M.HERE)) for p in sorted(M.HERE.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and p not in owned
             and str(p.relative_to(M.HERE)) not in TREE_FILES]
    assert not stray, f"files under measurements/ no manifest entry lists: {stray}"


def test_the_families_truth_runs_are_the_first_thirteen_in_order():
    """The verdict figures (suites/vram/test_families.py, docs/vram.md) read runs 1-13, in run order."""
    names = [e["name"] for e in M.entries("families-run") if e.get("families_truth")]
    assert names == [f"vram/families/run-{n:02d}" for n in range(1, 14)]
