"""`headedit bench discover`: three paths, same selection, ratios printed (no timing asserted)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import discovery_fixtures as F  # noqa: E402

torch.set_num_threads(1)


def test_bench_discover_three_paths_agree(tmp_path, capsys) -> None:
    from headedit.cli import main

    model = F.save_tiny_model(tmp_path / "model", num_hidden_layers=2)
    rc = main(["bench", "discover", "--model", str(model), "--task", "coin-test", "--n", "32",
               "--candidates", "4", "--max-heads", "2"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert re.fullmatch(r"speedup: \d+(\.\d+)?x identical: yes", out[-1]), out[-1]
    body = "\n".join(out)
    for label in ("(a) naive reference loop", "(b) plain batched loop", "(c) fast path", "a/c:", "b/c:"):
        assert label in body
    selections = re.findall(r"selected (\S+)", body)
    assert len(selections) == 3 and len(set(selections)) == 1
