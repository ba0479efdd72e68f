"""Built-in kernels, one module per op family. Importing this package registers them."""

from nncc.kernels import (  # noqa: F401
    activation,
    affine,
    arithmetic,
    conv,
    detection,
    fused,
    generators,
    image,
    linalg,
    logic,
    normalization,
    pool,
    recurrent,
    reduce,
    resize,
    sampling,
    signal,
    tensor,
)
