"""Broken merged directories: each refused with its own code, and what the loaders would have done."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness.modeldir import check_dir

import variants as v


@pytest.fixture(scope="module")
def built(chain, tmp_path_factory):
    """Every variant, built once (a 4-bit merge and a few re-saves: a few seconds)."""
    root = tmp_path_factory.mktemp("variants")
    out = {}
    for i, variant in enumerate(v.VARIANTS):
        d = root / f"{i:02d}"
        variant.build(chain, d)
        out[variant.name] = d
    return out


@pytest.mark.parametrize("variant", v.VARIANTS, ids=[x.name.replace(" ", "_") for x in v.VARIANTS])
def test_variant_refused_with_its_code(variant, built, record):
    d = built[variant.name]
    report = check_dir(d, deep=variant.deep)
    errors = sorted({f.code for f in report.errors})
    record.row("modeldir: broken variants", {"variant": variant.name, "expected": variant.code,
                                             "errors": ", ".join(errors), "refused": not report.ok})
    assert not report.ok
    assert variant.code in errors, report.findings
    assert not (d / v.REMOTE_MARKER).exists() and not (d / v._Payload.marker).exists()


def test_codes_are_distinct():
    assert len({x.code for x in v.VARIANTS}) == len(v.VARIANTS)


def _load(d):
    from harness.models import load_model

    return load_model(d, "fp32", "cpu")


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


# -- what transformers does with them: it loads, and the model is silently wrong ----------------

def test_transformers_random_initialises_a_missing_tensor(chain, built):
    model = _load(built["missing tensor"])  # no exception
    assert (_logits(model, chain.input_ids) - chain.peft_logits).abs().max() > 1e-2


def test_transformers_random_initialises_a_dropped_lm_head(chain, built):
    model = _load(built["tied embeddings: lm_head dropped"])
    assert (_logits(model, chain.input_ids) - chain.peft_logits).abs().max() > 1e-2


def test_transformers_unties_silently_against_the_config(chain, built):
    """config.json says tied; transformers 5 keeps the stored lm_head (a warning only), so the
    directory means two different models depending on whether a loader honours the config."""
    model = _load(built["tied embeddings: trained lm_head ignored"])
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


def test_transformers_applies_a_stray_adapter_on_top(chain, built):
    clean = _logits(_load(chain.merged_dir), chain.input_ids)
    stray = _logits(_load(built["stray adapter files"]), chain.input_ids)
    assert (clean - chain.peft_logits).abs().max() < 1e-4
    assert (stray - chain.peft_logits).abs().max() > 1e-2  # the adapter counted twice


def test_transformers_loads_nan_weights(chain, built):
    model = _load(built["NaN weights"])  # no error, no warning about the values
    assert torch.isnan(model.get_parameter(v.DOWN)).any()
    assert torch.isnan(_logits(model, chain.input_ids)).all()


def test_added_token_crashes_the_forward(built):
    from harness.models import load_tokenizer

    d = built["added tokens without resize"]
    ids = load_tokenizer(d)(f"hello {v.ADDED_TOKEN}", return_tensors="pt")["input_ids"]
    model = _load(d)  # loads fine
    with pytest.raises(IndexError):
        model(ids)


def test_pickle_payload_would_run_but_check_dir_never_does(built, tmp_path):
    d = built["pickle payload"]
    assert not (d / v._Payload.marker).exists()
    script = (f"import torch; torch.load({str(d / 'pytorch_model.bin')!r}, weights_only=True)")
    refused = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert refused.returncode != 0 and not (tmp_path / v._Payload.marker).exists()
    unsafe = f"import torch; torch.load({str(d / 'pytorch_model.bin')!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", unsafe], cwd=tmp_path, capture_output=True, text=True)
    assert (tmp_path / v._Payload.marker).exists()  # the harmless payload ran: `touch PWNED`


# -- what vLLM does with one: it refuses to start ------------------------------------------------

@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_fails_on_leftover_adapter_keys(built, vllm_python, settings, record):
    from harness.serving.launcher import ServerStartError, launch_vllm

    log_dir = settings.report_dir / "logs" / "modeldir-leftover-keys"
    for old in log_dir.glob("*.log"):
        old.unlink()
    with pytest.raises(ServerStartError):
        with launch_vllm(vllm_python, built["leftover adapter keys"], flags=["--max-model-len", "512"],
                         log_dir=log_dir, startup_timeout_s=300):
            pass
    log = "".join(p.read_text(errors="replace") for p in log_dir.glob("*.log"))
    cause = next((line for line in log.splitlines() if "no module or parameter named" in line), None)
    record(vllm_error=cause)
    assert cause is not None and "base_layer" in cause, log[-2000:]
