"""Maps the top-level `policies/`, `sims/` and `deploy/` folders into the `embodrl.` namespace."""

from setuptools import find_packages, setup

ROOTS = {
    "embodrl": "embodrl",
    "embodrl.policies": "policies",
    "embodrl.sims": "sims",
    "embodrl.deploy": "deploy",
    "embodrl.configs": "configs",
}

packages, package_dir = [], {}
for name, folder in ROOTS.items():
    package_dir[name] = folder
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)  # package data: pyproject.toml
