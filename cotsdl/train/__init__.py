"""Training: the sparse-autoencoder objective, optimizers, data sources, the greedy trainer."""
from .objective import LossParts, StageObjective, sparse_ae_loss

__all__ = ["sparse_ae_loss", "StageObjective", "LossParts"]
