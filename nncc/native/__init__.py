"""Native code for whole partitions: C generation, the system compiler, loading from memory."""
