"""dpa: dot-product attention with tanh soft-capping and attention sinks (docs/python.md).

    import dpa
    o = dpa.attention(q, k, v, causal=True, softcap=50.0, sinks=sinks)

The extension (dpa._dpa) binds the C++ library and links no libtorch; the torch layer
(dpa.ops, dpa.functional, dpa.torch) registers custom ops with autograd and fake
implementations, so torch.compile(fullgraph=True) traces through them.
"""

from . import _dpa, errors
from .errors import (
    BackendError,
    DTypeError,
    Error,
    InternalError,
    InvalidArgumentError,
    IoError,
    NotSupportedError,
)

_dpa._set_error_classes(errors.BY_CODE)
assert set(_dpa._error_code_names()) == set(errors.BY_CODE), "error codes out of sync"

cuda_built = _dpa.cuda_built()
__version__ = "0.1.0"

try:
    import torch as _torch  # noqa: F401
except ImportError:  # the extension alone still serves NumPy / CuPy / JAX arrays (dpa.core)
    _torch = None

if _torch is not None:
    from . import ops
    from .functional import Explanation, Verdict, attention, attention_varlen, explain
    from . import direct, torch  # noqa: F811  (dpa.torch: the nn.Module layer)

__all__ = [
    "attention",
    "attention_varlen",
    "explain",
    "Explanation",
    "Verdict",
    "Error",
    "InvalidArgumentError",
    "DTypeError",
    "NotSupportedError",
    "BackendError",
    "InternalError",
    "IoError",
    "cuda_built",
]
