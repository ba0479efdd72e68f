"""Backend plugins: each selects the nodes it can run, compiles them into portable
instructions and, optionally, a payload of its own that it runs (nncc.backends.base)."""
