"""Training: the sparse-autoencoder objective, optimizers, data sources, the greedy trainer.

``optim`` and ``schedules`` (the registries a config reads) import without MPI; the
rest is imported on first use, so that reading a config does not initialise MPI.
"""
from importlib import import_module

from . import optim, schedules
from .optim import LAMB, LARS, SGD, AdaGrad, Adam, Momentum, Nesterov, Optimizer, RMSProp

__all__ = ["sparse_ae_loss", "StageObjective", "LossParts", "DataSource", "InMemorySource", "GreedyTrainer",
           "TrainingInterrupted", "TrainState", "Optimizer", "SGD", "Momentum", "Nesterov", "AdaGrad", "RMSProp",
           "Adam", "LARS", "LAMB", "optim", "schedules"]

_LAZY = {"DataSource": "data", "InMemorySource": "data", "LossParts": "objective", "StageObjective": "objective",
         "sparse_ae_loss": "objective", "GreedyTrainer": "trainer", "TrainingInterrupted": "trainer",
         "TrainState": "state"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
