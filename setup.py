"""Install with `pip install .` (metadata and dependencies live in setup.cfg)."""

from setuptools import setup

setup()
