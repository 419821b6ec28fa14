"""dpa's exceptions: every failure the library reports is a dpa.Error.

The C++ library's dpa::Error arrives as the subclass of its code; ``argument`` names the
offending argument (``"softcap"``, ``"q"``, ...), or is empty.
"""


class Error(Exception):
    """Base class of every error dpa raises. ``code`` and ``argument`` say what and where."""

    code = ""
    argument = ""


class InvalidArgumentError(Error, ValueError):
    """A bad value, shape, stride, device or combination of arguments."""


class DTypeError(InvalidArgumentError, TypeError):
    """A tensor of a dtype dpa does not take there, or an object that is not a tensor."""


class NotSupportedError(Error, RuntimeError):
    """No backend can honour every requested feature (the message lists each one's reasons),
    or a forced backend is not eligible."""


class BackendError(Error, RuntimeError):
    """A CUDA, cuBLAS or NCCL call failed."""


class InternalError(Error, RuntimeError):
    """A bug in dpa."""


class IoError(Error, OSError):
    """File input or output failed."""


# The C++ ErrorCode names (dpa::to_string(ErrorCode)) -> classes.
BY_CODE = {
    "invalid argument": InvalidArgumentError,
    "not supported": NotSupportedError,
    "backend failure": BackendError,
    "internal error": InternalError,
    "i/o error": IoError,
}


def invalid(argument, message, cls=InvalidArgumentError):
    """An error raised by the Python layer, shaped like the library's own."""
    error = cls(f"dpa invalid argument ({argument}): {message}")
    error.code = "invalid argument"
    error.argument = argument
    return error
