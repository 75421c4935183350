"""The host program: forward/backward, gradient allreduce among host ranks, weight update."""
