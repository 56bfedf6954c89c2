"""Forwarder for the start-up lines already installed in users' environments.

``fp4_dynamo_shim.pth`` calls :func:`install_if_enabled`; the ``.pth`` and the sitecustomize block that
``fp4-dynamo-shim install-hook`` writes (and the documented one-liner) call :func:`install`. Both live in
``_fp4_dynamo_shim.activation.startup``; these names must keep working for every line ever installed.
"""

from _fp4_dynamo_shim.activation.startup import install, install_if_enabled

__all__ = ["install", "install_if_enabled"]
