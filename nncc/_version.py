"""nncc's version, in a module of its own: the plan and cache layers read it without
importing the package root."""

__version__ = "0.1.0"
