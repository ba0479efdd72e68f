"""The native backend's ops: one entry per op or op family, each in a module of its own,
saying which nodes it takes, why it refuses one, and how it writes one through the
partition writer (nncc/native/codegen.py). ``registry`` lists them in precedence order;
``entry`` defines what an entry is. The C itself is written by the generator modules an
entry calls (conv_gen, gemm_gen, plain_ops, ...): entries decide, generators write."""
