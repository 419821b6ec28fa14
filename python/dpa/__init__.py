"""dpa: dot-product attention with tanh soft-capping and attention sinks (docs/python.md).

    import dpa
    o = dpa.attention(q, k, v, causal=True, softcap=50.0, sinks=sinks)

The extension (dpa._dpa) binds the C++ library and links no libtorch; the torch layer
(dpa.ops, dpa.functional, dpa.torch) registers custom ops with autograd and fake
implementations, so torch.compile(fullgraph=True) traces through them.
"""

# torch first, when it is installed: the extension and torch share the CUDA runtime, cuBLAS and
# NCCL by soname, and whichever loads first provides them to the other. torch may need a newer
# NCCL than the toolkit's that dpa was linked against (NCCL is backward compatible), so its
# copies must win; loaded after dpa, torch fails with "undefined symbol: ncclCommResume".
try:
    import torch as _torch  # noqa: F401
except ImportError:  # the extension alone still serves NumPy / CuPy / JAX arrays (DLPack)
    _torch = None

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

if _torch is not None:
    from . import ops
    from .functional import Explanation, Verdict, attention, attention_varlen, explain
    from .kvcache import attention_with_kvcache
    from . import direct, torch  # noqa: F811  (dpa.torch: the nn.Module layer)

__all__ = [
    "attention",
    "attention_varlen",
    "attention_with_kvcache",
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
