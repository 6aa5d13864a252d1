"""The Pi coding agent for pi-workflows: headless executor and interactive extension."""
