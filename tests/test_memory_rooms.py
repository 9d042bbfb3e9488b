"""harness/memory stays in rooms of small modules, and every name is imported from the module that
defines it: no module re-exports another's names for old importers (issue 40)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MEMORY = REPO / "harness" / "memory"
MAX_MEMORY_MODULE_LINES = 400
SCANNED = ("harness", "tests", "suites", "benchmarks", "scripts", "measurements")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _defined(tree: ast.Module) -> set[str]:
    """Names a module binds itself at the top level (functions, classes, assignments), under if/try too."""
    names: set[str] = set()

    def walk(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try)):
                for part in (node.body, node.orelse, getattr(node, "finalbody", [])):
                    walk(part)
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)

    walk(tree.body)
    return names


def _memory_modules() -> dict[str, set[str]]:
    return {_module_name(p): _defined(ast.parse(p.read_text())) for p in MEMORY.rglob("*.py")}


def _resolve(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _reached_names(path: Path, modules: dict[str, set[str]]):
    """(line, module, name) for every name taken from a harness.memory module: `from m import name`
    and `alias.name` where `alias` is such a module."""
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(path, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif source in modules:
                    yield node.lineno, source, alias.name
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            yield node.lineno, aliases[node.value.id], node.attr


def test_no_memory_module_is_over_400_lines():
    long = {str(p.relative_to(REPO)): n for p in MEMORY.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MEMORY_MODULE_LINES}
    assert not long, f"harness/memory modules over {MAX_MEMORY_MODULE_LINES} lines (split by subject): {long}"


def test_every_memory_name_is_imported_from_the_module_that_defines_it():
    modules = _memory_modules()
    assert "harness.memory.fit.estimate" in modules and "estimate" in modules["harness.memory.fit.estimate"]
    through = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            if ".venv" in path.parts or "__pycache__" in path.parts:
                continue
            for line, module, name in _reached_names(path, modules):
                if name != "*" and name not in modules[module] and f"{module}.{name}" not in modules:
                    through.append(f"{path.relative_to(REPO)}:{line}: {module}.{name}")
    assert not through, "names imported through a module that does not define them:\n" + "\n".join(through)


def test_the_check_sees_a_re_export(tmp_path):
    """The scan above catches a name a module imports but does not define (estimate.py takes
    model_shape from shape.py), by `from` import and through a module alias alike."""
    modules = _memory_modules()
    probe = tmp_path / "probe.py"
    probe.write_text("from harness.memory.fit.estimate import model_shape, estimate\n"
                     "from harness.memory.fit import estimate as E\n"
                     "E.ModelShape\n")
    reached = sorted(_reached_names(probe, modules))
    assert reached == [(1, "harness.memory.fit.estimate", "estimate"), (1, "harness.memory.fit.estimate", "model_shape"),
                       (3, "harness.memory.fit.estimate", "ModelShape")]
    assert [name for _, m, name in reached if name not in modules[m]] == ["model_shape", "ModelShape"]
