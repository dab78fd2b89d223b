"""Tables of docs/discovery.md from the raw outputs of scripts/measure_discovery.py (no model needed).

    python scripts/discovery_tables.py docs/measurements/smollm2-hellaswag

Prints markdown and writes tables.json next to the raw files. Definitions:
- a head's effect = mean over examples of (ablated - intact) per-example value; accuracy in points;
- its standard error at n = sd(per-example differences) / sqrt(n), scaled to n = 80 from the measured sd;
- z80 = effect / SE at n = 80; a step-1 set passes at alpha 0.05 over all heads when its one-sided p is
  below 0.05 / total_heads (t about 3.6 at these n);
- screens are compared with the full single screen by top-k overlap and Spearman correlation over the heads
  measured; early stop is replayed from the full screen's per-example rows (its decisions only use prefixes).
"""
from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
from scipy import stats

from headedit.discovery.early_stop import EarlyStop
from headedit.discovery.evidence import p_value
from headedit.stats import paired_t_greater, sign_flip_greater

OBJECTIVES = ("accuracy", "margin", "logprob")
SCALE = {"accuracy": 100.0, "margin": 1.0, "logprob": 1.0}
UNIT = {"accuracy": "points", "margin": "nats", "logprob": "nats"}


def top(scores: np.ndarray, k: int, order: np.ndarray | None = None) -> set[int]:
    """Indices of the k best; `order` ranks early-stopped heads last (like ScreenResult.ranked)."""
    key = [(0 if order is None else order[i], -scores[i], i) for i in range(scores.size)]
    return {i for _, _, i in sorted(key)[:k]}


def lasso(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LassoCV

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return LassoCV(cv=max(2, min(5, len(y))), max_iter=20_000).fit(x, y).coef_


def main(folder: Path) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    timing = json.loads((folder / "timing.json").read_text())
    single = np.load(folder / "single.npz")
    heads = meta["heads"]
    n, total = meta["n"], meta["total_heads"]
    out: dict = {"meta": meta, "timing": timing}
    print(f"# {meta['model']}, {meta['task']}, n = {n}, heads {meta['layers']} ({len(heads)} of {total}), "
          f"{meta['date']}\n")

    # ---- sensitivity ------------------------------------------------------------------------------------
    threshold = 0.05 / total
    t_needed = float(stats.t.isf(threshold, 79))
    print(f"## Sensitivity (SE of one head's effect at n = 80; pass = one-sided p < 0.05/{total}, t > "
          f"{t_needed:.2f})\n")
    print("| objective | median SE at n=80 | median abs(effect)/SE at n=80 | heads helping, one-sided p < 0.05 (n measured) "
          "| heads z80 > t needed | best head, z80 | split-half reliability (Spearman) |")
    print("|---|---|---|---|---|---|---|")
    sens = {}
    for obj in OBJECTIVES:
        v = single[obj] * SCALE[obj]  # [1 + heads, n]
        d = v[1:] - v[0]  # [heads, n]
        effect = d.mean(axis=1)
        sd = d.std(axis=1, ddof=1)
        se80 = sd / math.sqrt(80)
        with np.errstate(divide="ignore", invalid="ignore"):
            z80 = np.where(se80 > 0, effect / se80, 0.0)
        best = int(np.argmax(z80))
        raw = single[obj]
        p_help = np.array([p_value(obj, raw[0], raw[1 + i]) for i in range(len(heads))])
        half = n // 2  # each head's effect on the first and on the second half of the rows
        first, second = d[:, :half].mean(axis=1), d[:, half:].mean(axis=1)
        reliability = float(stats.spearmanr(first, second).statistic)
        sens[obj] = {"effect": effect.tolist(), "se80": se80.tolist(), "z80": z80.tolist(), "p_help": p_help.tolist(),
                     "split_half": reliability}
        print(f"| {obj} | {np.median(se80):.3g} {UNIT[obj]} | {np.median(np.abs(z80)):.2f} | "
              f"{int((p_help < 0.05).sum())} of {len(heads)} | {int((z80 > t_needed).sum())} | "
              f"{heads[best]}, {z80[best]:.2f} | {reliability:.2f} |")
    out["sensitivity"] = sens
    acc_eff = np.array(sens["accuracy"]["effect"])
    for obj in ("margin", "logprob"):
        rho = stats.spearmanr(acc_eff, sens[obj]["effect"]).statistic
        print(f"\nSpearman correlation of per-head effects, accuracy vs {obj}: {rho:.2f}", end="")
    print("\n")

    # p-values: t-test vs sign-flip permutation on the continuous objectives (is the t-test calibrated here?)
    print("## t-test vs sign-flip permutation p-values (one-sided, each head vs intact, n measured)\n")
    print("| objective | heads with p_t < 0.05 | same with sign-flip | max abs(log10 p_t - log10 p_flip) over heads "
          "with p_flip > 1e-4 |")
    print("|---|---|---|---|")
    calib = {}
    for obj in ("margin", "logprob"):
        v = single[obj]
        pt = np.array([paired_t_greater(v[1 + i] - v[0]) for i in range(len(heads))])
        pf = np.array([sign_flip_greater(v[1 + i] - v[0], n_perm=20_000, seed=i) for i in range(len(heads))])
        ok = pf > 1e-4
        gap = float(np.max(np.abs(np.log10(pt[ok]) - np.log10(pf[ok])))) if ok.any() else float("nan")
        calib[obj] = {"p_t": pt.tolist(), "p_flip": pf.tolist()}
        print(f"| {obj} | {int((pt < 0.05).sum())} | {int((pf < 0.05).sum())} | {gap:.2f} |")
    out["calibration"] = calib
    print()

    # ---- screens ------------------------------------------------------------------------------------------
    ref = {obj: np.array(sens[obj]["effect"]) for obj in OBJECTIVES}
    cpu_single = timing["single"]["cpu"]
    per_set = cpu_single / (len(heads) + 1)
    rows = []

    rows_scores: dict[str, tuple[np.ndarray, str]] = {}  # screens without early stop, for the removal table

    def add(name: str, scores: np.ndarray, cost: str, order: np.ndarray | None = None) -> None:
        if order is None:
            rows_scores[name] = (scores, cost)
        row = {"screen": name, "cost": cost}
        for obj in ("accuracy", "margin"):
            for k in (5, 10):
                row[f"top{k}_vs_single_{obj}"] = len(top(scores, k, order) & top(ref[obj], k)) / k
        row["spearman_vs_single_margin"] = float(stats.spearmanr(scores, ref["margin"]).statistic)
        rows.append(row)

    for obj in OBJECTIVES:
        add(f"single, full ({obj})", ref[obj], f"{len(heads)} sets x {n} ex, {cpu_single:.0f} s CPU (all 3 objectives)")
    for obj in OBJECTIVES:
        chunk = max(16, math.ceil(n / 16))
        rule = EarlyStop(chunk=chunk, alpha=0.01, min_n=chunk)
        v = single[obj]
        seen, stopped = [], np.zeros(len(heads))
        for i in range(len(heads)):
            m = n
            for look in rule.boundaries(n)[:-1]:
                if rule.should_drop(v[0][:look], v[1 + i][:look]):
                    m, stopped[i] = look, 1
                    break
            seen.append(m)
        scores = np.array([SCALE[obj] * (v[1 + i][: seen[i]].mean() - v[0][: seen[i]].mean()) for i in range(len(heads))])
        frac = sum(seen) / (n * len(heads))
        add(f"single + early stop ({obj})", scores, f"{int(stopped.sum())} heads stopped, {frac:.0%} of the "
            f"examples, ~{frac * cpu_single:.0f} s CPU", order=stopped)
    comp = np.load(folder / "compressed.npz") if (folder / "compressed.npz").is_file() else None
    sets = json.loads((folder / "knockouts.json").read_text()) if comp is not None else []
    if comp is not None and comp["accuracy"].shape[0] == len(sets):
        index = {h: j for j, h in enumerate(heads)}
        x = np.zeros((len(sets), len(heads)))  # [set, head] knockout indicators
        for r, s in enumerate(sets):
            for h in s:
                x[r, index[h]] = 1.0
        cpu = timing.get("compressed", {}).get("cpu", float("nan"))
        for obj in OBJECTIVES:
            y = SCALE[obj] * (comp[obj].mean(axis=1) - single[obj][0].mean())  # [set]
            add(f"compressed, Lasso on {obj}", lasso(x, y), f"{len(sets)} sets of {int(x.sum(axis=1).max())} x {n} ex, "
                f"{cpu:.0f} s CPU")
    if (folder / "gradient.json").is_file():
        grads = json.loads((folder / "gradient.json").read_text())
        for obj, g in grads.items():
            delta = np.array(g["delta"])  # [layer, head]
            scores = np.array([delta[int(h.split(".")[0])][int(h.split(".")[1])] for h in heads])
            cpu = timing.get(f"gradient:{obj}", {}).get("cpu", float("nan"))
            what = "margin" if obj == "margin" else "answer log-prob"
            add(f"gradient ({what})", scores, f"1 forward+backward per batch ({n} ex), {cpu:.0f} s CPU")
    print(f"## Screens vs the full single screen ({len(heads)} heads, n = {n}; one ablated set ~{per_set:.1f} s CPU)\n")
    print("| screen | cost | top-5 / top-10 overlap with single (margin) | with single (accuracy) | "
          "Spearman vs single (margin) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['screen']} | {r['cost']} | {r['top5_vs_single_margin']:.0%} / {r['top10_vs_single_margin']:.0%} | "
              f"{r['top5_vs_single_accuracy']:.0%} / {r['top10_vs_single_accuracy']:.0%} | "
              f"{r['spearman_vs_single_margin']:.2f} |")
    out["screens"] = rows
    out["removal"] = removal_table(rows_scores, ref, heads, n)
    (folder / "tables.json").write_text(json.dumps(out, indent=1))


def removal_table(scores: dict[str, tuple[np.ndarray, str]], ref: dict[str, np.ndarray], heads: list[str],
                  n: int) -> list[dict]:
    """The same screens read the other way (direction = "remove"): the heads whose zeroing lowers the objective
    most are the candidates, so every ranking is negated. Simplification: the removal margin counts only
    examples still answered right; here the plain mean change is used for every screen alike."""
    print(f"\n## Removal direction: screens vs the single screen's largest drops ({len(heads)} heads, n = {n})\n")
    print("| screen | top-5 / top-10 overlap with single (margin) | with single (accuracy) | "
          "Spearman vs single (margin) |")
    print("|---|---|---|---|")
    rows = []
    for name, (values, _cost) in scores.items():
        if np.ptp(values) == 0:  # e.g. a Lasso with every coefficient 0: no ranking to compare
            rows.append({"screen": name, "constant": True})
            print(f"| {name} | - (every score equal) | - | - |")
            continue
        row = {"screen": name}
        for obj in ("accuracy", "margin"):
            for k in (5, 10):
                row[f"top{k}_vs_single_{obj}"] = len(top(-values, k) & top(-ref[obj], k)) / k
        row["spearman_vs_single_margin"] = float(stats.spearmanr(values, ref["margin"]).statistic)
        rows.append(row)
        print(f"| {name} | {row['top5_vs_single_margin']:.0%} / {row['top10_vs_single_margin']:.0%} | "
              f"{row['top5_vs_single_accuracy']:.0%} / {row['top10_vs_single_accuracy']:.0%} | "
              f"{row['spearman_vs_single_margin']:.2f} |")
    return rows


if __name__ == "__main__":
    main(Path(sys.argv[1]))
