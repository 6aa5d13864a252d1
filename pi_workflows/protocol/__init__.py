"""Wire formats: newline-delimited canonical JSON between clients, host and workers."""
