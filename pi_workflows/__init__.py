"""pi-workflows: a durable workflow host for multi-step agent workflows."""

from .hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
