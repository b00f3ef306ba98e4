"""Build a tiny random-weight Llama and a tokenizer trained here, for `transformers serve` in the test lab.

Run with the lab venv's python (torch, transformers, tokenizers): `python tfserve_model.py OUT_DIR [tiny|1b]`
(1b: the H200 proof's ~1 B-parameter bf16 model, tools/h200_transformers_wire.sh). Nothing is
downloaded: the tokenizer is a byte-level BPE trained on a few hundred sentences, the model's weights are random
(seeded). The model has no EOS token (config and generation config), so a request always produces max_tokens tokens
and the lab can hold gpudoctor's counts to an exact number.
"""

from __future__ import annotations

import random
import sys

WORDS = ("system", "memory", "token", "layer", "request", "batch", "kernel", "device", "latency", "throughput",
         "cache", "model", "server", "driver", "context", "prompt", "decode", "prefill", "draft", "verify", "graph",
         "stream", "queue", "budget", "host", "node", "link", "rank", "shard", "weight", "explain", "examples",
         "trade-offs", "infrastructure", "engineer", "tensor", "parallelism", "speculative", "decoding", "paging",
         "placement", "training", "container", "cgroups", "staging", "attention", "scheduling", "acceptance",
         "using", "the", "notes", "above", "request", "to", "an", "with", "and", "of", "in", "a", "is")
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def corpus(n: int = 400) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 20))).capitalize() + f". Request {i} ({i % 7})."
            for i in range(n)]


SIZES = {  # (tokenizer vocab, hidden, intermediate, layers, heads, kv heads)
    "tiny": (400, 48, 96, 2, 4, 2),
    "1b": (8000, 2048, 5632, 22, 32, 4),  # TinyLlama-1.1B's shape with an 8k vocabulary: ~1.0 B parameters
}


def build(out: str, size: str = "tiny") -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    vocab, hidden, inter, layers, heads, kv = SIZES[size]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(400 if size == "tiny" else 20000), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                      bos_token_id=1, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    if size != "tiny":
        model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = 1
    model.save_pretrained(out)


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tiny")
