"""The rlhub release this client belongs to.

One source of truth for the Python package's version (pyproject.toml reads
it); internal/buildinfo's ``Release`` must say the same, which
internal/buildinfo's tests check.
"""

__version__ = "0.1.0"
