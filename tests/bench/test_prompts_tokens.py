"""Long-context prompts: exact lengths with the model's tokenizer.json, a documented estimate without it."""

from __future__ import annotations

import json

from gpudoctor.bench.client import prompts as P
from gpudoctor.bench.client.tokens import Counter, load_counter
from tests import needs
from tests.bench.conftest import run_cli


def make_tokenizer_dir(tmp_path):
    """A real tokenizer.json (word-level) written by the `tokenizers` library itself."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = sorted({w.strip(".,():").lower() for w in " ".join(P._VOCAB + P._TOPICS).split()} | {"request", "notes"} | {str(i) for i in range(100)})
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    d = tmp_path / "model"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    return d


def test_exact_prompts_have_exactly_the_context_length(tmp_path):
    counter = load_counter(str(make_tokenizer_dir(tmp_path)))
    assert counter.exact and counter.source.startswith("exact: ")
    ps = P.build(3, P.load_source("builtin"), counter, 3000, seed=1)
    assert [p.tokens for p in ps] == [3000, 3000, 3000]
    assert all(len(p.input_ids) == 3000 and p.text is None for p in ps)
    assert len({tuple(p.input_ids[:8]) for p in ps}) == 3  # unique heads: no radix-cache hits between prompts
    assert P.misfit(ps, 256, 3256) is None
    reason = P.misfit(ps, 257, 3256)
    assert reason == "prompt of exactly 3000 tokens + max_tokens 257 = 3257 > context limit 3256; not sent"


def test_estimate_without_tokenizer_is_pessimistic_for_fit(tmp_path):
    counter = load_counter(str(tmp_path))  # no tokenizer.json here
    assert not counter.exact and "estimate" in counter.source
    (p,) = P.build(1, P.load_source("builtin"), counter, 3000)
    assert p.text is not None and p.tokens == 3000 and p.upper_bound == 4000
    assert P.misfit([p], 100, 4100) is None
    assert "up to (estimated 3000, pessimistic count) 4000 tokens" in P.misfit([p], 100, 4099)


def test_tokenizer_json_without_package_says_so(tmp_path, monkeypatch):
    d = make_tokenizer_dir(tmp_path)
    import builtins

    real_import = builtins.__import__

    def no_tokenizers(name, *a, **k):
        if name == "tokenizers":
            raise ImportError("no tokenizers")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    c = load_counter(str(d))
    assert not c.exact and "`tokenizers` package is not installed" in c.source


def test_a_tokenizer_json_tokenizers_cannot_read_falls_back_to_the_estimate_and_says_why(tmp_path):
    needs.module("tokenizers", "the exact token counts need it")
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "nope"}}')
    c = load_counter(str(tmp_path))
    assert not c.exact and c.source.startswith(f"estimate: {tmp_path}/tokenizer.json is not a tokenizer the")
    assert c.count("hello world") > 0


def test_prompt_files(tmp_path):
    f = tmp_path / "set.jsonl"
    f.write_text('{"prompt": "a"}\n\n{"text": "b"}\n')
    assert P.load_source(str(f)) == ["a", "b"]
    f.write_text('{"prompt": "a"}\n{"nope": 1}\n')
    try:
        P.load_source(str(f))
    except Exception as exc:  # noqa: BLE001
        assert exc.one_line() == f'{f}:2: each line needs a "prompt" (or "text") string'
    else:
        raise AssertionError("bad prompt file accepted")
    t = tmp_path / "set.txt"
    t.write_text("one\ntwo\n")
    assert P.load_source(str(t)) == ["one", "two"]


def test_cli_sends_exact_input_ids(standin, tmp_path):
    d = make_tokenizer_dir(tmp_path)
    s = standin("--decode-tok-s", "5000", "--context-length", "400")
    out = tmp_path / "out"
    p = run_cli("bench", "load", "--server-url", s.url, "--concurrency", "2", "--max-tokens", "50", "--prompts", "2",
                "--context-len", "300", "--tokenizer-dir", str(d), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert f"token counts: exact: {d}/tokenizer.json" in p.stderr
    (r,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert r["status"] == "ok" and r["prompt_tokens_mean"] == 300
    out2 = tmp_path / "out2"
    p = run_cli("bench", "load", "--server-url", s.url, "--concurrency", "2", "--max-tokens", "101", "--prompts", "2",
                "--context-len", "300", "--tokenizer-dir", str(d), "--out", str(out2))
    (r,) = [json.loads(x) for x in (out2 / "results.jsonl").read_text().splitlines()]
    assert r["status"] == "skipped" and "exactly 300 tokens + max_tokens 101 = 401 > context limit 400" in r["error"]


def test_counter_estimate_matches_standin():
    c = Counter()
    assert c.count("x" * 4000) == 1000 and c.upper_bound("x" * 4000) == 1334
