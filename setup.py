"""Package list for setuptools: cli/ and cuda_kernels/ install as strata.cli / strata.cuda_kernels.

The design card puts them at the top of the checkout; a generic top-level `cli` module must never
land in a user's site-packages, so they are mapped into the strata namespace here.
"""
from setuptools import find_packages, setup

MAPPED = {"strata.cli": "cli", "strata.cuda_kernels": "cuda_kernels"}

packages = find_packages(include=["strata", "strata.*"])
for name, folder in MAPPED.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(where=folder)]

setup(
    packages=packages,
    package_dir=MAPPED,
    package_data={"strata.serve": ["static/*"]},
)
