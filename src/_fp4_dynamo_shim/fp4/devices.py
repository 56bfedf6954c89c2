"""What the FP4 layer loaded for each device, as one record, and the seam tests and benchmarks use to change it.

``apply()`` fills :data:`STATE` in place; the op, its family and the generated replacement read it on every
call. It is one object for the life of the process (generated code holds it), never rebound: the rebinding
step swaps module globals that *are* an original, so an original kept in a module global of its own would
turn into the replacement. Tests and benchmarks change it only through :func:`overridden` (for a block) or
:func:`replace` (until the next ``apply()``), never by writing fields.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator, Optional

from .fp4_releases import Target


@dataclasses.dataclass
class DeviceState:
    #: The release's row of the targets table; None until apply().
    target: Optional[Target] = None
    #: ``Tensor.get_device()`` index -> launch function (-1, i.e. CPU, runs the reference quantizer).
    launchers: dict = dataclasses.field(default_factory=dict)
    #: ``Tensor.get_device()`` index -> (FlashInfer's JIT ``fp4_quantize``, default ``enable_pdl``) for GPUs
    #: whose launcher calls the kernel: the replacement's direct path for the common call skips ``quantize``.
    direct_kernels: dict = dataclasses.field(default_factory=dict)
    #: CUDA device index -> (FlashInfer's FP4 module namespace or None, fp4_quantize mode), for the family.
    family_modules: dict = dataclasses.field(default_factory=dict)
    #: FlashInfer's ``mm_fp4`` (a black box: backend choice, autotuning, cuDNN graphs).
    mm_fp4: Optional[Callable] = None


STATE = DeviceState()


def configure(target: Optional[Target], gpus: list, cpu_launch: Callable, mm_fp4: Optional[Callable]) -> None:
    """Everything at once, as apply() found it: the hot paths' lookups derived from one record per GPU
    (``kernels.Gpu``), and ``cpu_launch`` for CPU tensors (``get_device()`` -1)."""
    replace(
        target=target,
        launchers={**{gpu.device.index: gpu.launch for gpu in gpus}, -1: cpu_launch},
        direct_kernels={gpu.device.index: gpu.direct for gpu in gpus if gpu.direct is not None},
        family_modules={gpu.device.index: (gpu.namespace, gpu.device.mode) for gpu in gpus},
        mm_fp4=mm_fp4,
    )


def replace(**fields) -> dict:
    """Set fields of :data:`STATE` (until the next apply()); returns their previous values."""
    unknown = set(fields) - {field.name for field in dataclasses.fields(DeviceState)}
    if unknown:
        raise TypeError(f"DeviceState has no field {', '.join(sorted(unknown))}")
    previous = {name: getattr(STATE, name) for name in fields}
    for name, value in fields.items():
        setattr(STATE, name, value)
    return previous


@contextlib.contextmanager
def overridden(**fields) -> Iterator[DeviceState]:
    """Set fields of :data:`STATE` for the block and put the previous values back after it."""
    previous = replace(**fields)
    try:
        yield STATE
    finally:
        replace(**previous)


def serving_cpu_as(index: int) -> dict:
    """The fields that send CPU tensors (``get_device()`` -1) down CUDA device ``index``'s paths: how a stand-in
    GPU is exercised where there is none. Pass to :func:`overridden` or :func:`replace`."""
    fields = {"launchers": {**STATE.launchers, -1: STATE.launchers[index]}}
    if index in STATE.direct_kernels:
        fields["direct_kernels"] = {**STATE.direct_kernels, -1: STATE.direct_kernels[index]}
    return fields
