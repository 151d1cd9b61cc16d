"""Units, defined once: memory sizes in binary GiB (what PyTorch and nvidia-smi print), link speeds in decimal GB."""

GIB = 1 << 30
GB = 1e9
