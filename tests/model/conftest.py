"""The model test's Hypothesis profiles: `ci` (the default) and `soak`.

Registered here, an initial conftest of `pytest tests/model`, so that
`--hypothesis-profile=soak` names a profile Hypothesis knows when it loads it.
"""

from hypothesis import HealthCheck, Phase, settings

# Bounded for CI, and the same sequences on every run (derandomized): a failure there
# prints its whole step sequence unshrunk (shrinking a real host's example takes
# minutes); the soak draws new sequences until stopped and shrinks what it finds.
settings.register_profile(
    "ci",
    max_examples=4,
    stateful_step_count=16,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=list(HealthCheck),
)
settings.register_profile(
    "soak",
    max_examples=100_000,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
