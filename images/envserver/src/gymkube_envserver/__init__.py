"""gymkube env server and session router."""

__version__ = "0.1.0"
