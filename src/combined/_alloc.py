"""Arrow's allocator, chosen before pyarrow is imported.

pyarrow reads ``ARROW_DEFAULT_MEMORY_POOL`` once, when it first allocates,
and Arrow's C++ code (the Parquet reader and writer, compute kernels) keeps
allocating from that pool whatever Python later sets with
``pyarrow.set_memory_pool``. Combined runs Arrow on the C library's allocator
(see :mod:`combined.runtime._memory` for the measurements), so this module,
imported first by the package, names it in the environment while pyarrow is
not loaded yet, unless the user named a pool there. When pyarrow was loaded
first, the engine can only switch the pool Python code allocates from.
"""

from __future__ import annotations

import os
import sys

POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
#: The pool the user named in the environment before Combined was imported.
USER_POOL = os.environ.get(POOL_VARIABLE) or None
#: Whether Arrow's whole process runs on the system allocator from the start.
EARLY = USER_POOL is None and "pyarrow" not in sys.modules
if EARLY:
    os.environ[POOL_VARIABLE] = "system"
