"""The load generator: one measured request (stream), the OpenAI dialects, levels of requests closed or open loop,
multi-turn sessions and trace replay, prompts and token counts — everything that talks to an inference server."""
