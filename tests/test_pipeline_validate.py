"""Verdict wording and the rich renderings of validation results and screen heatmaps."""
from __future__ import annotations

from rich.console import Console

from headedit.commands.render import render_heatmap, render_validation, rich_reporter
from headedit.events import Log, StageFinished, StageProgress, StageStarted
from headedit.pipeline.validate import verdict


def _row(gain: float, lo: float, hi: float, p: float) -> dict:
    return {"task": "copy-second", "intact_acc": 0.02, "edited_acc": 0.02 + gain / 100, "gain_points": gain,
            "relative_error_reduction": gain / 98, "n": 2000, "ci95_points": [lo, hi], "mcnemar_p": p}


def test_verdict_plain_words() -> None:
    ok, text = verdict(_row(96.9, 95.8, 97.8, 1e-300), 0.05)
    assert ok and text == "gain held on held-out: +96.9 points, 95% CI [95.8, 97.8], McNemar p < 1e-300"
    ok, text = verdict(_row(1.0, -0.5, 2.5, 0.2), 0.05)
    assert not ok and "not significant" in text
    ok, text = verdict(_row(-3.0, -5.0, -1.0, 0.001), 0.05)
    assert not ok and "no improvement" in text


def _text(renderable) -> str:
    console = Console(record=True, width=120, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_render_validation_table() -> None:
    result = {**_row(96.9, 95.8, 97.8, 1e-300), "heads": "0.1,0.3", "verdict": "gain held on held-out: ...",
              "side_tasks": [{**_row(-96.5, -97.3, -95.6, 1e-300), "task": "copy-first"}]}
    text = _text(render_validation(result))
    assert "0.1,0.3" in text and "copy-second" in text and "side: copy-first" in text
    assert "+96.90" in text and "-96.50" in text and "[+95.8,+97.8]" in text and "2000" in text
    assert "98.9%" in text  # relative error reduction 96.9 / 98


def test_render_heatmap_marks_selected_and_stopped() -> None:
    screen = {"method": "single", "unit": "points", "delta": [[1.5, -2.0, 0.0], [0.25, 3.0, -0.5]],
              "complete": [[True, False, True], [True, True, True]]}
    text = _text(render_heatmap(screen, "1.1"))
    assert "+3.0*" in text and "-2.0~" in text and "+1.5" in text
    assert "single screen" in text and "* selected" in text
    wide = {"method": "compressed", "delta": [[0.1 * h for h in range(40)] for _ in range(3)]}
    assert "compressed screen" in _text(render_heatmap(wide))


def test_rich_reporter_renders_events() -> None:
    console = Console(record=True, width=100, force_terminal=True, color_system=None)
    with rich_reporter(console) as report:
        report(StageStarted("screen:single", total=10, description="single-head screen"))
        report(StageProgress("screen:single", 5, 10))
        report(Log("hello from the library"))
        report(StageFinished("screen:single", "10 heads, 2 stopped early"))
    text = console.export_text()
    assert "hello from the library" in text and "10 heads, 2 stopped early" in text and "single-head screen" in text
