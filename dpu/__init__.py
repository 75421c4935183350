"""The DPU program: data augmentation, validation and checkpoint persistence offloaded from hosts."""
