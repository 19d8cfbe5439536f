"""Collects README.md: every code block in it runs as a test (see tests/readme.py)."""

from tests.readme import readme_sybil

pytest_collect_file = readme_sybil.pytest()
