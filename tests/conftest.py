"""Hypothesis profiles: `ci` (bounded, the default) and `long`.

RAFTMQ_HYPOTHESIS_PROFILE selects one."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
    print_blob=True,
)
settings.register_profile(
    "long",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
    print_blob=True,
)
settings.load_profile(os.environ.get("RAFTMQ_HYPOTHESIS_PROFILE", "ci"))
