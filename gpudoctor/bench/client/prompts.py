"""Prompt sets: builtin synthetic prose or a file, stretched to a target context length, each prompt unique.

Every prompt starts with its own number so SGLang's radix cache cannot turn a long-context level into a cache-hit
benchmark. With an exact token counter the prompt is sent as `input_ids` of exactly the target length where the
endpoint takes token ids, and as the decoded text (counted again, exactly) where it takes a string (as_text); otherwise
as text sized by the estimate in gpudoctor.bench.client.tokens, and a prompt is only sent when its pessimistic count fits.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.bench.client.tokens import CHARS_PER_TOKEN, Counter
from gpudoctor.errors import InputError

_TOPICS = ("tensor parallelism", "speculative decoding", "KV cache paging", "NUMA placement", "PCIe link training",
           "container device cgroups", "model weight staging", "attention kernels", "request scheduling",
           "draft model acceptance")
_VOCAB = ("system", "memory", "token", "layer", "request", "batch", "kernel", "device", "latency", "throughput",
          "cache", "model", "server", "driver", "context", "prompt", "decode", "prefill", "draft", "verify", "graph",
          "stream", "queue", "budget", "host", "node", "link", "rank", "shard", "weight")


@dataclass
class Prompt:
    """One request's input: `text` or `input_ids`, with its token count and whether that count is exact."""

    text: str | None = None
    input_ids: list[int] | None = None
    tokens: int = 0
    upper_bound: int = 0
    exact: bool = False
    name: str | None = None  # the prompt set's name for it ({"name": "fib", "prompt": ...}): per-prompt results

    def payload(self) -> dict:
        return {"input_ids": self.input_ids} if self.input_ids is not None else {"text": self.text}


def _filler(rng: random.Random, n_chars: int) -> str:
    words, size = [], 0
    while size < n_chars:
        sentence = " ".join(rng.choice(_VOCAB) for _ in range(rng.randint(6, 14))).capitalize() + "."
        words.append(sentence)
        size += len(sentence) + 1
    return " ".join(words)[:n_chars]


def load_source(source: str, *, base_dir: str | None = None) -> list[str]:
    """Questions from `builtin` or a file: .jsonl ({"prompt"|"text": ...} per line) or .txt (one per line)."""
    return _read_source(source, base_dir)[0]


def load_names(source: str, *, base_dir: str | None = None) -> list[str] | None:
    """The names a .jsonl prompt set gives its prompts ({"name": "fib", "prompt": ...}), in file order; None unless
    every prompt has one (then results are reported per prompt as well)."""
    names = _read_source(source, base_dir)[1]
    return names if names and all(names) else None


def _read_source(source: str, base_dir: str | None) -> tuple[list[str], list[str | None]]:
    if source in ("builtin", "", None):
        return [f"Explain {t} to an infrastructure engineer, with examples and trade-offs." for t in _TOPICS], []
    path = Path(source)
    if base_dir and not path.is_absolute():
        path = Path(base_dir) / path
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read prompt set: {exc.strerror}", path=str(path)) from exc
    out, names = [], []
    for no, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise InputError(f"not JSON: {exc}", path=str(path), line=no) from exc
            text = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
            if not isinstance(text, str):
                raise InputError('each line needs a "prompt" (or "text") string', path=str(path), line=no)
            name = obj.get("name")
            if name is not None and (not isinstance(name, str) or not name.strip()):
                raise InputError('"name" must be a non-empty string', path=str(path), line=no)
            out.append(text)
            names.append(name)
        else:
            out.append(line)
            names.append(None)
    if not out:
        raise InputError("prompt set is empty", path=str(path))
    return out, names


def build(n: int, questions: list[str], counter: Counter, context_len: int | None, seed: int = 0,
          names: list[str] | None = None) -> list[Prompt]:
    """N unique prompts; with context_len each is stretched to that many tokens (exactly, when the counter is exact).
    With `names` (load_names), prompt i is named after question i % len(questions)."""
    out = _build(n, questions, counter, context_len, seed)
    if names:
        for i, p in enumerate(out):
            p.name = names[i % len(names)]
    return out


def _build(n: int, questions: list[str], counter: Counter, context_len: int | None, seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        head = f"Request {i} ({seed}). "
        question = questions[i % len(questions)]
        if not context_len:
            text = head + question
            prompts.append(_make(text, counter))
            continue
        tail = "\n\nUsing the notes above, " + question[0].lower() + question[1:]
        if counter.exact:
            ids_head = counter.encode(head + "Notes: ")
            ids_tail = counter.encode(tail)
            need = context_len - len(ids_head) - len(ids_tail)
            body_ids: list[int] = []
            while len(body_ids) < need:
                body_ids += counter.encode(" " + _filler(rng, int(max(need - len(body_ids), 16) * CHARS_PER_TOKEN)))
            ids = ids_head + body_ids[: max(0, need)] + ids_tail
            prompts.append(Prompt(input_ids=ids, tokens=len(ids), upper_bound=len(ids), exact=True))
        else:
            body_chars = int(context_len * CHARS_PER_TOKEN) - len(head) - len(tail) - len("Notes: ")
            text = head + "Notes: " + _filler(rng, max(0, body_chars)) + tail
            prompts.append(_make(text, counter))
    return prompts


def as_text(prompt: Prompt, counter: Counter | None) -> Prompt:
    """The prompt in the form a string endpoint takes (OpenAI's /v1/completions on a server not known to take token
    ids): token-id prompts are decoded with the same tokenizer and counted again, exactly; text stays as it is."""
    if prompt.input_ids is None or prompt.text is not None:
        return prompt
    if counter is None or not counter.exact:
        raise ValueError("a token-id prompt needs its tokenizer to become text")
    text = counter.decode(prompt.input_ids)
    n = counter.count(text)
    return Prompt(text=text, tokens=n, upper_bound=n, exact=True)


def _make(text: str, counter: Counter) -> Prompt:
    if counter.exact:
        ids = counter.encode(text)
        return Prompt(input_ids=ids, tokens=len(ids), upper_bound=len(ids), exact=True)
    return Prompt(text=text, tokens=counter.count(text), upper_bound=counter.upper_bound(text), exact=False)


def misfit(prompts: list[Prompt], max_tokens: int, context_limit: int | None) -> str | None:
    """Why these prompts cannot be sent (prompt + max_tokens over the context limit), or None when they fit."""
    if not context_limit or not prompts:
        return None
    worst = max(prompts, key=lambda p: p.upper_bound)
    if worst.upper_bound + max_tokens <= context_limit:
        return None
    how = "exactly" if worst.exact else f"up to (estimated {worst.tokens}, pessimistic count)"
    return (f"prompt of {how} {worst.upper_bound} tokens + max_tokens {max_tokens} = {worst.upper_bound + max_tokens}"
            f" > context limit {context_limit}; not sent")
