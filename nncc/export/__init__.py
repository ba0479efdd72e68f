"""`nncc export`: a compiled model as a self-contained C library (header, shared and static
library, weights file, pkg-config file), and ``load_library`` to run one from Python.

Modules, one job each: ``standalone`` (can this plan stand alone, and what it calls),
``batch`` (the symbolic batch a library takes at run time),
``weights`` (the weights file: header, layout, checksum), ``cpu`` (the CPU feature checks
the library runs at open), ``c_api`` (the header and the API's C unit), ``objects`` (the
compiled kernel objects a plan was linked from), ``link`` (the shared and static library),
``writer`` (the export flow and its files), ``ctypes_library`` (``load_library``).
"""
