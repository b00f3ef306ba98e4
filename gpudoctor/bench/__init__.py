"""The benchmark stage: a stand-in SGLang server, a streaming load generator, campaigns and reports."""
