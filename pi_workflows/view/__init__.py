"""The workflow viewer: a run's graph and progress as text (issue 25)."""
