"""Exceptions the shim raises, so callers can tell its refusals apart, and the command line's exit codes."""


class ShimError(RuntimeError):
    """The shim cannot do what was asked (not applied, unsupported GPU, unsupported argument)."""


class ApplyError(ShimError):
    """``apply()`` refused or failed; FlashInfer was left exactly as it was."""


class NoFp4KernelError(ShimError):
    """The GPU has no FP4 quantize kernel (SM < 100): FlashInfer would hand back uninitialized memory."""


class NotExpressibleError(ShimError, ValueError):
    """An argument combination the custom op cannot carry was used inside a compiled region.

    Also a ValueError: in eager mode the same arguments reach FlashInfer, which raises ValueError for
    the ones it does not know either (an unknown ``backend``).
    """


class InvalidArgumentError(ValueError, RuntimeError):
    """An argument fp4_quantize cannot accept.

    A ValueError, because that is what it is, and a RuntimeError, because that is what FlashInfer's
    kernel checks raise for the same inputs: ``except RuntimeError`` written for FlashInfer keeps working.
    """



#: The command line's exit codes (``fp4-dynamo-shim``, ``python -m fp4_dynamo_shim.verify``).
EXIT_OK, EXIT_FAILED, EXIT_NOT_APPLIED, EXIT_USAGE = 0, 1, 2, 3
