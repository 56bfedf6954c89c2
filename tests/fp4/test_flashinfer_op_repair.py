"""FlashInfer's torch.ops.flashinfer.fp4_quantize as the shim repairs it, case by case: what the repair's kernel
hands the launch, the repair and its log line, what status() says per release, and a FlashInfer without the op.

The shim builds the op's kernel when it is applied (at import), so the op that test_flashinfers_own_fp4_op_repaired.py calls
through the dispatcher was built before any test ran. Here the shim is applied again in each test, so the op is
repaired, and its kernel built, at test time: what a change to how it is built does shows here. The installed FlashInfer (0.7.4) registers the op, so the repair runs on FlashInfer's own
op; three things are stood in, each because the installed release or this CPU machine lacks it:

- FlashInfer's JIT entry (it needs a GPU): a recorder of the scalars each launch gets, in front of the CPU
  reference, set with ``devices.overridden``. The op's kernel and FlashInfer's function (the shim's replacement)
  go through the same recorder, so the test compares what each hands the launch, and the reference's bytes.
  Its limits: the bytes are the reference's, not the GPU kernel's; PDL, streams and the real entry's argument
  handling are tests/gpu's (test_gpu_*.py, run on an H200).
- FlashInfer 0.6.12's FP4 module (0.6.12 to 0.7.0.post1: the op has no ``nvfp4_4over6_code``, the function no
  ``nvfp4_4over6``): an empty namespace, as the kernel only asks the module for ``nvfp4_4over6_from_code``,
  which 0.6.12's has not (read off its wheel) and 0.7.4's has. It stands in for that attribute only: the
  installed release's target row and arithmetic stay, so it cannot show 0.6.12's bytes.
- a FlashInfer without the op (before 0.6.12): ``torch.ops.flashinfer`` replaced, for one test, by a namespace
  of torch.ops that holds no op, since the installed release's op cannot be unregistered from the dispatcher.
  Only ``flashinfer_has_op``'s lookup sees it; the dispatcher still has FlashInfer's registrations.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import types

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim.fp4 import devices, flashinfer_op, quantize_op, replacement

from nvfp4_inputs import nvfp4_input

pytestmark = pytest.mark.skipif(not flashinfer_op.flashinfer_has_op(),
                                reason="this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")

utils = pytest.importorskip("flashinfer.quantization.nvfp4_quantization_utils", reason="no 4over6 (before 0.7.1)")
if not hasattr(utils, "nvfp4_4over6_from_code"):
    pytest.skip("this FlashInfer's op has no nvfp4_4over6_code (before 0.7.1)", allow_module_level=True)

#: A 4over6 recipe with every bit of its code set (e4m3_max 256, MSE, fast math): code 23.
RECIPE = utils.NVFP44Over6Config(e4m3_max=256, err_mode="MSE", err_use_fast_math=True)
CODE = utils.nvfp4_4over6_code(RECIPE)
FROM_ENVIRONMENT = "ignore:The FLASHINFER_NVFP4_4OVER6:FutureWarning"
POSITIONAL = "repaired while applied (its body passes enable_pdl as is_global_scale_inversed; its fake gives " \
             "contiguous strides for column-major input)"
KEYWORD = "repaired while applied (its fake gives contiguous strides for column-major input)"


#: FlashInfer's op, called as users and SGLang call it (the dispatcher hands the repaired kernel its arguments).
OP = torch.ops.flashinfer.fp4_quantize if flashinfer_op.flashinfer_has_op() else None


def installed():
    """FlashInfer's FP4 module and the shim's 4over6 recipe handling for it, as ``apply()`` passes them."""
    function = flashinfer.fp4_quantize.__wrapped__
    module = sys.modules[function.__module__]
    return module, replacement.recipe_for(function, module)


@pytest.fixture
def launches(device_state):
    """The shim applied again now (FlashInfer's op repaired in this test); then CPU launches go through a recorder
    of ``(input shape, scalars)`` to the reference (see the docstring)."""
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
    reference = devices.STATE.launchers[-1]
    calls = []

    def recording(input, global_scale, out_val, out_sf, *scalars):
        calls.append((tuple(input.shape), [(type(value).__name__, value) for value in scalars]))
        reference(input, global_scale, out_val, out_sf, *scalars)

    device_state(launchers={**devices.STATE.launchers, -1: recording})
    return calls


def same(got, want):
    return all(g.shape == w.shape and g.stride() == w.stride() and torch.equal(g, w) for g, w in zip(got, want))


def both(launches, op_call, function_call):
    """Run the op's kernel and FlashInfer's function; (what each returned and handed its one launch)."""
    del launches[:]
    got = op_call()
    op_launches = list(launches)
    del launches[:]
    want = function_call()
    assert len(op_launches) == 1 and len(launches) == 1, (op_launches, launches)
    return got, want, op_launches[0], launches[0]


# (id, layout, the op's arguments after (input, global_scale) or None for none, FlashInfer's function's keywords,
#  environment: FLASHINFER_NVFP4_4OVER6)
CASES = [
    ("defaults", "row-major", None, {}, None),
    ("all positional", "row-major", (16, False, True, False, None, -1), {}, None),
    ("enable_pdl", "row-major", (16, False, True, False, True, -1), {"enable_pdl": True}, None),
    ("enable_pdl off", "row-major", (16, False, True, False, False, -1), {"enable_pdl": False}, None),
    ("8x4 scale factors", "row-major", (16, False, True, True, None, -1), {"is_sf_8x4_layout": True}, None),
    ("linear scale factors", "row-major", (16, False, False, False, None, -1), {"is_sf_swizzled_layout": False}, None),
    ("mxfp4", "row-major", (32, True, True, False, None, -1), {"sf_vec_size": 32, "sf_use_ue8m0": True}, None),
    ("column-major", "column-major", (16, False, True, False, None, -1), {}, None),
    ("3-D", "3-D", (16, False, True, False, None, -1), {}, None),
    ("4over6 code", "row-major", (16, False, True, False, None, CODE), {"nvfp4_4over6": RECIPE}, None),
    ("4over6 off, environment on", "row-major", (16, False, True, False, None, 0), {"nvfp4_4over6": None}, "1"),
    ("4over6 from the environment", "row-major", (16, False, True, False, None, -1), {}, "1"),
    ("mxfp4, environment on", "row-major", (32, True, True, False, None, -1), {"sf_vec_size": 32, "sf_use_ue8m0": True},
     "1"),
]


@pytest.mark.filterwarnings(FROM_ENVIRONMENT)
@pytest.mark.parametrize("layout, arguments, keywords, environment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_ops_kernel_hands_the_launch_what_flashinfers_function_does(
        launches, monkeypatch, layout, arguments, keywords, environment):
    """The kernel the repair registers, built now, called as the dispatcher calls it (positionally) against
    FlashInfer's function with the same meaning: same outputs (shape, strides, bytes), same launch scalars."""
    if environment is not None:
        monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", environment)
    x, scale = nvfp4_input(layout=layout)
    if keywords.get("sf_use_ue8m0"):
        scale = None
    got, want, op_launch, function_launch = both(
        launches, lambda: OP(x, scale, *(arguments or ())), lambda: flashinfer.fp4_quantize(x, scale, **keywords))
    assert same(got, want)
    assert op_launch == function_launch


def test_the_op_takes_keywords_too(launches):
    x, scale = nvfp4_input()
    got, want, op_launch, function_launch = both(
        launches,
        lambda: OP(input=x, global_scale=scale, is_sf_8x4_layout=True, enable_pdl=True, nvfp4_4over6_code=CODE),
        lambda: flashinfer.fp4_quantize(x, scale, is_sf_8x4_layout=True, enable_pdl=True, nvfp4_4over6=RECIPE))
    assert same(got, want)
    assert op_launch == function_launch


# (id, input dtype, the op's arguments after (input, global_scale), the function's keywords)
WRONG_CALLS = [
    ("4over6 with ue8m0", torch.bfloat16, (16, True, True, False, None, CODE), {"sf_use_ue8m0": True,
                                                                                "nvfp4_4over6": RECIPE}),
    ("4over6 with mxfp4", torch.bfloat16, (32, True, True, False, None, CODE), {"sf_vec_size": 32, "sf_use_ue8m0": True,
                                                                                "nvfp4_4over6": RECIPE}),
    ("4over6 with fp8 input", torch.float8_e4m3fn, (16, False, True, False, None, CODE), {"nvfp4_4over6": RECIPE}),
]


@pytest.mark.parametrize("dtype, arguments, keywords", [c[1:] for c in WRONG_CALLS], ids=[c[0] for c in WRONG_CALLS])
def test_the_ops_kernel_refuses_a_4over6_code_where_flashinfers_function_refuses_the_recipe(
        launches, dtype, arguments, keywords):
    x, scale = nvfp4_input()
    x = x.to(dtype)
    with pytest.raises(ValueError) as refused_by_function:
        flashinfer.fp4_quantize(x, scale, **keywords)
    with pytest.raises(ValueError) as refused_by_op:
        OP(x, scale, *arguments)
    assert (type(refused_by_op.value), str(refused_by_op.value)) == \
           (type(refused_by_function.value), str(refused_by_function.value))
    assert launches == []


@pytest.mark.parametrize("enable_pdl", [None, False, True])
@pytest.mark.parametrize("is_sf_8x4_layout", [False, True])
def test_a_kernel_for_an_op_without_a_4over6_code_launches_standard_nvfp4(launches, enable_pdl, is_sf_8x4_layout):
    """0.6.12 to 0.7.0.post1: the op's seven parameters, no recipe (FlashInfer 0.6.12's module stood in: see the
    docstring); the kernel hands the launch code 0, as FlashInfer's function with ``nvfp4_4over6=None``. No public
    path builds a kernel for another release's module, so it is built here from the repair's own builder."""
    kernel = flashinfer_op._make_kernel(types.SimpleNamespace(), None)
    x, scale = nvfp4_input()
    got, want, op_launch, function_launch = both(
        launches, lambda: kernel(x, scale, 16, False, True, is_sf_8x4_layout, enable_pdl),
        lambda: flashinfer.fp4_quantize(x, scale, is_sf_8x4_layout=is_sf_8x4_layout, enable_pdl=enable_pdl,
                                        nvfp4_4over6=None))
    assert same(got, want)
    assert op_launch == function_launch


# The repair, through apply() ------------------------------------------------------------------------------------
def test_applying_repairs_the_op_with_a_kernel_and_fake_built_then(caplog):
    """``revert()`` then ``apply()``: the repair runs now, logs one line, and the op follows its own 4over6 code
    and gives the function's strides under fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fp4_dynamo_shim.revert()
    with caplog.at_level(logging.INFO, logger="fp4_dynamo_shim"):
        assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
    repaired = [r for r in caplog.records if r.name == "fp4_dynamo_shim.fp4.flashinfer_op"]
    assert [r.getMessage() for r in repaired] == [
        "fp4_dynamo_shim: torch.ops.flashinfer::fp4_quantize repaired "
        f"({quantize_op.active_target().flashinfer_op} body, contiguous fake)"]
    assert fp4_dynamo_shim.status()["family"]["torch.ops.flashinfer.fp4_quantize"] == KEYWORD

    x, scale = nvfp4_input()
    assert same(torch.ops.flashinfer.fp4_quantize(x, scale, 16, False, True, False, None, CODE),
                flashinfer.fp4_quantize(x, scale, nvfp4_4over6=RECIPE))
    column_major, scale = nvfp4_input(layout="column-major")
    want = [(o.shape, o.stride(), o.dtype) for o in flashinfer.fp4_quantize(column_major, scale)]
    with FakeTensorMode() as mode:
        outputs = torch.ops.flashinfer.fp4_quantize(mode.from_tensor(column_major), mode.from_tensor(scale),
                                                    16, False, True, False, None, -1)
        assert [(o.shape, o.stride(), o.dtype) for o in outputs] == want


def test_revert_gives_flashinfers_op_its_own_fake_back():
    """The repair's fake lives in the shim's fragment: after ``revert()`` the op has FlashInfer's fake again,
    with its fault (contiguous outputs for column-major input, every release 0.6.12 to 0.7.4). Registered any
    other way (``torch.library.register_fake`` on an op made by ``custom_op``), it would replace FlashInfer's
    fake for good."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fake_outputs(x, scale):
        with FakeTensorMode() as mode:
            outputs = torch.ops.flashinfer.fp4_quantize(mode.from_tensor(x), mode.from_tensor(scale),
                                                        16, False, True, False, None, -1)
            return [(o.shape, o.stride()) for o in outputs]

    x, scale = nvfp4_input(layout="column-major")
    functions = [(o.shape, o.stride()) for o in flashinfer.fp4_quantize(x, scale)]
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
    assert fake_outputs(x, scale) == functions
    fp4_dynamo_shim.revert()
    flashinfers = fake_outputs(x, scale)
    assert [shape for shape, _ in flashinfers] == [shape for shape, _ in functions]
    assert [stride for _, stride in flashinfers] == [torch.empty(shape).stride() for shape, _ in functions]


@pytest.mark.filterwarnings(FROM_ENVIRONMENT)
def test_the_repaired_op_reads_the_environment_only_for_code_minus_one(monkeypatch):
    fp4_dynamo_shim.revert()
    assert fp4_dynamo_shim.apply(), fp4_dynamo_shim.status()["problem"]
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
    x, scale = nvfp4_input()
    op = torch.ops.flashinfer.fp4_quantize
    assert same(op(x, scale, 16, False, True, False, None, -1), flashinfer.fp4_quantize(x, scale))
    assert same(op(x, scale, 16, False, True, False, None, 0), flashinfer.fp4_quantize(x, scale, nvfp4_4over6=None))
    assert not same(op(x, scale, 16, False, True, False, None, 0), op(x, scale, 16, False, True, False, None, -1))


def test_a_release_row_without_the_op_repairs_nothing():
    target = dataclasses.replace(quantize_op.active_target(), flashinfer_op=None)
    dispatch_table = torch._C._dispatch_dump(flashinfer_op.QUALIFIED)
    restore = flashinfer_op.repair(target, *installed())
    try:
        assert restore is None
        assert torch._C._dispatch_dump(flashinfer_op.QUALIFIED) == dispatch_table
    finally:
        if restore is not None:
            restore()
    assert flashinfer_op.describe(target) is None


def test_a_flashinfer_without_the_op_is_neither_repaired_nor_described(monkeypatch):
    """Releases before 0.6.12 (torch.ops.flashinfer stood in: see the docstring), with a row that names the op."""
    monkeypatch.setattr(torch.ops, "flashinfer", torch._ops._OpNamespace("fp4_dynamo_shim_tests_no_ops"))
    assert not flashinfer_op.flashinfer_has_op()
    target = quantize_op.active_target()
    assert target.flashinfer_op is not None
    restore = flashinfer_op.repair(target, *installed())
    if restore is not None:
        restore()
    assert restore is None
    assert flashinfer_op.describe(target) is None


@pytest.mark.parametrize("body, description", [("positional", POSITIONAL), ("keyword", KEYWORD)])
def test_status_says_which_faults_the_repair_fixes(body, description):
    target = dataclasses.replace(quantize_op.active_target(), flashinfer_op=body)
    assert flashinfer_op.describe(target) == description
