"""The code's shape: no function in nmt/ is longer than 80 lines, and a training run reads in
one class: nmt.training.loop.Run's state is changed by its own methods, never by free
functions elsewhere that are handed the run."""

import ast
from pathlib import Path

import nmt

PACKAGE = Path(nmt.__file__).resolve().parent


def long_functions(root: Path, limit: int = 80) -> list[str]:
    """'path:line name (N lines)' for each function or method of ``root``'s modules longer
    than ``limit`` lines, decorators excluded, docstring included."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} "
                               f"({n} lines)")
    return out


def test_no_function_in_nmt_is_longer_than_80_lines():
    assert long_functions(PACKAGE) == []


def functions_taking_the_run(root: Path) -> list[str]:
    """'path:line name' for each function outside loop.py with a parameter named ``run``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "loop.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(a.arg == "run" for a in [*node.args.posonlyargs, *node.args.args,
                                                *node.args.kwonlyargs]):
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}")
    return out


def test_the_training_run_reads_in_one_class():
    assert functions_taking_the_run(PACKAGE / "training") == []
