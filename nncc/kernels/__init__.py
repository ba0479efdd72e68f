"""Built-in kernels, one module per op family. Importing this package registers them."""

from nncc.kernels import (  # noqa: F401
    activation,
    affine,
    arithmetic,
    attention,
    conv,
    fused,
    generators,
    linalg,
    logic,
    ml,
    normalization,
    pool,
    recurrent,
    reduce,
    resize,
    strings,
    tensor,
    training,
)
