"""pi-workflows-otel: OpenTelemetry traces and metrics of a host's runs and node attempts.

Installed next to pi-workflows, it registers itself through the ``pi_workflows`` entry
point group (``otel``) and exports over OTLP/HTTP once the standard ``OTEL_*`` variables
name an endpoint; see README.md and the documentation's "OpenTelemetry" page.
"""
