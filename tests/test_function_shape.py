"""The shape of every function in lengthgen/: at most 8 parameters (self and cls not counted, *args
and **kwargs one each) and at most 60 lines from its `def` to its last line. Options that travel
together are one object (`lengthgen.EvalSettings`, `lengthgen.ReproduceRequest`, the evaluator's
`Measure`, the per-token `Scorer`), and a long function is split into named steps. Each rule is also
shown failing on a planted violation, found by the same function that reads the package."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lengthgen"
MAX_PARAMETERS = 8
MAX_LINES = 60


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters a function takes: self or cls (a method's first) not counted, *args and
    **kwargs one each."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    bound = 1 if positional and positional[0].arg in ("self", "cls") else 0
    return len(positional) - bound + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)


def violations(source: str, where: str = "<planted>") -> list[str]:
    """Every function of `source` (methods and nested functions too) with more than MAX_PARAMETERS
    parameters or more than MAX_LINES lines, one line each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        count, lines = parameters(node), node.end_lineno - node.lineno + 1
        if count > MAX_PARAMETERS:
            found.append(f"{where}:{node.lineno} {node.name} takes {count} parameters (at most {MAX_PARAMETERS}): "
                         "pass the object they come from, or group them in a dataclass")
        if lines > MAX_LINES:
            found.append(f"{where}:{node.lineno} {node.name} is {lines} lines long (at most {MAX_LINES})")
    return found


def test_no_function_of_the_package_takes_more_than_8_parameters_or_60_lines():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50  # the whole package is read
    found = [line for path in files
             for line in violations(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "\n".join(found)


def test_a_planted_long_parameter_list_is_caught_and_self_is_not_counted():
    assert violations("class A:\n    def f(self, a, b, c, d, e, f, g, h):\n        pass\n") == []
    assert violations("class A:\n    @classmethod\n    def f(cls, a, b, c, d, e, f, g, h):\n        pass\n") == []
    assert violations("def f(a, b, c, d, e, *args, k=1, **kwargs):\n    pass\n") == []  # 8: *args and **kwargs one each
    planted = "class A:\n    def f(self, a, b, c, d, e, f, g, *args, **kwargs):\n        pass\n"
    assert violations(planted) == ["<planted>:2 f takes 9 parameters (at most 8): pass the object they come from, "
                                   "or group them in a dataclass"]
    nested = "def outer():\n    def inner(a, b, c, /, d, e, f, *, g, h, i):\n        pass\n"
    assert [line.split(" takes")[0] for line in violations(nested)] == ["<planted>:2 inner"]


def test_a_planted_long_function_is_caught():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))
    assert violations(f"def f():\n{body}") == []  # 60 lines: the def and 59 of body
    assert violations(f"async def f():\n{body}    return x0\n") == ["<planted>:1 f is 61 lines long (at most 60)"]
