"""Shared pieces for discovery/pipeline tests: a tiny model folder on disk and a small choice task.

The task (`coin-test`) asks " yes" or " no" about random word strings, so a random-weight tiny model
scores near 50% and ablating heads moves its answers: real forwards, real variation, no data files.
Importing this module registers the task (subprocess tests import it before calling the CLI).
"""
from __future__ import annotations

import random
from pathlib import Path

from headedit.tasks import Example, Split, Task, register_task

WORDS = ("the", "is", "of", "and", "to", "in", "a", "that", "it", "was", "for", "on", "with", "he", "she",
         "they", "are", "be", "this", "not", "can", "will", "plus", "minus", "times")


class CoinTask(Task):
    name = "coin-test"
    kind = "choice"
    metric = "acc"
    dataset_id = None
    default_sizes = (256, 128)

    def load(self, split, size=None, seed=0, data_dir=None) -> Split:
        n = self.default_sizes[0 if split == "discovery" else 1] if size is None else int(size)
        rng = random.Random(f"{split}:{seed}")
        examples = []
        for i in range(n):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
            examples.append(Example(i, f"Question: {words}?\nAnswer:", choices=(" no", " yes"), label=rng.randint(0, 1)))
        return Split(self.name, split, examples, f"coin-test {split} seed {seed}")


register_task(CoinTask())


def save_tiny_model(folder: Path, seed: int = 0, **overrides) -> Path:
    """A tiny random Llama with its tokenizer saved as safetensors: a model folder load_model accepts."""
    from headedit.bench.tiny import tiny_model, tiny_tokenizer

    params = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=32)
    params.update(overrides)
    model = tiny_model(seed=seed, **params)
    folder = Path(folder)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    return folder


def recipe_text(model: Path, screen: str = "single", discovery: int = 192, heldout: int = 128, extra: str = "",
                name: str = "tiny-coin", side: str = "", objective: str = "accuracy", alpha: float = 1.0) -> str:
    """A recipe for the tiny random model. No head matters for coin-test, so under the default evidence rule
    nothing would be selected; pipeline tests that need a selection keep the old rule (accuracy, alpha = 1)."""
    return f"""name = "{name}"
[model]
id = "{model}"
dtype = "float32"
device = "cpu"
batch_size = 32
[task]
name = "coin-test"
discovery = {discovery}
heldout = {heldout}
seed = 0
[discovery]
screen = "{screen}"
candidates = 6
max_heads = 3
beam = 2
min_gain = 0.5
objective = "{objective}"
alpha = {alpha}
{extra}
[validation]
side_tasks = [{side}]
bootstrap = 2000
"""
