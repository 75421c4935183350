"""Data: data sets by name or user factory, per-sample augmentation seeds, each host rank's loader,
the batch message that carries augmented batches host<-DPU, and the `Feed`s a replica trains from."""
