"""A server the harness did not start (--endpoint): which model it serves, synchronously, for the
pytest side (bench's async preflight does the same inside its session)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from ..errors import CheckFailed, UsageError


@dataclass(frozen=True)
class ServedModel:
    name: str
    max_model_len: int | None  # vLLM lists it on /v1/models


def served_models(base_url: str, timeout_s: float = 10.0) -> list[ServedModel]:
    try:
        with urllib.request.urlopen(base_url + "/v1/models", timeout=timeout_s) as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise CheckFailed(f"{base_url} is not an OpenAI-compatible server (GET /v1/models: {exc.code})") from None
    except ValueError:
        raise CheckFailed(f"{base_url} is not an OpenAI-compatible server (GET /v1/models: not JSON)") from None
    except OSError as exc:
        raise CheckFailed(f"cannot list the models of {base_url}: {exc}") from None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CheckFailed(f"{base_url} is not an OpenAI-compatible server (GET /v1/models: not a model list)")
    out = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            length = entry.get("max_model_len")
            out.append(ServedModel(entry["id"], length if isinstance(length, int) else None))
    return out


def resolve_served_model(base_url: str, name: str | None) -> ServedModel:
    """The model `name` names on the server; with no name, the only one it serves. A wrong or
    missing name is a UsageError listing what the server serves."""
    models = served_models(base_url)
    names = ", ".join(m.name for m in models) or "nothing"
    if name is None:
        if len(models) == 1:
            return models[0]
        raise UsageError(f"--model: {base_url} serves {names}: name one with --model NAME")
    for model in models:
        if model.name == name:
            return model
    raise UsageError(f"--model: {name!r} is not served by {base_url} (it serves: {names})")


def server_identity(base_url: str, timeout_s: float = 5.0) -> dict:
    """What a report says about a server the harness tested but did not start: its URL, what its
    /version answers (vLLM's: its package version) and the models /v1/models lists. Never raises:
    what could not be read is None (or []), the first reason in `error`."""
    out: dict = {"url": base_url, "version": None, "models": [], "error": None}
    try:
        with urllib.request.urlopen(base_url + "/version", timeout=timeout_s) as resp:
            data = json.load(resp)
        if isinstance(data, dict) and isinstance(data.get("version"), str):
            out["version"] = data["version"]
    except (OSError, ValueError) as exc:
        out["error"] = f"GET /version: {exc}"
    try:
        out["models"] = [m.name for m in served_models(base_url, timeout_s)]
    except CheckFailed as exc:
        out["error"] = out["error"] or str(exc)
    return out
