"""Make FlashInfer's FP4 quantization traceable by ``torch.compile(fullgraph=True)``.

``import fp4_dynamo_shim`` applies the shim (unless ``FP4_DYNAMO_SHIM_DISABLE=1``):
``flashinfer.fp4_quantize`` and every module global bound to it become a function
with the same signature that calls the ``fp4_dynamo_shim::fp4_quantize`` custom op,
and ``FP4_DYNAMO_SHIM=1`` is exported so that child processes apply it too.
``apply``, ``revert`` and ``status`` are the whole public API.
"""

import sys

from . import patching
from .patching import apply, revert, status

__all__ = ["apply", "revert", "status"]
__version__ = "0.1.0"

# The start-up module sets ``activating`` while it imports the package (hook or plugin), so the route is
# recorded; only a user's own import exports FP4_DYNAMO_SHIM=1 for children (the other routes reach
# children by themselves).
_route = getattr(sys.modules.get("fp4_dynamo_shim_hook"), "activating", None) or "import"
if patching.apply(route=_route) and _route == "import":
    patching.export_for_children()
