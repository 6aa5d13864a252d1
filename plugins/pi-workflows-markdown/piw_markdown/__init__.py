"""pi-workflows-markdown: terminal workflow results rendered as Markdown."""

__version__ = "0.1.0"
