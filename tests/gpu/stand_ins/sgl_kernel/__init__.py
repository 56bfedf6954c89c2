"""Stand-in for sgl_kernel on the GPU test machine, for SGLang releases whose sgl_kernel binary cannot load
there (0.5.9 and 0.5.10 pin torch 2.9.1; the machine has 2.11). Only on PYTHONPATH when the real
sgl_kernel does not import (tests/gpu/run.sh decides).

SGLang's compile path (sglang.srt.compilation.weak_ref_tensor) needs ``weak_ref_tensor``: the real one
returns a tensor aliasing the same storage without owning it; this one returns the tensor itself (a
strong reference), which keeps CUDA-graph output buffers alive a little longer and changes nothing the
tests look at. Every other name SGLang imports from sgl_kernel (``from sgl_kernel import X``, which
``modelopt_quant`` and its imports do at module level) resolves to a function that raises if it is ever
called, so an import succeeds and a kernel that cannot run here fails loudly instead of being faked.
"""


def weak_ref_tensor(tensor):
    return tensor


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is a test stand-in: the real kernel cannot load on this machine")

    unavailable.__name__ = name
    return unavailable
