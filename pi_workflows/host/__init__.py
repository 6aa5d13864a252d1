"""The workflow host: lifecycle, client server, claims, worker supervision."""
