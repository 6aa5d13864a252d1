"""The worker process: executes one run's workflow under the host's supervision."""
