"""export: bake, card, heatmap, provenance, Hub push.

This package's name is also the Python API's `headedit.export(run_dir, ...)`: once the package is imported,
`headedit.export` is this module, so the module itself is made callable and forwards to `headedit.api.export`.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any


class _CallableExport(ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from headedit.api import export  # the API function (imports the pipeline only when called)

        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableExport
