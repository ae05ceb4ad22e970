"""Hypothesis profiles: `ci` (bounded, the default) and `long`.

RAFTMQ_HYPOTHESIS_PROFILE selects one."""

import os

from hypothesis import HealthCheck, settings

for name, max_examples in (("ci", 25), ("long", 2000)):
    settings.register_profile(
        name,
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
        print_blob=True,
    )
settings.load_profile(os.environ.get("RAFTMQ_HYPOTHESIS_PROFILE", "ci"))
