"""The server a run tested when the harness did not start it (--endpoint): the machine line then
describes that server (its /version, its models), not the vLLM of the venv the run came from."""

from __future__ import annotations

from typing import Any


def describe(server: dict[str, Any]) -> str:
    """'http://host:8000: version 0.32.0 (its /version), serving m', from
    harness.serving.endpoint.server_identity's dict."""
    version = server.get("version")
    said = f"version {version} (its /version)" if version else "version unknown (no answer on /version)"
    models = ", ".join(server.get("models") or []) or "no model listed on /v1/models"
    return f"{server.get('url')}: {said}, serving {models}"


def with_server(parts: list[tuple[str, str]], server: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The machine line's (label, value) pairs with the local vLLM replaced by the server tested."""
    if not server:
        return parts
    return [p for p in parts if p[0] != "vLLM"] + [("server tested", describe(server))]


def line_with_server(line: str, server: dict[str, Any] | None) -> str:
    """The one-line machine summary (env.header_line's 'a: x | b: y') with the same replacement."""
    if not server:
        return line
    kept = [part for part in line.split(" | ") if not part.startswith("vLLM:")]
    return " | ".join(kept + [f"server tested: {describe(server)}"])
