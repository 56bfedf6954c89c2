"""The op's own refusals, word for word, and what its kernel choice and global-scale handling hand the launch.

``fp4_dynamo_shim::fp4_quantize`` and the body its fake and kernels share (``quantize_op.quantize``), on CPU
tensors. Each refusal is pinned by exception class and full message: callers match on them, and a message that
names the wrong argument, device or size sends them the wrong way.

Some branches run only on a GPU (a scale on another GPU than the input, a GPU without a loaded kernel). They
only compare device indices, convert and route, which stand-ins show on a CPU:

- ``OnGpu``: a CPU tensor (a ``torch.Tensor`` subclass, so the op's body takes it) that answers ``device``,
  ``get_device()``, ``is_cpu`` and ``is_cuda`` as a tensor on ``cuda:<index>`` does; its ``to`` records the
  conversion asked for and does only the dtype part, returning a plain CPU tensor (there is no CUDA here). The
  dispatcher never sees it: it goes to ``quantize`` (with a recording launch) or to the op's kernel function
  directly. Real CUDA tensors, and what a real launch does with them, are for tests/gpu (test_gpu_battery.py's
  global-scale cases);
- the launch functions ``apply()`` loaded per device, replaced through ``devices.overridden`` (the
  ``device_state`` fixture, put back after each test) by recorders of what they were handed;
- other FlashInfer releases, as their rows of the targets table (the ``target_row`` fixture).
"""

from __future__ import annotations

import types

import numpy
import pytest
import torch

from _fp4_dynamo_shim.errors import InvalidArgumentError, ShimError
from _fp4_dynamo_shim.fp4 import devices
from _fp4_dynamo_shim.fp4 import quantize_op
from _fp4_dynamo_shim.fp4 import fp4_releases

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
CONVERTS = fp4_releases.target_for("0.7.4")  # converts the scale to float32 on the input's device; one per row allowed
VALIDATES = fp4_releases.target_for("0.6.12")  # the scale must already be float32, one element, on the input's device
NVFP4_LINEAR = (16, False, False, False, False, None, 0)  # sf_vec_size .. nvfp4_4over6_code, linear layout
MXFP4_LINEAR = (32, True, False, False, False, None, 0)


class OnGpu(torch.Tensor):
    """CPU data that the shim's device screens and routing see on ``cuda:<index>`` (see the module docstring)."""

    index = 0
    conversions: list = []

    @property
    def is_cpu(self):
        return False

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return self.index

    @property
    def device(self):
        return torch.device("cuda", self.index)

    def to(self, *arguments, **keywords):
        type(self).conversions.append((arguments, keywords))
        dtype, device = keywords.get("dtype"), keywords.get("device")
        if dtype in (None, self.dtype) and device in (None, self.device):
            return self  # as Tensor.to: nothing to change, the tensor itself
        return self.as_subclass(torch.Tensor).to(dtype or self.dtype)  # the device part needs CUDA


def on_gpu(tensor, index):
    """``tensor`` as seen on ``cuda:index``, with its own record of conversions."""
    return tensor.as_subclass(type(f"OnCuda{index}", (OnGpu,), {"index": index, "conversions": []}))


def recording_launch(calls):
    def launch(*arguments):
        calls.append(arguments)

    return launch


def bf16(*shape):
    torch.manual_seed(sum(shape))
    return torch.randn(shape).to(BF16)


def refusal(error_class, call):
    """The exception ``call`` raises, which must be exactly ``error_class``; returns its message."""
    with pytest.raises(Exception) as raised:
        call()
    assert type(raised.value) is error_class, repr(raised.value)
    return str(raised.value)


# --- not applied, unsupported sf_vec_size --------------------------------------------------------------------

def test_a_call_before_apply_says_to_apply_first(device_state):
    device_state(target=None)
    message = refusal(ShimError, lambda: quantize_op.fp4_quantize_op(bf16(4, 32), torch.tensor([1.0]), *NVFP4_LINEAR))
    assert message == "fp4_dynamo_shim is not applied: call fp4_dynamo_shim.apply() first"
    assert refusal(ShimError, lambda: quantize_op.current_recipe(0)) == message


def test_a_call_in_a_process_that_never_applied_says_to_apply_first_not_which_device(device_state):
    """Never applied: no target and no launcher for any device, so the op's kernel finds none for the input's."""
    device_state(target=None, launchers={})
    message = refusal(ShimError, lambda: quantize_op.fp4_quantize_op(bf16(4, 32), torch.tensor([1.0]), *NVFP4_LINEAR))
    assert message == "fp4_dynamo_shim is not applied: call fp4_dynamo_shim.apply() first"


def test_an_sf_vec_size_other_than_16_or_32_is_not_implemented():
    message = refusal(NotImplementedError, lambda: quantize_op.fp4_quantize_op(
        bf16(4, 32), torch.tensor([1.0]), 8, False, False, False, False, None, 0))
    assert message == "sf_vec_size can only be 16 or 32"


# --- non-tensor arguments --------------------------------------------------------------------------------------
# quantize() itself: the op's schema refuses non-tensors before its body runs; the eager replacement's generated
# path hands them to this body.

NON_TENSOR_INPUTS = [([[1.0] * 32] * 4, "list"), (numpy.ones((4, 32), numpy.float16), "numpy.ndarray")]


@pytest.mark.parametrize("value, kind", NON_TENSOR_INPUTS, ids=["builtin", "numpy"])
def test_a_non_tensor_input_is_named_with_its_type(value, kind):
    message = refusal(InvalidArgumentError, lambda: quantize_op.quantize(value, torch.tensor([1.0]), *NVFP4_LINEAR, None))
    assert message == f"fp4_quantize: input must be a torch.Tensor, got {kind}"


@pytest.mark.parametrize("value, kind", [(3.0, "float"), (numpy.array([3.0], numpy.float32), "numpy.ndarray")],
                         ids=["builtin", "numpy"])
def test_a_non_tensor_global_scale_is_named_with_its_type_and_what_it_must_be(value, kind):
    message = refusal(InvalidArgumentError, lambda: quantize_op.quantize(bf16(4, 32), value, *NVFP4_LINEAR, None))
    assert message == ("fp4_quantize: global_scale must be a torch.Tensor (float32, one element, on the input's "
                       f"device), got {kind}")


# --- _problem's refusals, through the op -----------------------------------------------------------------------

def test_nvfp4_without_a_global_scale_is_refused():
    message = refusal(InvalidArgumentError, lambda: quantize_op.fp4_quantize_op(bf16(4, 32), None, *NVFP4_LINEAR))
    assert message == "global_scale is required when sf_use_ue8m0 is false (NVFP4)"


def test_a_last_dimension_off_the_block_size_is_named_with_both_numbers():
    message = refusal(InvalidArgumentError, lambda: quantize_op.fp4_quantize_op(bf16(2, 3, 40), torch.tensor([1.0]),
                                                                      *NVFP4_LINEAR))
    assert message == "fp4_quantize: the last dimension (40) must be a multiple of sf_vec_size (16)"
    # MXFP4 with its valid sf_vec_size 32: the size complaint, not one about sf_vec_size.
    message = refusal(InvalidArgumentError, lambda: quantize_op.fp4_quantize_op(bf16(4, 48), None, *MXFP4_LINEAR))
    assert message == "fp4_quantize: the last dimension (48) must be a multiple of sf_vec_size (32)"


@pytest.mark.parametrize("dtype, recipe", [(BF16, MXFP4_LINEAR), (torch.float8_e4m3fn, NVFP4_LINEAR)],
                         ids=["mxfp4", "nvfp4-e4m3-input"])
def test_four_over_six_outside_nvfp4_with_16_bit_input_is_refused(dtype, recipe, target_row):
    target_row(CONVERTS)
    with_code_1 = (*recipe[:-1], 1)
    message = refusal(InvalidArgumentError, lambda: quantize_op.fp4_quantize_op(bf16(4, 32).to(dtype), torch.tensor([1.0]),
                                                                      *with_code_1))
    assert message == "nvfp4_4over6 applies to NVFP4 (sf_vec_size=16) with fp16 or bf16 input only"


def test_the_four_over_six_code_reaches_the_reference_recipe(target_row):
    # Values from test_kernel_modes.py: x0 = 4, g = 1; 6-based scale byte 0x33, code 1 (4over6, MAE) picks 0x38.
    target_row(CONVERTS)
    x = torch.zeros(1, 16, dtype=BF16)
    x[0, 0] = 4.0
    _, sf = quantize_op.fp4_quantize_op(x, torch.tensor([1.0]), *NVFP4_LINEAR)
    assert sf.tolist() == [[0x33]]
    _, sf = quantize_op.fp4_quantize_op(x, torch.tensor([1.0]), *NVFP4_LINEAR[:-1], 1)
    assert sf.tolist() == [[0x38]]


# --- the kernel: which launch, and with what ---------------------------------------------------------------------

def test_mxfp4_without_a_global_scale_runs_the_reference_on_cpu():
    x = bf16(4, 64)
    packed, sf = quantize_op.fp4_quantize_op(x, None, *MXFP4_LINEAR)
    expected_packed, expected_sf = quantize_op.quantize(x, None, *MXFP4_LINEAR, quantize_op.launch_reference)
    assert torch.equal(packed, expected_packed) and torch.equal(sf, expected_sf)
    assert packed.abs().sum() > 0


def test_a_meta_input_launches_nothing_and_gets_meta_outputs(device_state):
    calls = []
    device_state(launchers={**devices.STATE.launchers, -1: recording_launch(calls)})
    packed, sf = quantize_op.fp4_quantize_op(torch.empty(4, 32, dtype=BF16, device="meta"),
                                     torch.empty(1, device="meta"), *NVFP4_LINEAR)
    assert (packed.device.type, sf.device.type, tuple(packed.shape), tuple(sf.shape)) == ("meta", "meta", (4, 16),
                                                                                          (4, 2))
    assert calls == []
    assert quantize_op.launch_for(torch.empty(2, 32, device="meta")) is None


def test_a_gpu_input_launches_its_own_gpus_kernel(device_state):
    calls = []
    device_state(launchers={-1: devices.STATE.launchers[-1], 1: recording_launch(calls)})
    x, scale = on_gpu(bf16(4, 32), 1), on_gpu(torch.tensor([2.0]), 1)
    quantize_op._kernel(x, scale, *NVFP4_LINEAR)
    assert len(calls) == 1 and calls[0][0] is x and calls[0][1] is scale


def test_a_gpu_without_a_loaded_kernel_is_refused(device_state):
    device_state(launchers={-1: devices.STATE.launchers[-1], 0: recording_launch([])})
    x = on_gpu(bf16(4, 32), 1)
    message = refusal(ShimError, lambda: quantize_op._kernel(x, on_gpu(torch.tensor([2.0]), 1), *NVFP4_LINEAR))
    assert message == ("fp4_dynamo_shim: no FP4 kernel was loaded for cuda:1; it was not visible when the shim "
                       "was applied")


def test_an_input_neither_on_cuda_nor_cpu_is_refused():
    elsewhere = types.SimpleNamespace(is_cuda=False, is_cpu=False, is_meta=False, device=torch.device("xpu", 0))
    assert refusal(ShimError, lambda: quantize_op.launch_for(elsewhere)) == (
        "fp4_dynamo_shim: fp4_quantize runs on CUDA or CPU tensors, got xpu:0")


def test_unpadded_linear_scale_factors_are_returned_as_allocated(target_row):
    """Releases that allocate exactly M rows get the buffer itself, not a view of it (a view per call costs)."""
    target_row(CONVERTS)
    _, sf = quantize_op.fp4_quantize_op(bf16(5, 64), torch.tensor([1.0]), *NVFP4_LINEAR)
    assert sf.shape == (5, 4) and not sf._is_view()
    target_row(VALIDATES)
    _, sf = quantize_op.fp4_quantize_op(bf16(5, 64), torch.tensor([1.0]), *NVFP4_LINEAR)
    assert sf.shape == (5, 4) and sf._is_view()  # round_up(5, 16) rows allocated, sliced to 5


# --- the global scale --------------------------------------------------------------------------------------------

def test_a_converting_release_hands_the_launch_a_float32_scale(device_state, target_row):
    target_row(CONVERTS)
    calls = []
    device_state(launchers={**devices.STATE.launchers, -1: recording_launch(calls)})
    quantize_op.fp4_quantize_op(bf16(4, 32), torch.tensor([2.0], dtype=F64), *NVFP4_LINEAR)
    assert calls[0][1].dtype == F32 and calls[0][1].tolist() == [2.0]


def test_a_converting_release_moves_a_scale_on_another_gpu_to_the_inputs(target_row):
    target_row(CONVERTS)
    calls = []
    x, scale = on_gpu(bf16(4, 32), 1), on_gpu(torch.tensor([2.0], dtype=F64), 0)
    quantize_op.quantize(x, scale, *NVFP4_LINEAR, recording_launch(calls))
    assert type(scale).conversions == [((), {"device": torch.device("cuda", 1), "dtype": F32})]
    assert calls[0][1].dtype == F32


def test_a_validating_release_refuses_a_scale_that_is_not_float32(target_row):
    target_row(VALIDATES)
    message = refusal(InvalidArgumentError, lambda: quantize_op.fp4_quantize_op(bf16(4, 32), torch.tensor([2.0], dtype=F64),
                                                                      *NVFP4_LINEAR))
    assert message == "fp4_quantize: global_scale must be float32, got torch.float64"


@pytest.mark.parametrize("input_index", [1, None], ids=["input-on-cuda:1", "input-on-cpu"])
def test_a_validating_release_refuses_a_float32_scale_on_another_device(input_index, target_row):
    target_row(VALIDATES)
    x = bf16(4, 32) if input_index is None else on_gpu(bf16(4, 32), input_index)
    scale = on_gpu(torch.tensor([2.0]), 0)
    message = refusal(InvalidArgumentError, lambda: quantize_op.quantize(x, scale, *NVFP4_LINEAR, recording_launch([])))
    assert message == (f"fp4_quantize: global_scale is on cuda:0 but input is on {x.device}; every tensor argument "
                       "must be on the same device")
    assert type(scale).conversions == []


@pytest.mark.parametrize("target", [CONVERTS, VALIDATES], ids=["converting", "validating"])
@pytest.mark.parametrize("meta", ["scale", "input"])
def test_a_meta_tensor_with_a_real_one_is_refused_as_such(meta, target, target_row):
    target_row(target)
    on = {"scale": "meta", "input": "cpu"} if meta == "scale" else {"scale": "cpu", "input": "meta"}
    x, scale = torch.empty(4, 32, dtype=BF16, device=on["input"]), torch.ones(1, device=on["scale"])
    message = refusal(InvalidArgumentError, lambda: quantize_op.quantize(x, scale, *NVFP4_LINEAR, None))
    assert message == (f"fp4_quantize: global_scale is on {on['scale']} but input is on {on['input']}; "
                       "a meta tensor only goes with other meta tensors")


@pytest.mark.parametrize("target, allowed", [(CONVERTS, "1 or one per row"), (VALIDATES, "1")],
                         ids=["row-wise", "one"])
def test_a_scale_of_the_wrong_size_is_refused_with_the_sizes_the_release_takes(target, allowed, target_row):
    target_row(target)
    message = refusal(InvalidArgumentError, lambda: quantize_op.fp4_quantize_op(bf16(5, 32), torch.ones(3), *NVFP4_LINEAR))
    assert message == f"fp4_quantize: global_scale must have {allowed} element(s), got shape (3,)"


# --- check_devices, as the family ops call it ---------------------------------------------------------------------

def test_check_devices_skips_absent_tensors_and_compares_the_rest():
    cpu, meta = torch.ones(1), torch.empty(1, device="meta")
    message = refusal(InvalidArgumentError, lambda: quantize_op.check_devices("op", ("a", "b", "c"), (None, cpu, meta)))
    assert message == "op: c is on meta but b is on cpu; a meta tensor only goes with other meta tensors"
    quantize_op.check_devices("op", ("a", "b", "c"), (None, cpu, None))


def test_check_devices_tells_gpus_apart_and_lets_host_functions_mix_them():
    first, second = on_gpu(torch.ones(1), 0), on_gpu(torch.ones(1), 1)
    message = refusal(InvalidArgumentError, lambda: quantize_op.check_devices("op", ("a", "b"), (first, second)))
    assert message == "op: b is on cuda:1 but a is on cuda:0; every tensor argument must be on the same device"
    quantize_op.check_devices("op", ("a", "b"), (first, second), host=True)
    quantize_op.check_devices("op", ("a", "b"), (first, torch.ones(1)), host=True)
