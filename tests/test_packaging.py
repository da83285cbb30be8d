"""What the wheel installs: `policies` and `integrations` only. `benchmarks` runs from a
checkout (``python -m benchmarks...`` in the repo root): installed, a top-level package of
that name would collide with others in shared images."""

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_holds_policies_and_integrations_only():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_packages(str(ROOT), include=config["packages"]["find"]["include"])
    assert {package.split(".")[0] for package in packages} == {"policies", "integrations"}
    assert set(config["package-data"]) <= {"policies", "integrations"}
