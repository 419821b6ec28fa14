"""torch.Tensor -> the view tuple the extension takes: (data_ptr, dtype, device, shape, strides).

Built from the tensor's own attributes, so no DLPack capsule is made per call and no tensor is
copied. dtype codes are dpa::DType values; device is -1 for the host, else the CUDA ordinal.
"""

import torch

from . import errors

DTYPE_CODES = {
    torch.float16: 0,
    torch.bfloat16: 1,
    torch.float32: 2,
    torch.float64: 3,
    torch.int32: 4,
    torch.bool: 5,
}


def view(tensor, name):
    if tensor is None:
        return None
    try:
        code = DTYPE_CODES[tensor.dtype]
    except (KeyError, AttributeError):
        if not isinstance(tensor, torch.Tensor):
            raise errors.invalid(
                name, f"must be a torch.Tensor, got {type(tensor).__name__}", errors.DTypeError
            ) from None
        raise errors.invalid(
            name, f"has dtype {tensor.dtype}, which dpa does not take", errors.DTypeError
        ) from None
    if tensor.device.type not in ("cpu", "cuda"):
        raise errors.invalid(name, f"is on device {tensor.device}; dpa runs on cpu and cuda")
    return (tensor.data_ptr(), code, tensor.get_device(), tensor.shape, tensor.stride())


# The raw cudaStream_t of the current stream, without building a torch.cuda.Stream object (the
# function inductor's generated code calls); the public route where a torch lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_of(tensor):
    """The caller's current CUDA stream on the tensor's device, as an integer (0 on the host)."""
    if not tensor.is_cuda:
        return 0
    if _raw_stream is not None:
        return _raw_stream(tensor.get_device())
    return torch.cuda.current_stream(tensor.device).cuda_stream


class WorkspaceAllocator:
    """The call's device workspace from PyTorch's caching allocator on the current stream.

    The library calls it at most once per call, with the bytes the chosen backend needs; the
    tensor is kept until the call returns and is then released to the allocator, which reuses
    it only in stream order after the call's kernels (the same stream)."""

    __slots__ = ("device", "block")

    def __init__(self, device):
        self.device = device
        self.block = None

    def __call__(self, nbytes):
        self.block = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self.block.data_ptr()


def allocator_for(tensor):
    return WorkspaceAllocator(tensor.device) if tensor.is_cuda else None
