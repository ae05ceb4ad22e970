"""What pyproject.toml cannot say: the package-dir mapping and the compiled hot path.

`dledger/`, `broker/`, `namesrv/` and `controller/` live at the top of the repository (the
layout the project's brief names) but install inside the one import package `raftmq`, as
`raftmq.dledger`, `raftmq.broker`, `raftmq.namesrv` and `raftmq.controller`, so installing
raftmq adds no generic top-level name to site-packages. The editable install maps them the
same way.

The extension (`raftmq.hotpath._compiled`) is optional: where it cannot be built, the
install still succeeds and `raftmq.hotpath` runs its pure-Python twins, saying so once.
"""

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

MAPPED = ("dledger", "broker", "namesrv", "controller")  # top-level directories under raftmq

packages = find_packages(include=["raftmq", "raftmq.*", "pyspark_rocketmq", "pyspark_rocketmq.*"])
package_dir = {"raftmq": "raftmq", "pyspark_rocketmq": "pyspark_rocketmq"}
for top in MAPPED:
    package_dir[f"raftmq.{top}"] = top
    packages += [f"raftmq.{name}" for name in find_packages(include=[top, f"{top}.*"])]

setup(
    packages=packages,
    package_dir=package_dir,
    ext_modules=cythonize(
        [
            Extension(
                "raftmq.hotpath._compiled",
                ["raftmq/hotpath/_compiled.pyx"],
                libraries=["z", "pthread"],
                optional=True,
            )
        ],
        language_level=3,
    ),
)
