"""The errors Hugging Face raises for a checkpoint folder it cannot load, one tuple for every loader (the DilBert
reader's, EARL's and the Listformer's encoders, and the reader's early question-limit check), each of which turns them
into a DilstoreError naming the folder."""

from __future__ import annotations

from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError

# A missing, truncated or inconsistent file (OSError, ValueError: JSON that does not parse too, KeyError,
# RuntimeError, SafetensorError), and a config.json value of the wrong type ("hidden_size": "x"), which transformers
# 5's configs validate with huggingface_hub's strict dataclasses: it was a traceback from every command that loads
# a model (mut55).
LOAD_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, KeyError, RuntimeError, SafetensorError,
                                            StrictDataclassError)  # fmt: skip


def load_failure(what: str, directory: object, error: Exception) -> str:
    """"cannot load WHAT from DIRECTORY: ERROR" on one line: huggingface_hub's validation errors span two lines
    ("Validation error for field 'hidden_size':", then "TypeError: ..."), and a command's error is one line."""
    return f"cannot load {what} from {directory}: {' '.join(str(error).split())}"
