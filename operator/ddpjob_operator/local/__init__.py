"""Run a DDPJob on this machine: local processes, the operator's launch flags and decision layer."""

from .cli import register

__all__ = ["register"]
