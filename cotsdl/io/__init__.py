"""Files: HDF5 checkpoints (and, later, HDF5 image datasets)."""
