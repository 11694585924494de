"""Several processes, machines and the vLLM server from one command (accelerate launch's names)."""
