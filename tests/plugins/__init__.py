"""Plugin modules used by the tests, loaded with ``--plugin tests.plugins.<name>``."""
