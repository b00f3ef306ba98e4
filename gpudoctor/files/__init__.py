"""Input and output hygiene: the one reader for input files (inputs), the one located-YAML loader (yamlload), atomic
writes (atomic) and the one config-file edit helper (edit)."""
