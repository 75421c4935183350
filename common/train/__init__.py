"""Training: the replica loop, gradient allreduce backends, validation arithmetic, `--mode naive`'s
replicas and `--mode auto`'s start-up profile."""
