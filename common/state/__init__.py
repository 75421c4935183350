"""Training state: how it is cut into slices, what a checkpoint holds, checkpoints on disk, resume."""
