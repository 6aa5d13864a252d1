"""pi-workflows-webhook: an HTTP webhook decision channel."""
