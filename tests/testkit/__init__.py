"""Shared pieces of the test suite, imported as `testkit.*` (tests/ is on sys.path through the root conftest).

- `coin`: the `coin-test` task (random yes/no labels: no head matters) and the CLI entry code that registers it in
  subprocesses;
- `models`: tiny random model folders saved as safetensors;
- `recipes`: the recipe builder (TOML text from sections), so tests state only the fields they care about;
- `journal`: read-only views of a run's journal (rows, committed work, search rows);
- `kill`: start a command and SIGKILL it at a chosen moment, watching its output as it goes;
- `files`: folder digests (nothing changed, same bytes as the reference).

Fixtures over these live in tests/conftest.py.
"""
