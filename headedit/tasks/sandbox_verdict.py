"""Split test asserts so that their outcome is decided outside the program's process.

`assert f(3) == 9` becomes the *leaf* `f(3)`, evaluated inside the program's sandbox, and the *template*
`__headedit_leaf__(0) == 9`, evaluated outside on the leaf's value (sent back as plain data). The split follows
the assert's comparison structure: `not`/`and`/`or`, comparisons, arithmetic, tuple/list/set displays and the
closeness helpers `abs`, `round`, `math.isclose`, `cmath.isclose`, `math.fabs`. A leaf is any other
sub-expression that mentions a name other than safe builtins and a few stdlib modules (or one the program rebinds);
sub-expressions built only from literals and those names stay in the template. The program never sees the
template, so it can only choose leaf values: a forged report is worth what returning those values would be.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Literal, Union

from headedit.tasks.sandbox_runner import LEAF, TRUSTED_MODULES, decode

SAFE_BUILTINS = frozenset({
    "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "chr", "complex", "dict", "divmod",
    "enumerate", "filter", "float", "format", "frozenset", "hex", "int", "isinstance", "len", "list", "map", "max",
    "min", "oct", "ord", "pow", "range", "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum",
    "tuple", "type", "zip", "True", "False", "None",
})
STRUCTURAL_NAMES = frozenset({"abs", "round"})
STRUCTURAL_ATTRS = frozenset({("math", "isclose"), ("math", "fabs"), ("cmath", "isclose")})

Step = tuple[Literal["exec", "eval"], Union[str, list[str]]]


class TestShapeError(ValueError):
    """A test the sandbox cannot split (bad syntax, or an assert nested in a statement)."""


@dataclass(frozen=True)
class Fast:
    """An outcome the parent decides itself: `leaf == literal`, `leaf != literal`, `leaf`, `not leaf`."""

    kind: Literal["eq", "ne", "truth", "falsity"]
    leaf: int
    literal: object = None


@dataclass(frozen=True)
class Assert:
    source: str  # the assert as written (for details)
    template: str  # the expression, leaves replaced by __headedit_leaf__(i)
    leaves: tuple[str, ...]  # sources evaluated inside the program's process
    fast: Fast | None  # None: a check job evaluates the template


@dataclass(frozen=True)
class Plan:
    steps: list[Step]  # what the program job runs after code and setup, in order
    asserts: list[Assert]  # one per "eval" step


def program_names(*sources: str) -> frozenset[str] | None:
    """Every module-level name the program could rebind (over-approximated); None when any name could be."""
    names: set[str] = set()

    def visit(node: ast.AST) -> bool:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(child.name)  # their bodies bind locals only (`global` is collected below)
                continue
            if isinstance(child, ast.Lambda):
                continue
            if isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load):
                names.add(child.id)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for alias in child.names:
                    if alias.name == "*":
                        return False
                    bound = alias.asname or alias.name.split(".")[0]
                    real_module = isinstance(child, ast.Import) and alias.name == bound
                    if not (real_module and bound in TRUSTED_MODULES):  # `import math` binds the real module
                        names.add(bound)
            if not visit(child):
                return False
        return True

    for src in sources:
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue  # the program job reports the error itself
        if not visit(tree):
            return None
        names.update(n for node in ast.walk(tree) if isinstance(node, (ast.Global, ast.Nonlocal)) for n in node.names)
    return frozenset(names)


def _bound_inside(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.comprehension):
            names.update(n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name))
        elif isinstance(sub, ast.Lambda):
            names.update(a.arg for a in ast.walk(sub.args) if isinstance(a, ast.arg))
    return names


def _trusted(node: ast.AST, names: frozenset[str]) -> bool:
    """Built only from literals, safe builtins and stdlib modules: evaluated outside the program's process."""
    local = _bound_inside(node)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id not in names and sub.id not in local:
            return False
        if isinstance(sub, ast.Attribute) and sub.attr.startswith("_"):
            return False
        if isinstance(sub, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
            return False
    return True


def _structural_call(node: ast.Call, names: frozenset[str]) -> bool:
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in STRUCTURAL_NAMES and func.id in names
    return (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in names
            and (func.value.id, func.attr) in STRUCTURAL_ATTRS)


def _split(node: ast.expr, names: frozenset[str], leaves: list[str]) -> ast.expr:
    """The template for `node`; appends the sources of its leaves to `leaves` in evaluation order."""
    def rec(sub: ast.expr) -> ast.expr:
        return _split(sub, names, leaves)

    if isinstance(node, ast.Compare):
        return ast.Compare(rec(node.left), node.ops, [rec(c) for c in node.comparators])
    if isinstance(node, ast.BoolOp):
        return ast.BoolOp(node.op, [rec(v) for v in node.values])
    if isinstance(node, ast.UnaryOp):
        return ast.UnaryOp(node.op, rec(node.operand))
    if isinstance(node, ast.BinOp):
        return ast.BinOp(rec(node.left), node.op, rec(node.right))
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and not any(isinstance(e, ast.Starred) for e in node.elts):
        elts = [rec(e) for e in node.elts]
        return ast.Set(elts) if isinstance(node, ast.Set) else type(node)(elts, ast.Load())
    if isinstance(node, ast.Call) and _structural_call(node, names):
        return ast.Call(node.func, [rec(a) for a in node.args], [ast.keyword(k.arg, rec(k.value)) for k in node.keywords])
    if _trusted(node, names):
        return node
    leaves.append(ast.unparse(node))
    return ast.Call(ast.Name(LEAF, ast.Load()), [ast.Constant(len(leaves) - 1)], [])


def _literal(node: ast.expr) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _leaf_index(node: ast.expr) -> int | None:
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == LEAF
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, int)):
        return node.args[0].value
    return None


def _fast(template: ast.expr) -> Fast | None:
    if (i := _leaf_index(template)) is not None:
        return Fast("truth", i)
    if isinstance(template, ast.UnaryOp) and isinstance(template.op, ast.Not):
        if (i := _leaf_index(template.operand)) is not None:
            return Fast("falsity", i)
    if isinstance(template, ast.Compare) and len(template.ops) == 1 and isinstance(template.ops[0], (ast.Eq, ast.NotEq)):
        kind: Literal["eq", "ne"] = "eq" if isinstance(template.ops[0], ast.Eq) else "ne"
        left, right = template.left, template.comparators[0]
        for a, b in ((left, right), (right, left)):
            i = _leaf_index(a)
            ok, value = _literal(b)
            if i is not None and ok:
                return Fast(kind, i, value)
    return None


def plan_tests(code: str, setup: str, tests: list[str]) -> Plan:
    """Parse the tests (trusted text) into the program job's steps and the asserts to judge outside."""
    rebound = program_names(code, setup)
    names = frozenset() if rebound is None else (SAFE_BUILTINS | set(TRUSTED_MODULES)) - rebound
    steps: list[Step] = []
    asserts: list[Assert] = []
    for n, text in enumerate(tests, 1):
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
            raise TestShapeError(f"test {n} does not parse: {type(err).__name__}: {err}") from None
        for stmt in tree.body:
            if isinstance(stmt, ast.Assert):
                leaves: list[str] = []
                template = ast.fix_missing_locations(ast.Expression(_split(stmt.test, names, leaves)))
                asserts.append(Assert(ast.unparse(stmt), ast.unparse(template.body), tuple(leaves),
                                      _fast(template.body)))
                steps.append(("eval", leaves))
            elif any(isinstance(sub, ast.Assert) for sub in ast.walk(stmt)):
                raise TestShapeError(f"test {n} nests an assert inside a statement; write each check as a "
                                     "top-level assert so it can be decided outside the program")
            else:
                steps.append(("exec", ast.unparse(stmt)))
    return Plan(steps, asserts)


def leaf_entries(plan: Plan, report: dict) -> list[list[dict]] | None:
    """The report's leaf results, shape-checked against the plan; None when it does not fit."""
    steps = report.get("steps")
    if not isinstance(steps, list) or len(steps) != len(plan.asserts):
        return None
    for entries, check in zip(steps, plan.asserts):
        if not isinstance(entries, list) or len(entries) != len(check.leaves):
            return None
        for e in entries:
            if not (isinstance(e, dict) and len(e) == 1 and (("ok" in e) or isinstance(e.get("err"), str))):
                return None
    return steps


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def fast_verdict(check: Assert, entries: list[dict]) -> tuple[bool, str] | None:
    """Decide `leaf == literal` and friends here; None when a check job must evaluate the template."""
    fast = check.fast
    if fast is None:
        return None
    entry = entries[fast.leaf]
    if "err" in entry:
        return False, f"{entry['err']} (in {check.leaves[fast.leaf]})"
    try:
        value = decode(entry["ok"])
        ok = {"eq": lambda: value == fast.literal, "ne": lambda: value != fast.literal,
              "truth": lambda: bool(value), "falsity": lambda: not value}[fast.kind]()
    except (ValueError, TypeError, RecursionError, MemoryError) as err:
        return False, f"the program reported a malformed value ({type(err).__name__})"
    return ok, "" if ok else f"AssertionError: {check.source} (the program's side: {_short(value)})"
