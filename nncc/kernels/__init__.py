"""Built-in kernels, one module per op family. Importing this package registers them."""

from nncc.kernels import (  # noqa: F401
    activation,
    affine,
    arithmetic,
    control_flow,
    conv,
    fused,
    generators,
    linalg,
    logic,
    normalization,
    optional,
    pool,
    recurrent,
    reduce,
    resize,
    sequence,
    tensor,
)
