"""Stand-in for one GPU query, used only by matrix legs whose FlashInfer cannot be imported without a GPU.

FlashInfer 0.6.8-0.6.18 call ``torch.cuda.get_device_properties(0).multi_processor_count`` at module
level (flashinfer/gdn_kernels/...), which a CPU-only torch cannot answer. With torch built without CUDA,
this answers that one query with a fixed record so the releases import and the CPU suite can run; nothing
else is changed, and nothing happens when torch has CUDA.
"""

import torch

if not torch.backends.cuda.is_built():
    class _Properties:
        name = "stand-in (no GPU)"
        major, minor = 9, 0
        multi_processor_count = 132
        total_memory = 80 << 30

    torch.cuda.get_device_properties = lambda device=None: _Properties()
