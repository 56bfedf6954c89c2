"""Stand-in for sgl_kernel on the GPU test machine, where its large binary wheel cannot travel.

SGLang's compile path (sglang.srt.compilation.weak_ref_tensor) imports only ``weak_ref_tensor`` from
sgl_kernel on CUDA. The real one returns a tensor aliasing the same storage without owning it; this one
returns the tensor itself (a strong reference), which keeps CUDA-graph output buffers alive a little
longer and changes nothing else the tests look at.
"""


def weak_ref_tensor(tensor):
    return tensor
