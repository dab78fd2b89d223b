"""Print README's "Supported model families" table from the model zoo test's own lists.

    python scripts/support_table.py            # print the markdown table
    python scripts/support_table.py --write    # replace the table between README's support-table markers

The rows come from FAMILIES, REFUSED and NOT_VERIFIED in tests/testkit/zoo.py (what tests/test_model_zoo.py runs), so the table says exactly
what that test checks (tests/test_model_zoo.py::test_readme_support_table_is_generated keeps them equal).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "tests" / "testkit" / "zoo.py"
README = ROOT / "README.md"
START, END = "<!-- support-table:start -->", "<!-- support-table:end -->"


def load_zoo() -> ModuleType:
    """tests/testkit/zoo.py as a module (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location("headedit_model_zoo", ZOO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def table(zoo: ModuleType | None = None) -> str:
    """The markdown table: supported families (alphabetical), then refused ones, then unverified ones."""
    zoo = zoo or load_zoo()
    rows = ["| `model_type` | status | attention output projection | what the zoo checks there |",
            "|---|---|---|---|"]
    for family in sorted(zoo.FAMILIES, key=lambda f: f.model_type):
        status = "supported" + (" (fast test)" if family.fast else "")
        rows.append(f"| `{family.model_type}` | {status} | `{family.projection}` | {family.exercises} |")
    for model_type, (reason, _, _) in sorted(zoo.REFUSED.items()):
        rows.append(f"| `{model_type}` | refused | - | {reason} |")
    for model_type, reason in sorted(zoo.NOT_VERIFIED.items()):
        rows.append(f"| `{model_type}` | not verified | - | {reason} |")
    return "\n".join(rows) + "\n"


def readme_table(text: str) -> str:
    """What README holds between the markers (without them)."""
    start, end = text.index(START) + len(START), text.index(END)
    return text[start:end].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = parser.parse_args(argv)
    out = table()
    if not args.write:
        print(out, end="")
        return 0
    text = README.read_text(encoding="utf-8")
    start, end = text.index(START) + len(START), text.index(END)
    README.write_text(text[:start] + "\n" + out + text[end:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
