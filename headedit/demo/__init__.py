"""The bundled demo: a tiny model trained here in which CEL really exists, and its two tasks.

`demo_model_path()` is the committed checkpoint; importing this package registers `copy-first` and
`copy-second`. Training (`headedit.demo.train`) needs only torch and transformers.
"""
from headedit.demo.tasks import demo_model_path

__all__ = ["demo_model_path"]
