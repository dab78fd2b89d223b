"""`headedit bench <name>`: speed benchmarks, each checked for identical results against a reference.

Sub-benchmarks register themselves: every module `headedit.bench_*` with `add_bench_parser(sub)` adds one
sub-command and sets `bench_func(args, console) -> int` as its default (e.g. `bench eval`, `bench discover`).
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
from typing import Any

from ..errors import HeadeditError


def bench_modules() -> list[Any]:
    import headedit

    found = []
    for info in sorted(pkgutil.iter_modules(headedit.__path__), key=lambda m: m.name):
        if info.name.startswith("bench_"):
            module = importlib.import_module(f"headedit.{info.name}")
            if hasattr(module, "add_bench_parser"):
                found.append(module)
    return found


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks: fast path vs reference path, same model and data")
    benches = p.add_subparsers(dest="bench_command", metavar="BENCH")
    for module in bench_modules():
        module.add_bench_parser(benches)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, console: Any) -> int:
    func = getattr(args, "bench_func", None)
    if func is None:
        raise HeadeditError("name a benchmark", "e.g. headedit bench eval --task boolq")
    return int(func(args, console) or 0)
