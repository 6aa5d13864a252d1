"""The `pi-workflows` command line (click)."""
