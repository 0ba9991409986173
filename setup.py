"""Install the four layer folders under one namespace: `dilstore.storage`, `dilstore.reader`, ….

The folders stay at the top of the repository (ARCHITECTURE.md names them
there), but a wheel must hold only `dilstore`: generic top-level names such as
`storage` or `runners` would collide with other packages in site-packages.
Everything else about the project lives in pyproject.toml.
"""

from setuptools import find_packages, setup

LAYERS = ("storage", "reader", "pipelines", "runners")

package_dir = {"dilstore": "dilstore"}
packages = ["dilstore"]
for layer in LAYERS:
    package_dir[f"dilstore.{layer}"] = layer
    packages += [f"dilstore.{layer}"] + [f"dilstore.{layer}.{name}" for name in find_packages(layer)]

setup(package_dir=package_dir, packages=packages)
