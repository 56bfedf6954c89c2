"""Exceptions the shim raises, so callers can tell its refusals apart."""


class ShimError(RuntimeError):
    """The shim cannot do what was asked (not applied, unsupported GPU, unsupported argument)."""


class ApplyError(ShimError):
    """``apply()`` refused or failed; FlashInfer was left exactly as it was."""


class NoFp4KernelError(ShimError):
    """The GPU has no FP4 quantize kernel (SM < 100): FlashInfer would hand back uninitialized memory."""


class NotExpressibleError(ShimError):
    """An argument combination the custom op cannot carry was used inside a compiled region."""
