"""Token counting: exact with the model's tokenizer.json when `tokenizers` is installed, else a documented estimate.

The estimate assumes English prose (about 4 characters per token for BPE vocabularies of 32k-200k entries); fit checks
use a pessimistic 3 characters per token so a prompt judged to fit never overflows the server's context.
"""

from __future__ import annotations

import math
import os

CHARS_PER_TOKEN = 4.0
CHARS_PER_TOKEN_WORST = 3.0


def approx_tokens(text: str) -> int:
    """Estimated token count of English text (the stand-in server counts text prompts this way too)."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def worst_case_tokens(text: str) -> int:
    """An upper bound on the token count of English text, for fit checks without a tokenizer."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN_WORST))


class Counter:
    """Counts tokens; `exact` says whether the counts come from the model's own tokenizer."""

    def __init__(self, tokenizer=None, source: str = "estimate (4 chars/token; fit checked at 3 chars/token)"):
        self._tok = tokenizer
        self.source = source

    @property
    def exact(self) -> bool:
        return self._tok is not None

    def encode(self, text: str) -> list[int]:
        if self._tok is None:
            raise RuntimeError("no tokenizer loaded")
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        if self._tok is None:
            raise RuntimeError("no tokenizer loaded")
        return self._tok.decode(ids, skip_special_tokens=False)

    def count(self, text: str) -> int:
        return len(self.encode(text)) if self._tok is not None else approx_tokens(text)

    def upper_bound(self, text: str) -> int:
        return len(self.encode(text)) if self._tok is not None else worst_case_tokens(text)


def load_counter(model_dir: str | None) -> Counter:
    """The exact counter when `tokenizers` is importable and MODEL_DIR/tokenizer.json exists and is a tokenizer it
    reads, else the estimate (its source says why)."""
    if model_dir:
        path = os.path.join(model_dir, "tokenizer.json")
        if os.path.isfile(path):
            try:
                from tokenizers import Tokenizer
            except ImportError:
                return Counter(source=f"estimate: {path} exists but the `tokenizers` package is not installed")
            try:
                tok = Tokenizer.from_file(path)
            except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot read
                why = " ".join(str(exc).split())[:200]
                return Counter(source=f"estimate: {path} is not a tokenizer the `tokenizers` package reads ({why})")
            return Counter(tok, source=f"exact: {path}")
    return Counter()
