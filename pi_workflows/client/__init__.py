"""The Python client of the workflow host; every CLI command goes through it."""

from .connection import HostConnection, Response
from .workflow_client import WorkflowClient

__all__ = ["HostConnection", "Response", "WorkflowClient"]
