"""Tests on root set-ups: emulated machines (scripts/nodes.sh), an aarch64 DPU through qemu, a Slurm cluster."""
