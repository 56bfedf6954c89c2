"""The FP4 layer: ``fp4_quantize`` and its family behind the shim's ops, applied as one record.

:func:`apply` returns a :class:`Fp4Layer` with ``undo`` and ``describe``, the shape every layer of the
lifecycle has (``layers``): it loads the kernels, configures the ops, rebinds ``fp4_quantize`` and the family wherever a
module global is one of them, and repairs FlashInfer's own op where the release has one. A failure half-way
undoes what was done and raises.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, List, Optional

from .. import rebind
from ..errors import ApplyError
from ..layers import Context, UndoStack
from . import devices, family, flashinfer_op, kernels, quantize_op, fp4_releases, replacement
from .fp4_parts import JIT_GETTER


@dataclasses.dataclass
class Fp4Layer:
    target: fp4_releases.Target
    swaps: rebind.Swaps = dataclasses.field(default_factory=rebind.Swaps)
    devices: List[kernels.LoadedDevice] = dataclasses.field(default_factory=list)
    #: FP4 family function -> what the shim did with it in this release.
    family: dict = dataclasses.field(default_factory=dict)
    #: The rebinding's undo, then FlashInfer's own op registrations put back: undo() runs them newest first.
    undo_steps: UndoStack = dataclasses.field(default_factory=UndoStack)
    #: Parts left as FlashInfer's (an untested release whose sources differ there) -> why.
    left: dict = dataclasses.field(default_factory=dict)

    def original(self, name: str) -> Optional[Callable]:
        """FlashInfer's own function behind the replacement called ``name``."""
        for old, new in self.swaps.pairs:
            if getattr(old, "__name__", None) == name and replacement.is_shim(new):
                return old
        return None

    def undo(self) -> None:
        self.undo_steps.undo_all()

    def describe(self) -> dict:
        """The layer's part of ``status()``."""
        return {
            "target": fp4_releases.describe(self.target),
            "op": f"{quantize_op.NAMESPACE}::{quantize_op.OP_NAME}",
            "family": dict(self.family),
            "devices": [dataclasses.asdict(device) for device in self.devices],
            "skipped": self.skipped(),
        }

    def skipped(self) -> List[str]:
        """What the layer deliberately does not do here, with the reason."""
        skipped = [f"{name}: left as FlashInfer's ({reason})" for name, reason in self.left.items()
                   if name in (JIT_GETTER, "fp4_quantize")]
        if JIT_GETTER in self.left:
            return skipped
        if not self.devices:
            skipped.append("JIT build/load: no GPU visible (CPU tensors use the reference quantizer)")
        for device in self.devices:
            if device.mode == "error":
                skipped.append(
                    f"cuda:{device.index} {device.name} SM{device.backend}: no FP4 kernel below SM100, calls raise "
                    "(FP4_DYNAMO_SHIM_FALLBACK=reference runs the reference quantizer there)"
                )
            elif device.mode == "reference":
                skipped.append(f"cuda:{device.index} SM{device.backend}: FlashInfer kernel not used, reference quantizer runs")
        return skipped


def apply(context: Context) -> Fp4Layer:
    """The layer's step: the row's target, in the module FlashInfer defines ``fp4_quantize`` in."""
    target = fp4_releases.target_for(context.row)
    module = None if JIT_GETTER in context.left else importlib.import_module(target.module)
    return patch(context.row, target, module, context.settings.fallback, context.left)


def patch(version: str, target: fp4_releases.Target, module, fallback: str, left: Optional[dict] = None) -> Fp4Layer:
    """Put ``module.fp4_quantize`` and the release's FP4 family behind the shim's ops, except the parts in
    ``left`` (name -> why): without the JIT getter nothing is patched, as every kernel comes through it."""
    left = dict(left or {})
    if JIT_GETTER in left:
        return Fp4Layer(target, left=left, family={member.name: f"left as FlashInfer's: {left[member.name]}"
                                                   for member in family.members_for(version) if member.name in left})
    original = module.fp4_quantize
    if replacement.is_shim(original):
        raise ApplyError(f"{target.module}.fp4_quantize is already a fp4_dynamo_shim replacement")
    recipe = replacement.recipe_for(original, module)
    replaced = None if "fp4_quantize" in left else replacement.build(original, module, recipe, target)
    family_replaced, family_report = family.build_replacements(version, module, replaced, recipe, left)
    layer = Fp4Layer(target, family=family_report, left=left)
    layer.undo_steps.push(layer.swaps.undo)
    try:
        gpus = kernels.load(module.get_fp4_quantization_module, target, fallback, quantize_op.launch_reference)
        layer.devices = [gpu.device for gpu in gpus]
        devices.configure(target, gpus, quantize_op.launch_reference, mm_fp4=family_replaced.get("mm_fp4", (None,))[0])
        layer.swaps.swap(*([(original, replaced)] if replaced is not None else []), *family_replaced.values())
        restore_op = flashinfer_op.repair(target, module, recipe) if replaced is not None else None
        if restore_op is not None:
            layer.undo_steps.push(restore_op)
            layer.family["torch.ops.flashinfer.fp4_quantize"] = flashinfer_op.describe(target)
    except BaseException:
        layer.undo()
        raise
    return layer
