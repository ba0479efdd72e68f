"""Execution: checking feeds and running graphs or compiled plans."""
