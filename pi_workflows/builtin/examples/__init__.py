"""Built-in example workflows, one `<name>.workflow.py` file each: copy one to start."""
