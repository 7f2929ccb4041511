"""Training: the sparse-autoencoder objective, optimizers, data sources, the greedy trainer."""
from . import schedules
from .data import DataSource, InMemorySource
from .objective import LossParts, StageObjective, sparse_ae_loss
from .optim import LAMB, LARS, SGD, AdaGrad, Adam, Momentum, Nesterov, Optimizer, RMSProp
from .trainer import GreedyTrainer, TrainingInterrupted

__all__ = ["sparse_ae_loss", "StageObjective", "LossParts", "DataSource", "InMemorySource", "GreedyTrainer", "TrainingInterrupted",
           "Optimizer", "SGD", "Momentum", "Nesterov", "AdaGrad", "RMSProp", "Adam", "LARS", "LAMB", "schedules"]
