"""Screens and joint search over a synthetic evaluator with planted head effects (pure logic, no model).

The synthetic evaluator gives each example a fixed difficulty u_i and marks it correct under a head
set S when u_i < p(S), so results are paired and deterministic, like a real model's.
"""
from __future__ import annotations

import numpy as np
import pytest

from headedit.discovery.compressed import compressed_screen, knockout_sets
from headedit.discovery.early_stop import EarlyStop
from headedit.discovery.scorer import Cancelled, Scorer
from headedit.discovery.search import SearchSpec, joint_search
from headedit.discovery.single import single_screen
from headedit.discovery.table import topk_overlap
from headedit.journal import Journal
from headedit.model.heads import Head, HeadLayout

LAYOUT = HeadLayout.from_config(
    {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 64}
)


class Synthetic:
    def __init__(self, n: int = 400, base: float = 0.5, effects: dict | None = None, pairs: dict | None = None,
                 seed: int = 0, harmful: int = 8) -> None:
        rng = np.random.default_rng(seed)
        self.u = rng.random(n)
        heads = LAYOUT.all_heads()
        # background: every head mildly harmful (-0.5..-3 points); `harmful` of them strongly (-25)
        self.effects = {h: -rng.uniform(0.5, 3.0) / 100 for h in heads}
        for i in rng.choice(len(heads), size=harmful, replace=False):
            self.effects[heads[i]] = -0.25
        self.effects.update({Head(*h): v / 100 for h, v in (effects or {}).items()})
        self.pairs = {frozenset(Head(*h) for h in k): v / 100 for k, v in (pairs or {}).items()}
        self.base = base
        self.calls = 0
        self.examples = 0

    def p(self, heads: tuple) -> float:
        value = self.base + sum(self.effects[h] for h in heads)
        value += sum(v for k, v in self.pairs.items() if k <= set(heads))
        return float(np.clip(value, 0.0, 1.0))

    def __call__(self, sets: list, start: int, stop: int) -> np.ndarray:
        self.calls += 1
        self.examples += len(sets) * (stop - start)
        return np.array([self.u[start:stop] < self.p(s) for s in sets]).reshape(len(sets), stop - start)


def _scorer(tmp_path, ev: Synthetic, name: str = "j.sqlite", **kw) -> Scorer:
    return Scorer(Journal(tmp_path / name), "discovery", len(ev.u), ev, sets_per_call=8, **kw)


def _search(scorer: Scorer, screen, k: int, **spec) -> tuple:
    result = joint_search(scorer, screen.top(k), LAYOUT.all_heads(), SearchSpec(**spec))
    return result.selected, result


def test_early_stop_saves_work_and_keeps_selection(tmp_path) -> None:
    planted = {(1, 2): 6.0, (2, 5): 3.0}
    ev_full = Synthetic(effects=planted)
    full = single_screen(_scorer(tmp_path, ev_full, "a.sqlite"), LAYOUT, None)
    ev_fast = Synthetic(effects=planted)
    fast = single_screen(_scorer(tmp_path, ev_fast, "b.sqlite"), LAYOUT, EarlyStop(chunk=50, alpha=1e-4, min_n=50))
    stopped = {h for h in LAYOUT.all_heads() if not fast.is_complete(h)}
    strongly = {h for h, v in ev_fast.effects.items() if v <= -0.2}
    assert len(strongly) >= 6 and strongly <= stopped  # every strongly harmful head was dropped early
    assert fast.extra["early_stopped"] == len(stopped)
    assert ev_fast.examples < 0.85 * ev_full.examples
    assert all(ev_fast.effects[h] < 0 for h in stopped)
    assert fast.top(8) == full.top(8)
    assert fast.top(2) == [Head(1, 2), Head(2, 5)]
    sel_full, _ = _search(_scorer(tmp_path, ev_full, "a.sqlite"), full, 8, beam=2, max_heads=4)
    sel_fast, _ = _search(_scorer(tmp_path, ev_fast, "b.sqlite"), fast, 8, beam=2, max_heads=4)
    assert sel_full == sel_fast == (Head(1, 2), Head(2, 5))
    assert "sign test" in fast.rule


def test_journal_makes_retrying_free_and_resume_exact(tmp_path) -> None:
    ev = Synthetic(effects={(0, 1): 4.0})
    stop = EarlyStop(chunk=100, alpha=1e-4, min_n=100)
    first = single_screen(_scorer(tmp_path, ev, "x.sqlite"), LAYOUT, stop)
    work = ev.examples
    again = single_screen(_scorer(tmp_path, ev, "x.sqlite"), LAYOUT, stop)
    assert ev.examples == work  # nothing re-evaluated
    assert again.to_json() == first.to_json()

    # a run cancelled part-way, then resumed from the same journal, does the same total work
    ev2 = Synthetic(effects={(0, 1): 4.0})
    import threading

    cancel = threading.Event()

    def cancelling(sets, start, stop_):
        if ev2.calls == 5:
            cancel.set()
        return ev2(sets, start, stop_)

    interrupted = Scorer(Journal(tmp_path / "y.sqlite"), "discovery", 400, cancelling, sets_per_call=8, cancel=cancel)
    with pytest.raises(Cancelled):
        single_screen(interrupted, LAYOUT, stop)
    resumed = single_screen(_scorer(tmp_path, ev2, "y.sqlite"), LAYOUT, stop)
    assert ev2.examples == work
    assert resumed.to_json() == first.to_json()
    sessions = Journal(tmp_path / "y.sqlite").sessions()
    assert sum(s["examples_evaluated"] for s in sessions) == work


def test_candidates_include_negative_scores_for_synergy(tmp_path) -> None:
    # (1,3) helps alone; (3,6) looks harmful alone (-0.7) but completes a strong pair with (1,3)
    ev = Synthetic(effects={(1, 3): 5.0, (3, 6): -0.7}, pairs={((1, 3), (3, 6)): 25.0}, harmful=0)
    screen = single_screen(_scorer(tmp_path, ev), LAYOUT, None)
    assert screen.score(Head(3, 6)) < 0
    rank = screen.ranked().index(Head(3, 6))
    # a pool of positive-score heads only misses the pair
    positives = [h for h in screen.ranked() if screen.score(h) > 0]
    only_pos = joint_search(_scorer(tmp_path, ev), positives, LAYOUT.all_heads(), SearchSpec(max_heads=3))
    assert Head(3, 6) not in only_pos.selected
    # the top-k pool (k past the pair's rank) finds it
    sel, result = _search(_scorer(tmp_path, ev), screen, rank + 1, beam=2, max_heads=3)
    assert {Head(1, 3), Head(3, 6)} <= set(sel)
    assert "even if zero or negative" in result.rule
    # with k too small, only the all-heads option for the first additions finds it
    sel_small, _ = _search(_scorer(tmp_path, ev), screen, 2, beam=1, max_heads=3)
    assert Head(3, 6) not in sel_small
    sel_all, res_all = _search(_scorer(tmp_path, ev), screen, 2, beam=1, max_heads=3, first_additions_all_heads=True)
    assert {Head(1, 3), Head(3, 6)} <= set(sel_all)
    assert "draw from every head" in res_all.rule


def test_exhaustive_finds_pair_that_is_harmful_alone(tmp_path) -> None:
    ev = Synthetic(effects={(0, 0): -0.6, (2, 2): -0.5}, pairs={((0, 0), (2, 2)): 20.0}, harmful=0)
    screen = single_screen(_scorer(tmp_path, ev), LAYOUT, None)
    greedy, _ = _search(_scorer(tmp_path, ev), screen, 6, method="greedy", max_heads=3)
    assert greedy == ()  # nothing helps alone: greedy stops at once
    ex, result = _search(_scorer(tmp_path, ev), screen, 6, method="exhaustive", exhaustive_size=2, max_heads=3)
    assert set(ex) >= {Head(0, 0), Head(2, 2)}
    sizes = [t["size"] for t in result.trace]
    assert sizes.count(2) == 15  # C(6, 2) pairs, all in the trace
    assert all(t["gain"] == pytest.approx(100 * (t["acc"] - result.intact_acc)) for t in result.trace
               if not t.get("pruned"))
    assert all(t["n"] < 400 for t in result.trace if t.get("pruned"))


def test_min_gain_and_max_heads_stop_the_search(tmp_path) -> None:
    ev = Synthetic(effects={(0, 1): 5.0, (1, 1): 4.0, (2, 1): 3.0, (3, 1): 2.0}, harmful=0, n=1000)
    screen = single_screen(_scorer(tmp_path, ev), LAYOUT, None)
    capped, _ = _search(_scorer(tmp_path, ev), screen, 6, max_heads=2)
    assert capped == (Head(0, 1), Head(1, 1))
    picky, _ = _search(_scorer(tmp_path, ev), screen, 6, max_heads=4, min_gain=3.5)
    assert picky == (Head(0, 1), Head(1, 1))  # +3 points from (2,1) is below min_gain
    full, res = _search(_scorer(tmp_path, ev), screen, 6, max_heads=6)
    assert set(full) == {Head(0, 1), Head(1, 1), Head(2, 1), Head(3, 1)}
    assert res.selected_acc > res.intact_acc


def test_compressed_screen_recovers_planted_heads(tmp_path) -> None:
    planted = {(0, 3): 8.0, (2, 6): 6.0}
    ev = Synthetic(effects=planted, n=1000, harmful=2)
    sets = knockout_sets(LAYOUT, 24, 0.1, seed=0)
    cover = np.zeros(32)
    for s in sets:
        assert len(s) == 3
        for h in s:
            cover[h.layer * 8 + h.head] += 1
    assert cover.max() - cover.min() <= 1  # stratified: every head covered about equally
    comp = compressed_screen(_scorer(tmp_path, ev), LAYOUT, count=24, fraction=0.1, seed=0)
    assert comp.evaluations <= 24 < LAYOUT.total_heads
    assert set(comp.top(2)) == {Head(0, 3), Head(2, 6)}
    single = single_screen(_scorer(tmp_path, ev, "s.sqlite"), LAYOUT, None)
    assert topk_overlap(comp, single, 2) == 1.0
    assert "Lasso" in comp.rule


@pytest.mark.parametrize("seed", range(6))
def test_exact_pruning_keeps_the_selection_and_saves_work(tmp_path, seed) -> None:
    rng = np.random.default_rng(100 + seed)
    heads = LAYOUT.all_heads()
    effects = {(h.layer, h.head): float(rng.choice([-40.0, -8.0, -1.0, 0.5, 2.0, 4.0])) for h in heads[:12]}
    pairs = {((0, 0), (2, 2)): 6.0, ((0, 1), (3, 3)): -5.0}
    method = ("greedy", "exhaustive")[seed % 2]
    for beam in (1, 2, 3):
        results = {}
        for prune in (False, True):
            ev = Synthetic(n=300, base=0.7, effects=effects, pairs=pairs, seed=seed, harmful=4)
            screen = single_screen(_scorer(tmp_path, ev, f"s{seed}{beam}{prune}.sqlite"), LAYOUT, None)
            before = ev.examples
            _, res = _search(_scorer(tmp_path, ev, f"q{seed}{beam}{prune}.sqlite"), screen, 10, beam=beam,
                             max_heads=4, min_gain=0.0, method=method, prune=prune, prune_chunk=16)
            results[prune] = (res, ev.examples - before)
        (full, work_full), (fast, work_fast) = results[False], results[True]
        assert fast.selected == full.selected and fast.selected_acc == full.selected_acc, (seed, beam)
        assert {t["heads"] for t in fast.trace} == {t["heads"] for t in full.trace}
        exact = {t["heads"]: t["acc"] for t in full.trace}
        for t in fast.trace:
            if t.get("pruned"):
                assert t["n"] < 300 and t["acc"] <= fast.selected_acc
            else:
                assert t["acc"] == exact[t["heads"]]
        assert work_fast <= work_full
        if any(t.get("pruned") for t in fast.trace):
            assert work_fast < work_full
    assert "exact pruning" in fast.rule
