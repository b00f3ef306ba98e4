"""What surrounds every measured cell (level): the prefix cache recorded and flushed (cache), the host's GPUs sampled
through NVML during it (health), and the verdict whether the host changed under it (suspect); watch ties them."""
