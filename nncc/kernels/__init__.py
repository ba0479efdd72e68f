"""Built-in kernels, one module per op family. Importing this package registers them."""

from nncc.kernels import (  # noqa: F401
    activation,
    affine,
    arithmetic,
    bitwise,
    conv,
    fused,
    generators,
    indexing,
    linalg,
    logic,
    loss,
    normalization,
    pool,
    recurrent,
    reduce,
    resize,
    tensor,
    trig,
)
