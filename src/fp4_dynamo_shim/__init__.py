"""Make FlashInfer's FP4 quantization traceable by ``torch.compile(fullgraph=True)``.

``import fp4_dynamo_shim`` applies the shim (unless ``FP4_DYNAMO_SHIM_DISABLE=1``):
``flashinfer.fp4_quantize`` and every module global bound to it become a function
with the same signature that calls the ``fp4_dynamo_shim::fp4_quantize`` custom op.
``apply``, ``revert`` and ``status`` are the whole public API.
"""

import os

from . import config
from .patching import apply, revert, status

__all__ = ["apply", "revert", "status"]
__version__ = "0.1.0"

if not config.disabled():
    # Children of this process (SGLang spawns its workers) apply the shim through the import hook.
    os.environ[config.HOOK] = "1"
    apply()
