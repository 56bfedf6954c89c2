"""How the FP4 family's op kernels route a call and what their device screens let through: built and called at
test time (what the GPU path hands FlashInfer is test_family_hands_flashinfer_its_arguments.py).

``family_ops`` builds each op's kernels (``_make_kernel``) and device screens (``_screened``) once, when its
import registers the ops; the other family tests call those registered closures, so only building them again
here shows what a change to how they are built does. Most of what is checked here runs only on a GPU (the
kernels' CUDA branches, the CUDA screen), yet it only routes, compares device
indices, reshapes and hands arguments on, which stand-ins can show on a CPU:

- ``OnGpu``, a CUDA tensor as the routing and the screens see it: a CUDA ``device``, ``get_device()``, not CPU,
  not meta. It holds no data, and torch's dispatcher never sees it: which kernel the dispatcher picks for real
  CUDA tensors, and any real CUDA launch, are for tests/gpu/test_gpu_family.py on a GPU;
- what ``apply()`` loaded per GPU, set with ``devices.overridden`` (put back after each test);
- the op's reference and FlashInfer call, replaced (``dataclasses.replace``) by recorders of how they were called.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from _fp4_dynamo_shim.errors import InvalidArgumentError, NoFp4KernelError, ShimError
from _fp4_dynamo_shim.fp4 import devices
from _fp4_dynamo_shim.fp4 import family_ops
from _fp4_dynamo_shim.fp4.quantize_op import check_devices

OPS = {op.name: op for op in family_ops.OPS}
# The three below run only on a GPU (the kernels' CUDA branches and device screens, built once when the ops are
# registered); no public path reaches them on CPU, so they are built again here from the module's own builders.
make_kernel = family_ops._make_kernel
screen = family_ops._screened
first_loaded_namespace = family_ops._first_loaded_namespace
U8, BF16 = torch.uint8, torch.bfloat16


class OnGpu:
    """A tensor on ``cuda:index`` as far as the kernels' routing and the device screens look (no data)."""

    is_cpu = False
    is_meta = False

    def __init__(self, index=0):
        self.device = torch.device("cuda", index)

    def get_device(self):
        return self.device.index

    def __repr__(self):
        return f"OnGpu({self.device.index})"


class Argument:
    """A non-tensor argument, or a tensor the code under test only hands on: passed through by identity."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


# FlashInfer's FP4 module namespaces as apply() loads them, one per GPU; the kernel only passes them on.
MODULE_0, MODULE_1 = types.SimpleNamespace(gpu=0), types.SimpleNamespace(gpu=1)


def recording(op):
    """``op`` with a reference and a FlashInfer call that record how they were called."""
    calls = []

    def reference(*arguments):
        calls.append(("reference", arguments))
        return "the reference's outputs"

    def via_flashinfer(*arguments):
        calls.append(("flashinfer", arguments))
        return "FlashInfer's outputs"

    return dataclasses.replace(op, reference=reference, via_flashinfer=via_flashinfer), calls


def kernel_call(op_name, first, family_modules):
    """Build the op's kernel now and call it with ``first`` and two more arguments; (outputs, calls, arguments)."""
    op, calls = recording(OPS[op_name])
    arguments = (first, Argument("second"), Argument("third"))
    with devices.overridden(family_modules=family_modules):
        outputs = make_kernel(op)(*arguments)
    return outputs, calls, arguments


# _make_kernel on a GPU ----------------------------------------------------------------------------------------
# One op for each answer to "what does it do on a GPU without FP4 kernels" (the table's without_fp4 column).
REFUSES, OWN_ERROR, RUNS = "fp4_batched_quantize", "mm_fp4", "block_scale_interleave"
REFERENCE, REFUSED, NO_MODULE = "reference", "refused", "no module"

# (op, what apply() loaded for cuda:1 (None: nothing, the index is not in the table), what the kernel does)
GPU_ROUTES = [
    # An SM100 GPU, or one whose kernel launches on request (FP4_DYNAMO_SHIM_FALLBACK=launch): FlashInfer.
    *[(name, (MODULE_1, mode), MODULE_1) for name in (REFUSES, OWN_ERROR, RUNS) for mode in ("kernel", "launch")],
    # Below SM100 with the reference fallback: the reference, but for the kernels that run on any GPU.
    (REFUSES, (MODULE_1, "reference"), REFERENCE),
    (OWN_ERROR, (MODULE_1, "reference"), REFERENCE),
    (RUNS, (MODULE_1, "reference"), MODULE_1),
    (REFUSES, (None, "reference"), REFERENCE),
    (OWN_ERROR, (None, "reference"), REFERENCE),
    # Below SM100 by default: the quantizers refuse; mm_fp4 raises FlashInfer's own error; the rest run.
    (REFUSES, (MODULE_1, "error"), REFUSED),
    (OWN_ERROR, (MODULE_1, "error"), MODULE_1),
    (RUNS, (MODULE_1, "error"), MODULE_1),
    (REFUSES, (None, "error"), REFUSED),
    # No FP4 module for this GPU (FlashInfer has none for its SM, or apply() never saw it): the shim says so,
    # but mm_fp4, which calls FlashInfer's public mm_fp4 and needs no module.
    (RUNS, (None, "error"), NO_MODULE),
    (RUNS, (None, "reference"), NO_MODULE),
    (OWN_ERROR, (None, "error"), None),
    (REFUSES, None, NO_MODULE),
    (RUNS, None, NO_MODULE),
    (OWN_ERROR, None, None),
]


def route_id(op_name, loaded):
    return f"{op_name}-{loaded[1]}-{'module' if loaded[0] else 'none'}" if loaded else f"{op_name}-unloaded"


@pytest.mark.parametrize("op_name, loaded, does", GPU_ROUTES, ids=[route_id(n, loaded) for n, loaded, _ in GPU_ROUTES])
def test_a_gpu_call_goes_where_the_devices_mode_and_the_ops_column_say(op_name, loaded, does):
    # cuda:0 is loaded with SM100 kernels throughout: only cuda:1's entry may decide where cuda:1's call goes.
    family_modules = {0: (MODULE_0, "kernel"), **({1: loaded} if loaded else {})}
    op, calls = recording(OPS[op_name])
    arguments = (OnGpu(1), Argument("second"), Argument("third"))
    with devices.overridden(family_modules=family_modules):
        kernel = make_kernel(op)
        if does == REFUSED:
            with pytest.raises(NoFp4KernelError) as refused:
                kernel(*arguments)
            assert str(refused.value) == (
                f"{op_name}: cuda:1 has no FP4 kernel below SM100 (its outputs would be uninitialized memory); "
                "set FP4_DYNAMO_SHIM_FALLBACK=reference to run the reference quantizer instead")
            assert calls == []
        elif does == NO_MODULE:
            with pytest.raises(ShimError) as missing:
                kernel(*arguments)
            assert type(missing.value) is ShimError
            assert str(missing.value) == "fp4_dynamo_shim: FlashInfer has no FP4 module loaded for cuda:1"
            assert calls == []
        elif does == REFERENCE:
            assert kernel(*arguments) == "the reference's outputs"
            assert calls == [("reference", arguments)]
        else:  # FlashInfer, through this GPU's module (None for mm_fp4 without one)
            assert kernel(*arguments) == "FlashInfer's outputs"
            assert calls == [("flashinfer", (does, *arguments))]


@pytest.mark.parametrize("op_name", [op.name for op in family_ops.OPS if not op.host])
def test_a_cpu_call_runs_the_reference_whatever_the_gpus_loaded(op_name):
    cpu = torch.zeros(2, dtype=U8)
    outputs, calls, arguments = kernel_call(op_name, cpu, {0: (MODULE_0, "kernel"), 1: (None, "error")})
    assert outputs == "the reference's outputs"
    assert calls == [("reference", arguments)]


# Host ops: FlashInfer runs them on the host through the first loaded module, whatever the inputs' device.
HOST_ROUTES = [
    ({}, None),
    ({0: (None, "error")}, None),
    ({0: (MODULE_0, "kernel")}, MODULE_0),
    ({0: (MODULE_0, "reference"), 1: (MODULE_1, "kernel")}, MODULE_0),
    ({0: (None, "error"), 1: (MODULE_1, "reference")}, MODULE_1),  # a module, in any mode: host code runs anywhere
]


@pytest.mark.parametrize("op_name", [op.name for op in family_ops.OPS if op.host])
@pytest.mark.parametrize("first", [torch.zeros(2, dtype=U8), OnGpu(3)], ids=["cpu", "cuda:3"])
@pytest.mark.parametrize("family_modules, module", HOST_ROUTES, ids=[str(i) for i in range(len(HOST_ROUTES))])
def test_a_host_op_runs_flashinfers_host_code_through_the_first_loaded_module_else_the_reference(
        op_name, first, family_modules, module):
    outputs, calls, arguments = kernel_call(op_name, first, family_modules)
    if module is None:
        assert (outputs, calls) == ("the reference's outputs", [("reference", arguments)])
    else:
        assert (outputs, calls) == ("FlashInfer's outputs", [("flashinfer", (module, *arguments))])


def test_the_first_loaded_namespace_skips_gpus_without_a_module():
    with devices.overridden(family_modules={0: (None, "error"), 1: (MODULE_1, "kernel"), 2: (MODULE_0, "kernel")}):
        assert first_loaded_namespace() is MODULE_1
    with devices.overridden(family_modules={0: (None, "error")}):
        assert first_loaded_namespace() is None


# _screened ----------------------------------------------------------------------------------------------------
# Each op's tensor arguments, the leading Tensor and Tensor? of its schema, which the screens compare.
TENSORS = {
    "block_scale_interleave": ("unswizzled_sf",),
    "e2m1_and_ufp8sf_scale_to_float": ("e2m1", "sf", "global_scale"),
    "mxfp4_dequantize_host": ("weight", "scale"),
    "fp4_batched_quantize": ("input", "global_scale"),
    "fp4_experts_quantize": ("input", "global_scale", "mask"),
    "mm_fp4": ("a", "b", "a_descale", "b_descale", "alpha"),
}


def test_every_op_has_its_tensor_arguments_listed_here():
    assert set(TENSORS) == set(OPS)


def op_arguments(op_name, tensors):
    """The op's arguments: ``tensors`` first, then a stand-in for each of its other schema arguments."""
    schema = torch._C.parse_schema(OPS[op_name].schema).arguments
    return (*tensors, *(Argument(a.name) for a in schema[len(tensors):]))


def implementation():
    """An op's fake or kernel that records its calls."""
    calls = []

    def fp4_op_implementation(*arguments):
        """What the op computes."""
        calls.append(arguments)
        return "its outputs"

    return fp4_op_implementation, calls


def keeps_its_face(screened, implementation):
    """The screen stands in for the implementation wherever it is registered: same name, docstring, wrapped."""
    return ((screened.__name__, screened.__doc__, screened.__wrapped__) ==
            ("fp4_op_implementation", "What the op computes.", implementation))


@pytest.fixture
def device_checks(monkeypatch):
    """Every ``check_devices`` call the screens make, recorded (the real check still runs)."""
    calls = []

    def recorded(function, names, tensors, host=False):
        calls.append((function, names, tuple(tensors), host))
        return check_devices(function, names, tensors, host)

    monkeypatch.setattr(family_ops, "check_devices", recorded)
    return calls


@pytest.mark.parametrize("op_name", TENSORS)
def test_the_fake_screen_checks_the_ops_tensor_arguments_by_name_then_calls_the_fake_unchanged(op_name,
                                                                                                device_checks):
    fake, calls = implementation()
    screened = screen(OPS[op_name], fake, fake=True)
    arguments = op_arguments(op_name, [OnGpu(0) for _ in TENSORS[op_name]])
    assert screened(*arguments) == "its outputs"
    assert calls == [arguments]
    count = len(TENSORS[op_name])
    assert device_checks == [(f"fp4_dynamo_shim::{op_name}", TENSORS[op_name], arguments[:count], OPS[op_name].host)]
    assert keeps_its_face(screened, fake)


@pytest.mark.parametrize("op_name", [name for name in TENSORS if len(TENSORS[name]) > 1])
def test_the_fake_screen_refuses_a_tensor_on_another_gpu_naming_it_except_for_host_ops(op_name):
    fake, calls = implementation()
    names = TENSORS[op_name]
    # Put the stranger last: every argument before it is compared and passes.
    arguments = op_arguments(op_name, [*(OnGpu(0) for _ in names[:-1]), OnGpu(1)])
    screened = screen(OPS[op_name], fake, fake=True)
    if OPS[op_name].host:  # FlashInfer copies a host op's inputs to the CPU itself
        assert screened(*arguments) == "its outputs"
        assert calls == [arguments]
        return
    with pytest.raises(InvalidArgumentError) as refused:
        screened(*arguments)
    assert str(refused.value) == (f"fp4_dynamo_shim::{op_name}: {names[-1]} is on cuda:1 but {names[0]} is on "
                                  "cuda:0; every tensor argument must be on the same device")
    assert calls == []


@pytest.mark.parametrize("op_name", [op.name for op in family_ops.OPS if op.host])
def test_the_fake_screen_refuses_a_meta_tensor_next_to_a_real_one_for_host_ops_too(op_name):
    fake, calls = implementation()
    first, second = TENSORS[op_name][:2]
    arguments = op_arguments(op_name, [torch.zeros(2, dtype=U8), torch.zeros(2, dtype=U8, device="meta"),
                                       *(torch.zeros(2) for _ in TENSORS[op_name][2:])])
    with pytest.raises(InvalidArgumentError) as refused:
        screen(OPS[op_name], fake, fake=True)(*arguments)
    assert str(refused.value) == (f"fp4_dynamo_shim::{op_name}: {second} is on meta but {first} is on cpu; "
                                  "a meta tensor only goes with other meta tensors")
    assert calls == []


# The CUDA kernel's screen, for every op with more than one tensor argument and each argument in turn on
# another device than the rest: (op, position, its device).
STRANGERS = [(name, position, stranger) for name, names in TENSORS.items() if len(names) > 1
             for position in range(len(names)) for stranger in ("cuda:1", "cpu")]


@pytest.mark.parametrize("op_name, position, stranger", STRANGERS)
def test_the_cuda_screen_refuses_a_tensor_on_another_device_naming_it(op_name, position, stranger):
    kernel, calls = implementation()
    names = TENSORS[op_name]
    odd = OnGpu(1) if stranger == "cuda:1" else torch.zeros(2, dtype=U8)
    arguments = op_arguments(op_name, [odd if i == position else OnGpu(0) for i in range(len(names))])
    with pytest.raises(InvalidArgumentError) as refused:
        screen(OPS[op_name], kernel, fake=False)(*arguments)
    # The check names the first tensor not on the first one's device: the second, when the first is the stranger.
    named, where, first, first_where = ((names[1], "cuda:0", names[0], stranger) if position == 0 else
                                        (names[position], stranger, names[0], "cuda:0"))
    assert str(refused.value) == (f"fp4_dynamo_shim::{op_name}: {named} is on {where} but {first} is on "
                                  f"{first_where}; every tensor argument must be on the same device")
    assert calls == []


@pytest.mark.parametrize("op_name", TENSORS)
@pytest.mark.parametrize("gpu", [0, 1])
def test_the_cuda_screen_passes_tensors_on_one_gpu_unchanged_without_the_full_device_check(op_name, gpu,
                                                                                          device_checks):
    # check_devices is only consulted to word a refusal: this screen runs on every eager GPU call.
    kernel, calls = implementation()
    screened = screen(OPS[op_name], kernel, fake=False)
    arguments = op_arguments(op_name, [OnGpu(gpu) for _ in TENSORS[op_name]])
    assert screened(*arguments) == "its outputs"
    assert calls == [arguments]
    assert device_checks == []
    assert keeps_its_face(screened, kernel)


def test_the_cuda_screen_skips_mm_fp4s_absent_alpha():
    kernel, calls = implementation()
    arguments = op_arguments("mm_fp4", [OnGpu(0), OnGpu(0), OnGpu(0), OnGpu(0), None])
    assert screen(OPS["mm_fp4"], kernel, fake=False)(*arguments) == "its outputs"
    assert calls == [arguments]
