"""Entry point of the `pi` plugin: the hooks it implements are added here."""
