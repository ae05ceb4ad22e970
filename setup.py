"""The compiled hot path (`raftmq.hotpath._compiled`); everything else is in pyproject.toml.

The extension is optional: where it cannot be built, the install still succeeds and
`raftmq.hotpath` runs its pure-Python twins, saying so once.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(
                "raftmq.hotpath._compiled",
                ["raftmq/hotpath/_compiled.pyx"],
                libraries=["z"],
                optional=True,
            )
        ],
        language_level=3,
    )
)
