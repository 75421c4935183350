"""Planning, pure and torch-free: which DPU rank does what for whom, the performance model of every
mode, and the validation split. Imported by `dpurun` before launch, so nothing here imports torch."""
