"""The exceptions the shim raises, so callers can tell its refusals apart (defined in ``_fp4_dynamo_shim.errors``)."""

from _fp4_dynamo_shim.errors import (ApplyError, InvalidArgumentError, NoFp4KernelError, NotExpressibleError,
                                     ShimError)

__all__ = ["ShimError", "ApplyError", "NoFp4KernelError", "NotExpressibleError", "InvalidArgumentError"]
