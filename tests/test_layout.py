"""The shape of the library: no import cycles, imports point down the layers, no pytest outside the plugin.

Layers, top to bottom: the entry points (``commands``, ``plugin``, ``__main__``), the capability
packages (hw, memory, nan, modeldir, quant, serving, fleet, report), and the shared leaf modules.
Every import counts, also those inside functions: a lazy import still makes a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import harness

LIBRARY = Path(harness.__file__).resolve().parent
LEAVES = {"settings", "models", "units", "atomic", "errors", "env", "pci"}
ENTRY_POINTS = {"commands", "plugin", "plugin_run", "plugin_xdist", "plugin_fixtures", "__main__"}
PYTEST_AWARE = {"harness.plugin", "harness.plugin_run", "harness.plugin_xdist", "harness.plugin_fixtures"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the same top-level package it imports (anywhere in its body)."""
    top = root.name
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` imports the submodule pkg.sub when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in targets:
                while target and target not in files and "." in target:
                    target = target.rpartition(".")[0]
                if target in files and target.split(".")[0] == top and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of names (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def unit(module: str) -> str:
    """The layer unit a module belongs to: a capability package, an entry point or a leaf module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "harness"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        src = unit(module)
        units.setdefault(src, set())
        for target in targets:
            dst = unit(target)
            if dst != src and dst not in LEAVES:
                units[src].add(dst)
    return units


def test_no_import_cycle_between_modules():
    cycle = find_cycle(import_graph(LIBRARY))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_capability_packages():
    cycle = find_cycle(package_graph(import_graph(LIBRARY)))
    assert cycle is None, "packages import each other: " + " -> ".join(cycle)


def test_imports_point_down_the_layers():
    wrong = []
    for module, targets in import_graph(LIBRARY).items():
        src = unit(module)
        for target in targets:
            dst = unit(target)
            if src in LEAVES and dst not in LEAVES:
                wrong.append(f"leaf module {module} imports {target}")
            elif src not in ENTRY_POINTS and dst in ENTRY_POINTS:
                wrong.append(f"{module} imports the entry point {target}")
    assert not wrong, "\n".join(wrong)


def test_library_never_imports_pytest():
    offenders = []
    for path in LIBRARY.rglob("*.py"):
        if module_name(path, LIBRARY) in PYTEST_AWARE:
            continue
        for node in _imports(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == "pytest" or n.startswith(("pytest.", "_pytest")) for n in names):
                offenders.append(str(path.relative_to(LIBRARY.parent)))
    assert not offenders, f"pytest imported outside the plugin modules ({sorted(PYTEST_AWARE)}): {offenders}"


def test_every_capability_package_says_what_it_answers():
    for init in LIBRARY.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.strip()) > 40, f"{init.parent.name}/__init__.py needs a docstring"


# The checker itself must be able to fail: a package with a cycle hidden in a lazy import.

def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_a_cycle_through_a_lazy_import(tmp_path):
    pkg = _write(tmp_path / "toy", {
        "__init__.py": "",
        "a.py": "from .b import thing\n",
        "b.py": "def thing():\n    from . import a\n    return a\n",
        "c/__init__.py": "from ..a import thing\n",
    })
    assert find_cycle(import_graph(pkg)) == ["toy.a", "toy.b", "toy.a"]


def test_checker_finds_a_package_cycle_and_ignores_type_checking(tmp_path):
    pkg = _write(tmp_path / "toy", {
        "__init__.py": "",
        "memory/__init__.py": "",
        "memory/plan.py": "from ..serving.launcher import start\n",
        "serving/__init__.py": "",
        "serving/launcher.py": "import toy.memory.plan\ndef start(): pass\n",
        "nan/__init__.py": "",
        "nan/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..memory import plan\n",
    })
    graph = import_graph(pkg)
    assert "toy.memory.plan" not in graph["toy.nan.x"]
    assert find_cycle(graph) == ["toy.memory.plan", "toy.serving.launcher", "toy.memory.plan"]
    assert find_cycle(package_graph(graph)) == ["memory", "serving", "memory"]


def test_modules_of_the_test_folders_have_distinct_names():
    """pytest puts each test folder on sys.path (prepend import mode): two suites' `variants.py`
    would be one module, the first one imported, and the other suite would run the wrong one."""
    root = LIBRARY.parent
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted([*root.joinpath("suites").rglob("*.py"), *root.joinpath("tests").rglob("*.py")]):
        if path.name in ("conftest.py", "__init__.py") or "data" in path.relative_to(root).parts:
            continue
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(root)} and {path.relative_to(root)}")
        seen.setdefault(path.name, path)
    assert not clashes, "same module name in two test folders: " + "; ".join(clashes)


# Size: small modules and short functions (the project's rule: modules <= 600 lines, functions <= 80).

MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80

def sizes(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """'pkg/mod.py' -> lines, and 'pkg/mod.py:function' -> lines (def line to its last line)."""
    modules, functions = {}, {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        modules[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text, rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                key = f"{rel}:{node.name}"
                functions[key] = max(length, functions.get(key, 0))
    return modules, functions


def test_no_module_over_600_lines():
    modules, _ = sizes(LIBRARY)
    long = {m: n for m, n in modules.items() if n > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them along their jobs): {long}"


def test_no_function_over_80_lines():
    _, functions = sizes(LIBRARY)
    long = {f: n for f, n in functions.items() if n > MAX_FUNCTION_LINES}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_size_checker_counts_a_function_from_def_to_its_last_line(tmp_path):
    def body(n: int) -> str:
        return "".join(f"    x{i} = {i}\n" for i in range(n))

    pkg = _write(tmp_path / "toy", {"a.py": f"def short():\n{body(40)}\n\ndef long():\n{body(80)}"})
    modules, functions = sizes(pkg)
    assert functions == {"a.py:short": 41, "a.py:long": 81} and modules["a.py"] == 41 + 2 + 81


SHORT_SUBJECTS_SINCE = "f725cbac95e26ee2e3ea8eb9a558c0d9bf65da7c"  # the rule holds from the commit after this one


def test_commit_subjects_are_at_most_72_characters():
    """`git log --oneline` stays readable: a subject says what changed, the evidence goes in the body."""
    import shutil
    import subprocess

    import pytest

    root = Path(harness.__file__).resolve().parent.parent
    if not shutil.which("git") or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    known = subprocess.run(["git", "cat-file", "-e", f"{SHORT_SUBJECTS_SINCE}^{{commit}}"], cwd=root, capture_output=True)
    if known.returncode:
        pytest.skip(f"the history before {SHORT_SUBJECTS_SINCE[:7]} is not in this clone (shallow)")
    log = subprocess.run(["git", "log", "--format=%h %s", f"{SHORT_SUBJECTS_SINCE}..HEAD"], cwd=root,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    long = [line for line in log if len(line.split(" ", 1)[1]) > 72]
    assert not long, "commit subjects over 72 characters:\n" + "\n".join(long)
