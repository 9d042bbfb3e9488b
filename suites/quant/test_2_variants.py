"""Broken quantized directories from real llm-compressor output: each refused with its own code."""

from __future__ import annotations

import pytest

from harness.modeldir import check_dir

import quant_variants as v


@pytest.fixture(scope="module")
def built(quantized, chain, tmp_path_factory):
    root = tmp_path_factory.mktemp("quant-variants")
    out = {}
    for i, variant in enumerate(v.VARIANTS):
        d = root / f"{i:02d}"
        variant.build(quantized, chain, d)
        out[variant.name] = d
    return out


@pytest.mark.parametrize("variant", v.VARIANTS, ids=[x.name.replace(" ", "_") for x in v.VARIANTS])
def test_variant_refused_with_its_code(variant, built, record):
    report = check_dir(built[variant.name])
    errors = sorted({f.code for f in report.errors})
    message = next((f.message for f in report.errors if f.code == variant.code), "")
    record.row("quant: broken variants", {"variant": variant.name, "expected": variant.code,
                                          "errors": ", ".join(errors), "refused": not report.ok})
    record(errors=errors, message=message)
    assert not report.ok
    assert variant.code in errors, report.findings


def test_codes_are_distinct():
    assert len({x.code for x in v.VARIANTS}) == len(v.VARIANTS)


def test_the_good_exports_have_no_finding(quantized):
    for name in quantized.results:
        assert check_dir(quantized.dir(name)).findings == [], name
