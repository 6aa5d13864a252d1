"""Waiting in tests; the helpers live in the test kit (`pi_workflows.testing`)."""

from pi_workflows.testing.polling import process_gone, wait_until

__all__ = ["process_gone", "wait_until"]
