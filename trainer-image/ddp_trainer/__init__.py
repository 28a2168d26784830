"""Elastic DistributedDataParallel trainer launched by torchrun inside DDPJob workers."""

__version__ = "0.1.0"
