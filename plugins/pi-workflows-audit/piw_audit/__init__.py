"""pi-workflows-audit: read-only audit commands over the pi-workflows state store."""

__version__ = "0.1.0"
