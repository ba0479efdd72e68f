"""nncc's version and the version of the artifact format it writes, in a module of their
own: the plan and cache layers read them without importing the package root."""

__version__ = "0.1.0"
# 2: backends' payloads ("payloads" in PROG; CODE holds every code payload, PAYL the rest)
# in place of version 1's native call table ("native") and its CODE section.
FORMAT_VERSION = 2
