"""Start a world of N ranks (forked CPU processes with gloo, or one GPU per rank with NCCL)."""
