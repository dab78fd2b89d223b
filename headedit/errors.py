"""Errors a user can act on: each carries what is wrong and how to fix it, printed as one line."""
from __future__ import annotations


class HeadeditError(Exception):
    """Base of every user-facing error; the CLI prints `str(err)` on one line and exits 2."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message.replace("\n", " ")
        self.hint = hint.replace("\n", " ") if hint else None
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UnsupportedModelError(HeadeditError):
    """The architecture has no per-layer self_attn.o_proj that headedit can edit."""


class HeadSpecError(HeadeditError):
    """Head-set text is malformed or names a head outside the model."""


class ModelNotFoundError(HeadeditError):
    """A model folder or hub id could not be resolved to local files."""


class ModelLoadError(HeadeditError):
    """The model files exist but cannot be loaded safely (pickle weights, corrupt shards, absurd config)."""


class OutputExistsError(HeadeditError):
    """An output folder already exists and --force was not given."""


class RecipeError(HeadeditError):
    """A recipe field is missing, mistyped, out of range or unknown; `field` is its dotted key when one is to blame."""

    def __init__(self, message: str, hint: str | None = None, field: str | None = None) -> None:
        super().__init__(message, hint)
        self.field = field


class TaskError(HeadeditError):
    """A task or its data cannot be found or does not have the requested size."""


class RunError(HeadeditError):
    """A run folder is missing, corrupt, locked or from a newer version."""


class ExportError(HeadeditError):
    """An export folder is incomplete or no longer matches its manifest."""


class HubError(HeadeditError):
    """The Hub refused a request (auth, permissions, network)."""
