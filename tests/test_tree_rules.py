"""Rules of the whole tree, read from the source (no import of what they check): file size,
parameter counts, and which way the imports go between the product (fa4_aot), the build
(build_tools), the benchmarks (bench), the maintainer scripts (tools) and the tests."""

import ast
import inspect
import subprocess

import pytest

from conftest import ROOT

MAX_LINES = 800
MAX_PARAMS = 10


def _python_files() -> list:
    """The tree's .py files as a clone has them (tracked and unignored)."""
    r = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                        "*.py"], cwd=ROOT, capture_output=True)
    if r.returncode == 0:
        files = [ROOT / f for f in r.stdout.decode().split("\0") if f]
    else:  # an unpacked sdist
        skip = {".git", ".venv", "build", "dist", "_artifacts"}
        files = [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in files if p.is_file())


FILES = _python_files()


def _rel(path) -> str:
    return path.relative_to(ROOT).as_posix()


def _attention_names() -> set:
    """fa4_aot.attention's parameters (FlashAttention's names), read from its source."""
    tree = ast.parse((ROOT / "fa4_aot/interface.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "attention")
    a = fn.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}


def test_no_python_file_over_800_lines():
    long = [f"{_rel(p)}: {n}" for p in FILES
            if (n := p.read_text(errors="replace").count("\n")) > MAX_LINES]
    assert not long, long


def test_interface_stays_short():
    """The call path is read most: fa4_aot/interface.py stays under 500 lines."""
    assert (ROOT / "fa4_aot/interface.py").read_text().count("\n") <= 500


def test_no_function_outside_the_kernels_takes_more_than_10_parameters():
    """Outside fa4_aot/kernels/ (whose device functions take the tile's state), no function
    takes more than 10 parameters, but those whose every parameter is one of
    ``fa4_aot.attention``'s: FlashAttention's API itself and the tests' stand-ins for it."""
    api = _attention_names() | {"_", "self"}
    bad = []
    for p in FILES:
        if _rel(p).startswith("fa4_aot/kernels/"):
            continue
        for node in ast.walk(ast.parse(p.read_text(errors="replace"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
            n = len(names) - (names[:1] == ["self"] or names[:1] == ["cls"])
            if n > MAX_PARAMS and not set(names) <= api:
                bad.append(f"{_rel(p)}:{node.lineno} {getattr(node, 'name', 'lambda')} ({n})")
    assert not bad, bad


def _imports(path) -> set:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("where,banned", [
    ("fa4_aot/", {"build_tools", "bench", "benchlib", "tracelib", "tools", "cutlass"}),
    ("build_tools/", {"bench", "benchlib", "tracelib", "tools"}),
    ("tests/", {"tools"}),
])
def test_imports_point_down(where, banned):
    """fa4_aot imports none of the others (and never cutlass: the build's dsl_compile does);
    build_tools imports neither the benchmarks nor the maintainer scripts; the tests do not
    import tools (tools/tests/ has their tests)."""
    bad = [f"{_rel(p)}: {sorted(_imports(p) & banned)}" for p in FILES
           if _rel(p).startswith(where) and _imports(p) & banned]
    if where == "fa4_aot/":  # the DSL kernel sources are the build's, imported by it only
        bad = [b for b in bad if not b.startswith("fa4_aot/kernels/")]
    assert not bad, bad


def test_the_rules_see_the_tree():
    assert len(FILES) > 100 and ROOT / "fa4_aot/interface.py" in FILES
    assert "cu_seqlens_q" in _attention_names() and inspect.isfunction(_imports)
