"""Which exporters to build, from the standard ``OTEL_*`` environment variables.

The SDK and the OTLP exporter read everything else themselves (endpoint, headers,
timeout, compression, service name and resource attributes, sampler, batch and export
intervals). Only the choice of exporter is read here, because the plugin is installed by
every clone's set-up: nothing is exported until an endpoint or an exporter is named, so a
host without a collector never retries exports into the void.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# The exporter names of OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER this plugin builds.
EXPORTERS = ("otlp", "console", "none")
PROTOCOL = "http/protobuf"


class SettingsError(ValueError):
    """An ``OTEL_*`` value this plugin cannot use; its message says which and what to do."""


@dataclass(frozen=True)
class Settings:
    traces: str  # one of EXPORTERS
    metrics: str

    @property
    def exports_nothing(self) -> bool:
        return self.traces == "none" and self.metrics == "none"


def from_environment(environ: dict[str, str] | None = None) -> Settings:
    """The exporters the environment asks for; raises `SettingsError` for a bad value."""
    env = dict(os.environ if environ is None else environ)
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Settings("none", "none")
    return Settings(_exporter(env, "TRACES"), _exporter(env, "METRICS"))


def _exporter(env: dict[str, str], signal: str) -> str:
    variable = f"OTEL_{signal}_EXPORTER"
    named = env.get(variable, "").strip().lower()
    if not named:
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
            f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"
        )
        named = "otlp" if endpoint else "none"
    if named not in EXPORTERS:
        raise SettingsError(
            f"{variable}={named!r} is not an exporter pi-workflows-otel has; use one of "
            f"{', '.join(EXPORTERS)}."
        )
    if named == "otlp":
        protocol = (
            env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or PROTOCOL
        )
        if protocol.strip().lower() != PROTOCOL:
            raise SettingsError(
                f"OTLP protocol {protocol!r} is not supported by pi-workflows-otel; set "
                f"OTEL_EXPORTER_OTLP_PROTOCOL={PROTOCOL} (the collector's port 4318)."
            )
    return named
