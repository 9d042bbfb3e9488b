"""The public scanners' corpora (rebuilt by benchmarks/pickle/corpus.py), each file with its
peer's own expectation: malicious -> a safety error with --allow-pickle, benign -> none."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from harness.modeldir import check_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "pickle"))
import corpus  # noqa: E402

# Benign in a peer's eyes, refused by torch's weights-only rule on purpose: fickling's tests that
# plain builtins (len, dict) are not flagged; torch.load(weights_only=True) refuses both.
STRICTER_THAN_PEER = {"fickling/benign/safe_builtins_len.pkl", "fickling/benign/safe_builtins_dict.pkl"}


@pytest.fixture(scope="module")
def corpus_dir() -> Path:
    return corpus.build()


def test_every_corpus_file_gets_its_peers_verdict(corpus_dir, tmp_path):
    files = corpus.load_manifest(corpus_dir)
    assert sum(f["expect"] == "malicious" for f in files) >= 150
    wrong = []
    for index, item in enumerate(files):
        one = tmp_path / str(index)
        one.mkdir()
        shutil.copy(corpus_dir / item["path"], one)
        report = check_dir(one, allow_pickle=True)
        refused = any(f.severity == "error" and f.code.startswith("safety.") for f in report.findings)
        expect_refused = item["expect"] == "malicious" or item["path"] in STRICTER_THAN_PEER
        if refused != expect_refused:
            wrong.append((item["path"], [(f.code, f.message[:120]) for f in report.findings]))
    assert wrong == []
