"""Package discovery for the one `dpuoffload.*` namespace (everything else is in pyproject.toml).

The source folders sit at the top of the repository (`common/`, `host/`, `dpu/`, `launch/`: the
path alone says which program a file runs in) and are installed as `dpuoffload.common`, ... so no
generic top-level `common` or `host` lands in site-packages. pyproject.toml cannot express
"discover the subpackages of a remapped folder", so this file does, and a new subpackage needs no
listing by hand. `api/` is the top-level package itself (`import dpuoffload`: the public API).
"""

from setuptools import find_packages, setup

TOP = ("common", "host", "dpu", "launch")

setup(
    packages=["dpuoffload"] + [f"dpuoffload.{p}"
                               for p in find_packages(include=[f"{t}" for t in TOP] + [f"{t}.*" for t in TOP])],
    package_dir={"dpuoffload": "api", **{f"dpuoffload.{t}": t for t in TOP}},
)
