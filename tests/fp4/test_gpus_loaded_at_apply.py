"""What apply() loads per GPU, and what it hands each one: the kernel launcher, the reference, or a refusal.

``kernels.load`` runs once per visible GPU, so on a CPU machine it runs only through stand-ins for the GPUs:

- the device queries: ``torch.backends.cuda.is_built`` answers True, ``torch.cuda.device_count`` 3, and
  ``torch.cuda.get_device_capability`` / ``get_device_name`` answer per index for three GPUs: an SM100 (B200,
  which has the FP4 kernel), an SM90 (H100: FlashInfer builds an FP4 module there, but its quantize kernel
  writes nothing) and an SM80 (A100: FlashInfer has no FP4 module for it at all). They answer only by index,
  as torch does for an explicit index; nothing about the current device, streams or memory is stood in;
- FlashInfer's ``get_fp4_quantization_module``: a function shaped like FlashInfer's own (it raises
  ``ValueError("Invalid backend: 80")`` for a backend it has no module for, and otherwise returns a namespace
  whose ``fp4_quantize_sm100`` closure holds the built module in a cell named ``module``), where the built
  module is a ``stand_in_gpu.RecordingModule`` per backend that records its ``fp4_quantize`` calls and
  computes nothing. FlashInfer's real choice of architecture and its nvcc build are not run here; the GPU
  battery (tests/gpu, ``FP4_DYNAMO_SHIM_FALLBACK=launch`` on the H200) loads the real module.

What is real: load's choice of mode per GPU and fallback, the LoadedDevice records, the launchers generated
from the real rows of the release table (called here with sentinel strings in place of tensors, which they
hand on untouched), the refusal's words, and the log lines.
"""

from __future__ import annotations

import functools
import logging
import time
import types

import pytest
import torch

import fp4_dynamo_shim
import stand_in_gpu
from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim import rebind
from _fp4_dynamo_shim.errors import NoFp4KernelError
from _fp4_dynamo_shim import switches
from _fp4_dynamo_shim.fp4 import kernels, quantize_op, fp4_releases
from _fp4_dynamo_shim.fp4.kernels import LoadedDevice
from _fp4_dynamo_shim.fp4.fp4_layer import Fp4Layer

LOGGER = "fp4_dynamo_shim.fp4.kernels"
GPUS = (("NVIDIA B200", (10, 0)), ("NVIDIA H100 80GB HBM3", (9, 0)), ("NVIDIA A100-SXM4-80GB", (8, 0)))
#: The four tensors every launcher and kernel entry takes first: sentinels, handed on untouched.
TENSORS = ("<input>", "<global_scale>", "<out_val>", "<out_sf>")
#: Each launch scalar as a sentinel naming itself, so the kernel's arguments show which went where.
SCALARS = {name: f"<{name}>" for name in quantize_op.LAUNCH_SCALARS}
REFUSAL = (
    "fp4_quantize: {name} ({device}) is SM{sm}; FlashInfer's FP4 quantize kernel is compiled only for SM100 and "
    "newer, and on this GPU it writes nothing (the outputs would be uninitialized memory). Set "
    "FP4_DYNAMO_SHIM_FALLBACK=reference to run fp4_dynamo_shim's reference quantizer on the GPU instead (slow; "
    "for testing and development)."
)
LAUNCH_WARNING = (
    "fp4_dynamo_shim: FP4_DYNAMO_SHIM_FALLBACK=launch: launching FlashInfer's FP4 kernel on SM90, where it writes "
    "nothing; outputs are uninitialized. Use this for benchmarks only."
)
#: Each GPU's mode per fallback: SM100 always runs the kernel; "error" refuses below SM100; "launch" launches
#: the empty kernel where a module exists and refuses where FlashInfer has none (SM80).
MODES = {
    "error": ("kernel", "error", "error"),
    "reference": ("kernel", "reference", "reference"),
    "launch": ("kernel", "launch", "error"),
}


def namespace_holding(module):
    """What FlashInfer's ``get_fp4_quantization_module`` returns: closures over the built ``module``."""
    def fp4_quantize_sm100(*arguments):
        return module.fp4_quantize(*arguments)

    return types.SimpleNamespace(fp4_quantize_sm100=fp4_quantize_sm100)


class StandInFlashInfer:
    """FlashInfer's ``get_fp4_quantization_module`` for the stood-in GPUs (see the module docstring); records
    the backends asked for and the namespace it returned for each."""

    def __init__(self, modules):
        self.modules = modules
        self.returned = {}

    def __call__(self, backend):
        if backend not in self.modules:
            raise ValueError(f"Invalid backend: {backend}")
        self.returned[backend] = namespace_holding(self.modules[backend])
        return self.returned[backend]


@pytest.fixture
def three_gpus(monkeypatch):
    """SM100, SM90 and SM80 visible to torch (see the module docstring); returns FlashInfer's stand-in."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(GPUS))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: GPUS[index][0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: GPUS[index][1])
    return StandInFlashInfer({"100": stand_in_gpu.RecordingModule(), "90": stand_in_gpu.RecordingModule()})


def reference_launch(*arguments):
    """The reference launcher load is handed for the "reference" fallback (never called here)."""


def load(flashinfer, fallback, caplog):
    """``kernels.load`` for the installed release's row; returns its result, its wall time and its log lines."""
    caplog.clear()
    switches.warned.clear()  # the launch warning is said once per process: once per call here
    with caplog.at_level(logging.INFO, logger="fp4_dynamo_shim"):
        started = time.perf_counter()
        result = kernels.load(flashinfer, quantize_op.active_target(), fallback, reference_launch)
        elapsed = time.perf_counter() - started
    lines = [(record.levelname, record.getMessage()) for record in caplog.records if record.name in (LOGGER, "fp4_dynamo_shim")]
    return result, elapsed, lines


@pytest.mark.parametrize("fallback", sorted(MODES))
def test_each_gpu_is_recorded_with_its_capability_backend_pdl_and_the_mode_its_fallback_asks_for(
        three_gpus, fallback, caplog):
    gpus, elapsed, _ = load(three_gpus, fallback, caplog)
    devices = [gpu.device for gpu in gpus]
    seconds = [device.load_seconds for device in devices]
    kernel, sm90, sm80 = MODES[fallback]
    assert devices == [
        LoadedDevice(0, "NVIDIA B200", (10, 0), "100", True, enable_pdl=True, mode=kernel, load_seconds=seconds[0]),
        LoadedDevice(1, "NVIDIA H100 80GB HBM3", (9, 0), "90", False, enable_pdl=True, mode=sm90,
                     load_seconds=seconds[1]),
        LoadedDevice(2, "NVIDIA A100-SXM4-80GB", (8, 0), "80", False, enable_pdl=False, mode=sm80,
                     load_seconds=None),
    ]
    # status() reports how long each build took: a real duration, within load's own; none where nothing was built.
    assert all(isinstance(value, float) and 0 <= value <= elapsed for value in seconds[:2])
    # the family ops read FlashInfer's namespace and the mode per GPU from the record
    assert [gpu.namespace for gpu in gpus] == [three_gpus.returned["100"], three_gpus.returned["90"], None]


@pytest.mark.parametrize("fallback", sorted(MODES))
def test_each_gpu_gets_the_launcher_of_its_mode(three_gpus, fallback, caplog):
    """The kernel launcher calls that GPU's own JIT module with the GPU's PDL default; the reference is the one
    handed in; a refusal raises NoFp4KernelError naming the GPU, the input's device and both SM numbers."""
    gpus, _, _ = load(three_gpus, fallback, caplog)
    assert [gpu.device.index for gpu in gpus] == [0, 1, 2]
    for index, mode in enumerate(MODES[fallback]):
        launcher = gpus[index].launch
        if mode in ("kernel", "launch"):
            module = three_gpus.modules["100" if index == 0 else "90"]
            launcher(*TENSORS, *{**SCALARS, "enable_pdl": None}.values())
            scalars = {**SCALARS, "enable_pdl": True}  # SM90 and SM100 both support PDL
            assert module.calls == [(*TENSORS, *(scalars[name] for name in quantize_op.active_target().kernel_args))]
            assert gpus[index].direct == (module.fp4_quantize, True)  # the direct path's entry and PDL default
        elif mode == "reference":
            assert launcher is reference_launch and gpus[index].direct is None
        else:
            name, (major, minor) = GPUS[index]
            device = torch.device("cuda", index)
            with pytest.raises(NoFp4KernelError) as raised:
                launcher(types.SimpleNamespace(device=device), *TENSORS[1:], *SCALARS.values())
            assert str(raised.value) == REFUSAL.format(name=name, device=f"cuda:{index}", sm=f"{major}{minor}")


@pytest.mark.parametrize("fallback", sorted(MODES))
def test_load_logs_each_build_time_each_gpu_without_a_module_and_warns_once_for_the_empty_kernel(
        three_gpus, fallback, caplog):
    """Users read these lines (the "fp4_dynamo_shim" logger tree) to see what apply() built and how long it took,
    and the warning is the only sign at apply time that launch-mode outputs are garbage."""
    gpus, _, lines = load(three_gpus, fallback, caplog)
    devices = [gpu.device for gpu in gpus]
    expected = [
        ("INFO", f"fp4_dynamo_shim: FP4 module for NVIDIA B200 (SM100) built/loaded in "
                 f"{devices[0].load_seconds:.2f} s"),
        ("INFO", f"fp4_dynamo_shim: FP4 module for NVIDIA H100 80GB HBM3 (SM90) built/loaded in "
                 f"{devices[1].load_seconds:.2f} s"),
        *([("WARNING", LAUNCH_WARNING)] if fallback == "launch" else []),
        ("INFO", "fp4_dynamo_shim: no FlashInfer FP4 module for SM80 (Invalid backend: 80)"),
    ]
    assert lines == expected


def test_a_jit_module_without_fp4_quantize_stops_the_load_naming_its_public_functions(three_gpus, caplog):
    """A JIT cache built from other sources loads but has no entry: load raises (so apply() leaves FlashInfer
    untouched) and lists what the module does have, leaving out its private names."""
    class Mismatched:
        def fp4_quantize_renamed(self, *arguments):
            pass

        def block_scale_interleave(self, *arguments):
            pass

        def _private_helper(self):
            pass

    three_gpus.modules["100"] = Mismatched()
    with pytest.raises(RuntimeError) as raised:
        load(three_gpus, "error", caplog)
    assert str(raised.value) == ("FlashInfer's FP4 JIT module for SM100 has no fp4_quantize entry "
                                 "(its functions: block_scale_interleave, fp4_quantize_renamed)")


@pytest.mark.parametrize("target", fp4_releases.TARGETS, ids=lambda target: str(target.versions))
@pytest.mark.parametrize("default, given, passed", [(True, None, True), (False, None, False),
                                                    (True, False, False), (False, True, True)])
def test_the_kernel_launcher_passes_the_release_argument_order_and_resolves_enable_pdl(target, default, given,
                                                                                       passed):
    """The launcher takes the op's launch scalars in the op's order and calls the kernel entry in the release's
    order (older entries take fewer); enable_pdl=None means the GPU's default, an explicit value is passed on."""
    module = stand_in_gpu.RecordingModule()
    launch = kernels.make_kernel_launcher(module.fp4_quantize, target, default)
    launch(*TENSORS, *{**SCALARS, "enable_pdl": given}.values())
    scalars = {**SCALARS, "enable_pdl": passed}
    assert module.calls == [(*TENSORS, *(scalars[name] for name in target.kernel_args))]


def test_the_oldest_and_newest_kernel_entries_take_their_scalars_in_these_orders():
    """The table's two ends written out, so a reordered row shows here and not only on a GPU."""
    orders = {}
    for target in (fp4_releases.TARGETS[0], fp4_releases.TARGETS[-1]):
        module = stand_in_gpu.RecordingModule()
        kernels.make_kernel_launcher(module.fp4_quantize, target, True)(*TENSORS, *SCALARS.values())
        orders[str(target.versions)] = module.calls[0][len(TENSORS):]
    assert orders == {
        str(fp4_releases.TARGETS[0].versions): ("<sf_vec_size>", "<sf_use_ue8m0>", "<is_sf_swizzled_layout>",
                                            "<is_sf_8x4_layout>", "<enable_pdl>"),
        str(fp4_releases.TARGETS[-1].versions): ("<sf_vec_size>", "<sf_use_ue8m0>", "<is_sf_swizzled_layout>",
                                             "<is_sf_8x4_layout>", "<is_global_scale_inversed>", "<enable_pdl>",
                                             "<nvfp4_4over6_code>"),
    }


@pytest.mark.parametrize("built, visible", [(False, 0), (True, 3)])
def test_visible_gpus_are_zero_without_a_cuda_build_and_torchs_count_with_one(monkeypatch, built, visible):
    """A CPU-only torch must not be asked for its device count (that would try to initialise CUDA)."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: built)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert kernels.visible_device_count() == visible


def _flashinfers_functions() -> dict:
    """FlashInfer's FP4 functions by name, as the shim found them and as it left them: (before, after apply)."""
    import flashinfer

    names = ["fp4_quantize", *(name for name in fp4_dynamo_shim.status()["family"] if hasattr(flashinfer, name))]
    fp4_dynamo_shim.revert()
    before = {name: getattr(flashinfer, name) for name in names}
    assert fp4_dynamo_shim.apply()
    return {name: (before[name], getattr(flashinfer, name)) for name in names}


def test_original_is_flashinfers_function_behind_each_replacement():
    """``original_function(name)`` (public through ``lifecycle``) for every function the applied layer replaced."""
    replaced = {name: pair for name, pair in _flashinfers_functions().items() if pair[0] is not pair[1]}
    assert "fp4_quantize" in replaced and len(replaced) > 1
    for name, (old, new) in replaced.items():
        assert lifecycle.original_function(name) is old


def test_original_finds_by_name_skips_unnamed_originals_and_answers_none_where_there_is_no_shim_replacement():
    """A layer whose pairs hold an original without a ``__name__`` (a functools.partial some code bound in the
    function's place), two shim replacements, and a pair whose new function is not the shim's: only a pair with
    that name and a shim replacement answers."""
    by_name = _flashinfers_functions()
    fp4_old, fp4_new = by_name["fp4_quantize"]
    nvfp4_old, nvfp4_new = by_name["nvfp4_quantize"]
    mxfp4_old = by_name["mxfp4_quantize"][0]

    def not_the_shims(*arguments, **keywords):
        return mxfp4_old(*arguments, **keywords)

    unnamed = functools.partial(fp4_old)
    layer = Fp4Layer(quantize_op.active_target(), swaps=rebind.Swaps(pairs=[
        (unnamed, fp4_new), (nvfp4_old, nvfp4_new), (fp4_old, fp4_new), (mxfp4_old, not_the_shims),
    ]))
    assert layer.original("fp4_quantize") is fp4_old
    assert layer.original("nvfp4_quantize") is nvfp4_old
    assert layer.original("mxfp4_quantize") is None
    assert layer.original("no_such_function") is None
