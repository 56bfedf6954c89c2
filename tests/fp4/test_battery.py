"""Bad input: eager and fullgraph-compiled calls fail the same way, with a message that names the problem.

Dynamo wraps an exception raised while it traces (TorchRuntimeError, or Unsupported for
NotImplementedError); the wrapper's text must then carry the original class and message. Odd but
legal inputs must give identical results eagerly and compiled. The GPU twin of this file
(tests/gpu/test_gpu_battery.py) also compares against FlashInfer's own function on a real GPU.
"""

from __future__ import annotations

import inspect
import re

import flashinfer
import pytest
import torch

from battery import ALL_META_CASES, CALLERS, CASES, META_CASES, Case, assert_carries, caller_for
from helpers import installed_target
import stand_in_gpu
from fp4_dynamo_shim.errors import InvalidArgumentError, NotExpressibleError

#: Where a case is legal on releases that convert the global scale to float32 themselves (0.6.13+).
VALID_WHEN_CONVERTING = {"global_scale_int32"}
#: The exception class each failing case raises (InvalidArgumentError unless listed).
EXPECTED_CLASS = {"sf_vec_size_8": NotImplementedError, "sf_vec_size_64": NotImplementedError}


def expectation(case: Case):
    if case.problem is None or (case.name in VALID_WHEN_CONVERTING and installed_target().converts_global_scale):
        return None
    return EXPECTED_CLASS.get(case.name, InvalidArgumentError)


def call(function, case: Case):
    args, kwargs = case.build("cpu")
    return function(*args, **kwargs)


def compiled_quantize(*args, **kwargs):
    return flashinfer.fp4_quantize(*args, **kwargs)


def never_reached(graph_module, example_inputs):
    """A torch.compile backend for inputs the fake must reject while Dynamo traces: reaching it means the
    fake let the input through and the error would come only when the graph runs."""
    raise AssertionError("the graph reached the backend: the op's fake did not reject this input")


@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_eager_and_compiled_agree(case, backend):
    expected = expectation(case)
    compiled = torch.compile(compiled_quantize, fullgraph=True, backend=backend)
    if expected is None:
        eager_result = call(flashinfer.fp4_quantize, case)
        compiled_result = call(compiled, case)
        for got, want in zip(compiled_result, eager_result):
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
            assert torch.equal(got, want)
        return
    with pytest.raises(expected) as eager_error:
        call(flashinfer.fp4_quantize, case)
    assert case.problem.lower() in str(eager_error.value).lower()
    if "nvfp4_4over6" in inspect.signature(flashinfer.fp4_quantize).parameters:
        # 0.7.1+: the default 4over6 sentinel takes the replacement's general path; None takes its fast path.
        with pytest.raises(expected, match=re.escape(case.problem)):
            call(lambda *a, **k: flashinfer.fp4_quantize(*a, **k, nvfp4_4over6=None), case)
    if expected is InvalidArgumentError:  # what callers written against FlashInfer's kernel checks catch
        assert isinstance(eager_error.value, RuntimeError) and isinstance(eager_error.value, ValueError)
    with pytest.raises(Exception) as compiled_error:
        call(compiled, case)
    assert_carries(compiled_error.value, expected, case.problem)


@pytest.mark.parametrize("case", [c for c in CASES if c.problem], ids=lambda c: c.name)
def test_the_fake_rejects_bad_input_while_tracing(case):
    if expectation(case) is None:
        pytest.skip(f"{case.name} is legal in this release")
    with pytest.raises(Exception) as error:
        call(torch.compile(compiled_quantize, fullgraph=True, backend=never_reached), case)
    assert "reached the backend" not in str(error.value)
    assert_carries(error.value, expectation(case), case.problem)


def test_options_the_op_cannot_carry_fail_clearly_only_inside_compiled_regions():
    import inspect

    parameters = inspect.signature(flashinfer.fp4_quantize).parameters
    if "backend" not in parameters:
        pytest.skip("this FlashInfer's fp4_quantize has no backend parameter")
    x, scale = torch.randn(8, 64, dtype=torch.bfloat16), torch.tensor([1.0])
    compiled = torch.compile(lambda t, s: flashinfer.fp4_quantize(t, s, backend="not-a-backend"), fullgraph=True,
                             backend="eager")
    with pytest.raises(ValueError, match="not-a-backend"):  # eager: FlashInfer's own error
        flashinfer.fp4_quantize(x, scale, backend="not-a-backend")
    with pytest.raises(Exception) as error:
        compiled(x, scale)
    assert_carries(error.value, NotExpressibleError, "cannot run inside torch.compile")


def test_the_direct_path_gives_the_general_paths_result_or_error(device_state):
    """The replacement's direct path (the common call on a GPU with the kernel) must give every case the
    result or the error the general path gives. Stand-in: the GPU's JIT entry, which cannot run here; CPU
    tensors take the direct path with the reference quantizer behind an entry that takes the release's
    argument order, so a scalar in the wrong place shows up as different bytes."""
    entered = []
    extra = {"nvfp4_4over6": None} if "nvfp4_4over6" in inspect.signature(flashinfer.fp4_quantize).parameters else {}

    def outcome(case):
        args, kwargs = case.build("cpu")
        try:
            result = flashinfer.fp4_quantize(*args, **{**extra, **kwargs})
        except Exception as error:
            return type(error), str(error)
        return [(t.shape, t.stride(), t.dtype, t.tolist()) for t in result]

    general = {case.name: outcome(case) for case in CASES}
    assert not entered
    device_state(**stand_in_gpu.direct_path_on_cpu(stand_in_gpu.reference_entry(entered)))
    direct = {case.name: outcome(case) for case in CASES}
    assert entered, "no case took the direct path"
    # Names and a brief of each side only: pytest does not truncate explanations under CI=true, and a diff
    # of every case's bytes takes minutes there.
    differing = [name for name in general if direct[name] != general[name]]
    assert not differing, {name: (_brief(direct[name]), _brief(general[name])) for name in differing}


def _brief(outcome):
    if isinstance(outcome, tuple):  # (error class, message)
        return outcome
    return [(shape, stride, dtype, hash(repr(values))) for shape, stride, dtype, values in outcome]


# --- meta tensors (issue 19) -------------------------------------------------------------------------------

@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("case", META_CASES, ids=lambda c: c.name)
def test_a_meta_tensor_next_to_a_real_one_is_refused_on_every_path(case, caller):
    with pytest.raises(Exception) as error:
        call(caller_for(caller), case)
    assert_carries(error.value, InvalidArgumentError, case.problem)


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("case", ALL_META_CASES, ids=lambda c: c.name)
def test_meta_tensors_alone_give_meta_outputs_shaped_like_the_real_ones(case, caller):
    args, kwargs = case.build("cpu")
    real_args = [torch.ones_like(a, device="cpu") if isinstance(a, torch.Tensor) else a for a in args]  # strides kept
    real = flashinfer.fp4_quantize(*real_args, **kwargs)
    got = caller_for(caller)(*args, **kwargs)
    assert [(t.device.type, t.shape, t.stride(), t.dtype) for t in got] == \
        [("meta", t.shape, t.stride(), t.dtype) for t in real]
