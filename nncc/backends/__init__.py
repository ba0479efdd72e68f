"""Backend plugins: each selects the nodes it can run and compiles them into bytecode."""
