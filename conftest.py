"""Collects README.md: every code block in it runs, in order, as one test (see tests/readme.py)."""

from tests.readme import collect_readme

pytest_collect_file = collect_readme
