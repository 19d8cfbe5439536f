"""The package version, read by the build backend and the User-Agent header."""

__version__ = "0.1.0"
