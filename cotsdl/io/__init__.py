"""Files: HDF5 image datasets (format, builders, the windowed reader) and HDF5 checkpoints."""
from .dataset import DatasetError, inspect, write_dataset
from .reader import HDF5Source

__all__ = ["HDF5Source", "DatasetError", "inspect", "write_dataset"]
