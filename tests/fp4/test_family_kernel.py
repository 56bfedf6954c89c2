"""How the FP4 family's op kernels route a call, what their device screens let through, and what the GPU path
hands FlashInfer: built and called at test time.

``family_ops`` builds each op's kernels (``_make_kernel``) and device screens (``_screened``) once, when its
import registers the ops; the other family tests call those registered closures, so only building them again
here shows what a change to how they are built does. Most of what is checked here runs only on a GPU (the
kernels' CUDA branches, the CUDA screen, the ``*_flashinfer`` adapters), yet it only routes, compares device
indices, reshapes and hands arguments on, which stand-ins can show on a CPU:

- ``OnGpu``, a CUDA tensor as the routing and the screens see it: a CUDA ``device``, ``get_device()``, not CPU,
  not meta. It holds no data, and torch's dispatcher never sees it: which kernel the dispatcher picks for real
  CUDA tensors, and any real CUDA launch, are for tests/gpu/test_gpu_family.py on a GPU;
- what ``apply()`` loaded per GPU, set with ``devices.overridden`` (put back after each test);
- the op's reference and FlashInfer call, replaced (``dataclasses.replace``) by recorders of how they were called;
- FlashInfer's built module's closures and its ``mm_fp4``: recorders with the signatures of FlashInfer 0.7.4's
  (``flashinfer/quantization/fp4_quantization.py``, ``flashinfer/gemm/gemm_base.py``), or of an older
  release's without the trailing parameter, returning CPU tensors shaped as the real ones return theirs. They
  compute nothing: FlashInfer's values are test_gpu_family.py's, and test_family_parity.py compares the module
  calls with those FlashInfer's own functions make.
"""

from __future__ import annotations

import dataclasses
import inspect
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


# The *_flashinfer adapters ------------------------------------------------------------------------------------

def closure(parameters, returns):
    """A stand-in for one of FlashInfer's functions: takes exactly ``parameters`` (FlashInfer's names, so the
    adapters can ask which it has), records each call's positional arguments, returns ``returns`` (or what
    ``returns`` computes from them)."""
    signature = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                   for name in parameters])
    calls = []

    def function(*arguments):
        signature.bind(*arguments)  # a TypeError, as from FlashInfer's own function, for an argument too many
        calls.append(arguments)
        return returns(*arguments) if callable(returns) else returns

    function.__signature__ = signature
    function.calls = calls
    return function


DEQUANTIZE = ("e2m1_tensor", "ufp8_scale_tensor", "global_scale_tensor", "sf_vec_size", "ufp8_type",
              "is_sf_swizzled_layout")
BATCHED = ("input", "global_scale", "sf_vec_size", "sf_use_ue8m0")


@pytest.mark.parametrize("has_8x4", [True, False], ids=["with is_sf_8x4_layout", "an older release's, without"])
def test_dequantize_hands_flashinfers_host_closure_the_8x4_flag_only_where_it_takes_one(has_8x4):
    e2m1, sf, global_scale = torch.zeros(2, 8, dtype=U8), torch.zeros(128 * 4, dtype=U8), torch.ones(1)
    dequantized = torch.zeros(2, 16)  # FlashInfer's host output: [M, K] float32 on the CPU
    function = closure(DEQUANTIZE + (("is_sf_8x4_layout",) if has_8x4 else ()), dequantized)
    namespace = types.SimpleNamespace(e2m1_and_ufp8sf_scale_to_float_sm100=function)
    got = OPS["e2m1_and_ufp8sf_scale_to_float"].via_flashinfer(namespace, e2m1, sf, global_scale, 16, 1, True, True)
    assert got is dequantized
    assert function.calls == [(e2m1, sf, global_scale, 16, 1, True) + ((True,) if has_8x4 else ())]


@pytest.mark.parametrize("has_code", [True, False], ids=["with nvfp4_4over6_code", "an older release's, without"])
def test_batched_quantize_hands_flashinfer_the_recipe_code_only_where_it_takes_one(has_code):
    x, global_scale = torch.zeros(2, 4, 32, dtype=BF16), torch.ones(1)
    # FlashInfer's outputs: [B, M, K/2] values and [B, round_up(M, 128) * round_up(K/16, 4)] scale factors.
    outputs = (torch.zeros(2, 4, 16, dtype=U8), torch.zeros(2, 128 * 4, dtype=U8))
    function = closure(BATCHED + (("nvfp4_4over6_code",) if has_code else ()), outputs)
    namespace = types.SimpleNamespace(fp4_batched_quantize_sm100=function)
    assert OPS["fp4_batched_quantize"].via_flashinfer(namespace, x, global_scale, 16, True, 7) is outputs
    assert function.calls == [(x, global_scale, 16, True) + ((7,) if has_code else ())]


def test_host_dequantize_and_interleave_hand_flashinfer_their_arguments_as_they_are():
    weight, scale, sf = torch.zeros(2, 16, dtype=U8), torch.zeros(2, 1, dtype=U8), torch.zeros(2, 4, dtype=U8)
    dequantized, interleaved = torch.zeros(2, 32), torch.zeros(128 * 4, dtype=U8)
    namespace = types.SimpleNamespace(
        mxfp4_dequantize_host=closure(("weight", "scale", "group_size"), dequantized),
        block_scale_interleave_sm100=closure(("unswizzled_sf",), interleaved))
    assert OPS["mxfp4_dequantize_host"].via_flashinfer(namespace, weight, scale, 32) is dequantized
    assert namespace.mxfp4_dequantize_host.calls == [(weight, scale, 32)]
    assert OPS["block_scale_interleave"].via_flashinfer(namespace, sf) is interleaved
    assert namespace.block_scale_interleave_sm100.calls == [(sf,)]


def flashinfers_experts_quantizer(parameters, silu):
    """FlashInfer's grouped or silu-and-mul quantizer (fp4_quantization.py, 0.7.4): fresh buffers, here filled
    with a pattern for the kernel's writes, returned as the permuted views FlashInfer returns (kept in
    ``.returned``, the buffers in ``.buffers``)."""

    def quantize(input, *_):
        experts, rows, columns = input.shape
        k = columns // 2 if silu else columns
        padded_k, padded_rows = (k // 16 + 3) // 4 * 4, (rows + 127) // 128 * 128
        values = (torch.arange(experts * rows * (k // 2)) % 251).to(U8).view(experts, rows, k // 2)
        scales = torch.arange(experts * padded_rows * (padded_k // 4), dtype=torch.int32).view(
            experts, padded_rows, padded_k // 4)
        scale_view = scales.view(torch.float8_e4m3fn).view(experts, padded_rows // 128, padded_k // 4, 32, 4, 4)
        function.buffers = (values, scales)
        function.returned = (values.permute(1, 2, 0), scale_view.permute(3, 4, 1, 5, 2, 0))
        return function.returned

    function = closure(parameters, quantize)
    return function


# Rows that pad to 256 and columns that do not: the returned buffers' shape depends on telling them apart, and
# K/16 = 32 scale columns are 8 int32 words, enough for a wrong word count to change the views.
ROWS, K = 130, 512
EXPERTS_CASES = [
    (False, ("input_tensor", "input_global_scale", "mask"), "scaled_fp4_grouped_quant_sm100"),
    (True, ("input", "mask", "global_scale"), "silu_and_mul_scaled_nvfp4_experts_quantize_sm100"),
]


@pytest.mark.parametrize("silu, parameters, function", EXPERTS_CASES, ids=["grouped", "silu_and_mul"])
@pytest.mark.parametrize("has_code", [True, False], ids=["with nvfp4_4over6_code", "an older release's, without"])
def test_experts_quantize_calls_flashinfers_quantizer_and_returns_the_buffers_under_its_views(
        silu, parameters, function, has_code):
    x = torch.zeros(2, ROWS, 2 * K if silu else K, dtype=BF16)
    global_scale, mask = torch.ones(2), torch.tensor([ROWS, 17], dtype=torch.int32)
    quantizer = flashinfers_experts_quantizer(parameters + (("nvfp4_4over6_code",) if has_code else ()), silu)
    namespace = types.SimpleNamespace(**{function: quantizer})
    values, scales = OPS["fp4_experts_quantize"].via_flashinfer(namespace, x, global_scale, mask, silu, 7)
    # The two FlashInfer-specific argument orders, and the code only where the closure takes it.
    ordered = (x, mask, global_scale) if silu else (x, global_scale, mask)
    assert quantizer.calls == [ordered + ((7,) if has_code else ())]
    # The op returns FlashInfer's buffers themselves, shaped and laid out as its fake says.
    fake_values, fake_scales = OPS["fp4_experts_quantize"].fake(x, global_scale, mask, silu, 7)
    for got, buffer, fake in zip((values, scales), quantizer.buffers, (fake_values, fake_scales)):
        assert (got.shape, got.stride(), got.dtype) == (fake.shape, fake.stride(), fake.dtype)
        assert (got.shape, got.data_ptr()) == (buffer.shape, buffer.data_ptr())
    # experts_views turns them back into exactly the views FlashInfer returned.
    for view, returned in zip(family_ops.experts_views(values, scales), quantizer.returned):
        assert described(view) == described(returned)


def described(view):
    return tuple(view.shape), view.stride(), view.dtype, view.data_ptr()


def test_silu_experts_quantize_checks_the_halved_columns_before_flashinfer_is_called():
    quantizer = flashinfers_experts_quantizer(EXPERTS_CASES[1][1], silu=True)
    namespace = types.SimpleNamespace(silu_and_mul_scaled_nvfp4_experts_quantize_sm100=quantizer)
    x = torch.zeros(2, 4, 48, dtype=BF16)  # 24 columns after silu_and_mul: not a multiple of 16
    with pytest.raises(InvalidArgumentError) as refused:
        OPS["fp4_experts_quantize"].via_flashinfer(namespace, x, torch.ones(2), torch.tensor([4, 4], dtype=torch.int32), True, 0)
    assert str(refused.value) == ("silu_and_mul_scaled_nvfp4_experts_quantize: the last dimension (24) must be a "
                                  "multiple of 16")
    assert quantizer.calls == []


# mm_fp4 -------------------------------------------------------------------------------------------------------
MM_FP4 = ("a", "b", "a_descale", "b_descale", "alpha", "out_dtype", "out", "block_size", "use_8x4_sf_layout",
          "backend", "use_nvfp4")


def flashinfers_mm_fp4(has_enable_pdl):
    """FlashInfer's public mm_fp4 (its 0.7.4 parameters, or an older release's without enable_pdl): records
    each call's arguments and returns an [M, N] product."""
    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=inspect.Parameter.empty if position < 4 else None)  # defaults from alpha on
                  for position, name in enumerate(MM_FP4 + (("enable_pdl",) if has_enable_pdl else ()))]
    signature = inspect.Signature(parameters)
    calls = []

    def mm_fp4(*arguments, **keywords):
        signature.bind(*arguments, **keywords)
        calls.append((arguments, keywords))
        return mm_fp4.product

    mm_fp4.__signature__, mm_fp4.calls, mm_fp4.product = signature, calls, torch.zeros(2, 3, dtype=BF16)
    return mm_fp4


OPERANDS = tuple(Argument(name) for name in ("a", "b", "a_descale", "b_descale", "alpha"))
# Every value differs from FlashInfer's default and from None, so a dropped or emptied one shows.
SETTINGS = dict(out_dtype=torch.float16, block_size=32, use_8x4_sf_layout=True, backend="cutlass", use_nvfp4=False)


@pytest.mark.parametrize("has_enable_pdl, enable_pdl, passed", [
    (True, True, {"enable_pdl": True}),
    (True, False, {"enable_pdl": False}),
    (True, None, {}),  # not asked for: FlashInfer's default
    (False, True, {}),  # a release without the parameter
], ids=["pdl-on", "pdl-off", "pdl-unset", "older-release"])
def test_mm_fp4_calls_flashinfers_own_mm_fp4_with_every_setting_by_name(has_enable_pdl, enable_pdl, passed):
    mm_fp4 = flashinfers_mm_fp4(has_enable_pdl)
    a, b, a_descale, b_descale, alpha = OPERANDS
    with devices.overridden(mm_fp4=mm_fp4):
        got = OPS["mm_fp4"].via_flashinfer(MODULE_0, a, b, a_descale, b_descale, alpha, *SETTINGS.values(),
                                            enable_pdl)
    assert got is mm_fp4.product
    assert mm_fp4.calls == [((a, b, a_descale, b_descale), dict(alpha=alpha, **SETTINGS, **passed))]


def test_mm_fp4_says_the_shim_is_not_applied_when_flashinfers_mm_fp4_was_not_kept():
    with devices.overridden(mm_fp4=None):
        with pytest.raises(ShimError) as missing:
            OPS["mm_fp4"].via_flashinfer(MODULE_0, *OPERANDS, *SETTINGS.values(), True)
    assert str(missing.value) == "fp4_dynamo_shim: mm_fp4 is not available (the shim is not applied)"


@pytest.mark.parametrize("a_shape, b_shape, said", [
    ((1, 2, 4), (4, 3), "mm_fp4: a and b must be 2-D, got (1, 2, 4) and (4, 3)"),
    ((2, 4), (4, 3, 1), "mm_fp4: a and b must be 2-D, got (2, 4) and (4, 3, 1)"),
    ((2, 4), (8, 3), "mm_fp4: a (2, 4) and b (8, 3) do not multiply (b is the transpose of an [N, K/2] packed weight)"),
])
def test_mm_fp4s_fake_refuses_operands_that_do_not_multiply_in_words_that_show_them(a_shape, b_shape, said):
    with pytest.raises(InvalidArgumentError) as refused:
        OPS["mm_fp4"].fake(torch.zeros(a_shape, dtype=U8), torch.zeros(b_shape, dtype=U8), None, None, None,
                                BF16, 16, False, "auto", True, None)
    assert str(refused.value) == said


def test_mm_fp4s_fake_gives_an_m_by_n_product_of_the_asked_dtype():
    product = OPS["mm_fp4"].fake(torch.zeros(2, 4, dtype=U8), torch.zeros(4, 3, dtype=U8), None, None, None,
                                      torch.float16, 16, False, "auto", True, None)
    assert (product.shape, product.dtype) == ((2, 3), torch.float16)
