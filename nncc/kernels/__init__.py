"""Built-in kernels, one module per op family. Importing this package registers them."""

from nncc.kernels import (  # noqa: F401
    activation,
    affine,
    arithmetic,
    conv,
    fused,
    generators,
    linalg,
    logic,
    normalization,
    pool,
    quantize,
    recurrent,
    reduce,
    resize,
    tensor,
)
