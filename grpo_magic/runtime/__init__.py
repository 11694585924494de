"""Where this process runs: precision and the CUDA device, torchrun and accelerate, locks, signals, memory given back."""
