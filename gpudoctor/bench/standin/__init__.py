"""A protocol-faithful stand-in for SGLang 0.5.23, vLLM or a strict OpenAI server, with a known truth (server), and
its wire formats (wire). `gpudoctor bench standin` runs it."""
