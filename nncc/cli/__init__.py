"""The command-line layer: thin click commands over the core. Only here may click/rich appear."""
