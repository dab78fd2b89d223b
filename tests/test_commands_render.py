"""CLI renderings at 80 columns (labels shorten, numbers never do) and the plain progress lines of a pipe."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from headedit.commands.plan import stage_table
from headedit.commands.progress import PlainReporter, RichReporter, reporter_for
from headedit.commands.render import render_validation
from headedit.events import Log, StageFinished, StageProgress, StageStarted
from headedit.plan import Plan, Stage

ROOT = Path(__file__).resolve().parent.parent


def _text(renderable, width: int) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def _row(task: str, intact: float, edited: float, n: int, lo: float, hi: float, p: float) -> dict:
    gain = 100 * (edited - intact)
    return {"task": task, "intact_acc": intact, "edited_acc": edited, "gain_points": gain,
            "relative_error_reduction": gain / (100 * (1 - intact)), "n": n, "ci95_points": [lo, hi],
            "mcnemar_p": p}


DEMO = {**_row("copy-second", 0.0395, 0.99, 2000, 94.1, 96.0, 1e-300), "heads": "0.0,1.1",
        "verdict": "gain held on held-out: +95.0 points, 95% CI [94.1, 96.0], McNemar p < 1e-300",
        "side_tasks": [{**_row("copy-first", 0.9715, 0.013, 2000, -96.7, -95.0, 1e-300),
                        "relative_error_reduction": None}],
        "damage": {"kl_mean": 0.1234, "kl_max": 2.5, "tokens": 512}}
NUMBERS = ["3.95", "99.00", "+95.05", "99.0%", "2000", "[+94.1,+96.0]", "< 1e-300", "97.15", "1.30", "-95.85",
           "[-96.7,-95.0]"]


def _all_lines_fit(text: str, width: int) -> bool:
    return all(len(line.rstrip()) <= width for line in text.splitlines())


def test_validation_table_fits_80_columns_with_every_number_whole() -> None:
    text = _text(render_validation(DEMO), 80)
    assert _all_lines_fit(text, 80) and "…" not in text
    for number in NUMBERS:
        assert number in text, number
    assert "copy-second" in text and "copy-first" in text and "0.1234 nats/token" in text
    # a wide terminal gets the framed table with full labels
    wide = _text(render_validation(DEMO), 120)
    assert "side: copy-first" in wide and "McNemar p" in wide and "┏" in wide


def test_validation_long_names_and_big_n_fold_the_label_not_the_numbers() -> None:
    result = {**DEMO, "n": 123456, "side_tasks": [{**DEMO["side_tasks"][0],
                                                    "task": "a-very-long-custom-side-task-name"}]}
    text = _text(render_validation(result), 80)
    assert _all_lines_fit(text, 80) and "…" not in text
    for number in ["123456", "+95.05", "[+94.1,+96.0]", "[-96.7,-95.0]", "< 1e-300"]:
        assert number in text, number
    narrow = _text(render_validation(result), 50)  # too narrow for any table: one line per task, still whole
    assert _all_lines_fit(narrow, 50) and "…" not in narrow
    for number in ["123456", "+95.05", "[+94.1,+96.0]", "< 1e-300"]:
        assert number in narrow.replace("\n", " "), number


def _plan() -> Plan:
    stages = (Stage("screen:single", 9, "discovery", 1000, 117e3, 8.24e9, "note"),
              Stage("search:greedy", 26, "discovery", 1000, 338e3, 23.8e9, "note"),
              Stage("validate", 4, "heldout", 2000, 104e3, 7.32e9, "note"))
    layout = {"architecture": "LlamaForCausalLM", "num_layers": 2, "num_heads": 4, "num_kv_heads": 4, "head_dim": 8}
    return Plan("demo", "headedit:demo", layout, 35_680, "float32", 8, stages, {}, (),
                flops_per_s={"cpu": 3.1e6, "a100": 6.83e12, "h100": 23.4e12, "h200": 23.4e12})


def test_plan_table_fits_80_columns_with_every_number_whole() -> None:
    text = _text(stage_table(_plan()), 80)
    assert _all_lines_fit(text, 80) and "…" not in text
    for stage in ("screen", "search", "validate", "total"):
        assert re.search(rf"^\s*{stage}\b", text, re.M), stage
    for number in ("117 k", "8.24 G", "338 k", "23.8 G", "104 k", "7.32 G", "1000 disc", "2000 held", "44.3 min",
                   "1.21 ms", "352 µs", "1.68 ms"):
        assert number in text, number
    wide = _text(stage_table(_plan()), 140)
    assert "screen:single" in wide and "1000 discovery" in wide


def test_plain_reporter_prints_periodic_lines_with_rate_and_eta() -> None:
    now = [0.0]
    console = Console(record=True, width=80, color_system=None, force_terminal=False)
    report = PlainReporter(console, interval=10.0, now=lambda: now[0])
    report(StageStarted("validate", total=1000, description="held-out validation"))
    for step in range(1, 11):  # 100 units per 3 s: one line per 10 s at most
        now[0] = 3.0 * step
        report(StageProgress("validate", 100 * step, 1000))
    report(Log("baked into a temporary export"))
    report(StageFinished("validate", "gain held"))
    lines = console.export_text().splitlines()
    progress = [line for line in lines if line.startswith("validate: ") and "/1000" in line]
    assert lines[0] == "validate: started: held-out validation (1000 units)"
    assert len(progress) == 2  # at 12 s and 24 s (and not every event)
    assert progress[0] == "validate: 400/1000 (40%), 33.3/s, ETA 18 s, elapsed 12 s"
    assert "baked into a temporary export" in lines and lines[-1] == "validate: done in 30 s: gain held"


def test_one_reporter_per_mode() -> None:
    assert isinstance(reporter_for(Console(force_terminal=True)), RichReporter)
    assert isinstance(reporter_for(Console(force_terminal=False, file=open("/dev/null", "w"))), PlainReporter)


def test_cli_through_a_pipe_prints_plain_progress(tmp_path: Path) -> None:
    env = {**__import__("os").environ, "HEADEDIT_PROGRESS_INTERVAL": "0", "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-m", "headedit", "bake", "headedit:demo", "--heads", "0.0,1.1", "--out",
                           str(tmp_path / "baked")], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "bake: started: zeroing 2 heads (1 units)" in lines
    assert any(re.fullmatch(r"bake: 1/1 \(100%\), .*elapsed \d+ s", line) for line in lines), lines
    assert any(line.startswith("bake: done in ") for line in lines) and "\x1b[" not in proc.stdout
