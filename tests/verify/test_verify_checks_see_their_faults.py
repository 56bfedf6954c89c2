"""verify's checks in this process, on CPU, each handed the fault it exists to see: a graph break, a
recompilation, an undeclared write, a one-bit difference, an error FlashInfer does not raise, an op torch refused.
Each fault enters where a user's process would have it: FlashInfer's public functions, the launcher in the one
GPU-state record (``devices.overridden``), torch's own entries (``torch.compile``, ``torch.library``, Dynamo's
explain); the checks themselves run unchanged. What each check says when all is well, and the GPU branches,
are in test_verify_checks_on_cpu.py.
"""

from __future__ import annotations

import types

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim.verify import checks
from _fp4_dynamo_shim.fp4 import devices, flashinfer_op
from _fp4_dynamo_shim import lifecycle
from fp4_dynamo_shim.errors import NoFp4KernelError

import helpers
import stand_in_gpu


def replaced_family():
    return [n for n, s in fp4_dynamo_shim.status()["family"].items() if s.startswith("op-backed")]


def _skip_reason(check) -> str:
    with pytest.raises(checks.Skip) as skipped:
        check("cpu")
    return str(skipped.value)


def test_the_static_trace_check_fails_on_a_graph_break(monkeypatch):
    real = flashinfer.fp4_quantize

    def with_a_break(*args, **kwargs):
        torch._dynamo.graph_break()
        return real(*args, **kwargs)

    monkeypatch.setattr(flashinfer, "fp4_quantize", with_a_break)
    with pytest.raises(Exception, match="graph_break|Graph break"):
        checks.check_trace_static("cpu")


def test_the_dynamic_trace_check_fails_on_a_recompilation(monkeypatch):
    monkeypatch.setattr(torch._dynamo, "mark_dynamic", lambda tensor, dim: None)  # M stays static: 2 compilations
    with pytest.raises(AssertionError, match=r"2 compilations for M in \(2, 17, 300\); expected 1"):
        checks.check_trace_dynamic("cpu")


def test_the_opcheck_check_fails_when_the_kernel_writes_an_input_its_schema_does_not_let_it(device_state):
    """Fault, through the GPU-state seam: the CPU launcher (the op's kernel) also scales its global_scale in
    place, which the op's schema does not declare: torch's opcheck exists to see that, and so the check fails."""
    reference = devices.STATE.launchers[-1]

    def writes_its_scale(input, global_scale, *arguments):
        reference(input, global_scale, *arguments)
        global_scale.mul_(2)

    device_state(launchers={**devices.STATE.launchers, -1: writes_its_scale})
    with pytest.raises(Exception, match="mutat"):
        checks.check_opcheck("cpu")


def test_the_flashinfer_op_check_fails_on_wrong_strides_and_on_wrong_values(monkeypatch, device_state):
    if not flashinfer_op.flashinfer_has_op():
        pytest.skip("this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")
    quantize = flashinfer.fp4_quantize  # the function the check compares FlashInfer's op with
    monkeypatch.setattr(flashinfer, "fp4_quantize", lambda x, s: tuple(t.contiguous() for t in quantize(x, s)))
    with pytest.raises(AssertionError, match=r"column-major: compiled op gives \(32, 256\)/\(1, 32\), the function "
                                             r"\(32, 256\)/\(256, 1\)"):
        checks.check_flashinfer_op("cpu")
    monkeypatch.undo()

    _flip_one_output_bit(device_state, at_launch=2)  # 1: the warm-up; 2: the compiled op on row-major input
    with pytest.raises(AssertionError, match="row-major: the compiled op's values differ from flashinfer.fp4_quantize's"):
        checks.check_flashinfer_op("cpu")


#: 400 characters, each prefix distinct: how much of an error the family check quotes shows.
LONG = "".join(f"{i:03d}," for i in range(100))


def test_the_family_check_fails_on_an_error_flashinfer_does_not_raise_quoting_200_characters(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError(LONG)

    monkeypatch.setattr(flashinfer, "mm_fp4", broken)
    with pytest.raises(AssertionError) as failed:
        checks.check_family("cpu")
    assert str(failed.value) == f"mm_fp4: ValueError: {LONG[:200]} (FlashInfer's own function does not raise this)"


def test_the_family_check_accepts_flashinfers_own_error_quoting_80_characters_and_the_shims_refusal(monkeypatch):
    """FlashInfer's own block_scale_interleave, put back in the shim's place, fails on CPU at its device query;
    stand-in: that query says more than 80 characters (FlashInfer's own words are shorter), so the quote's
    length shows."""
    def device_query(device):
        raise ValueError(LONG)

    monkeypatch.setattr(stand_in_gpu.fp4_module(), "get_compute_capability", device_query)
    original = lifecycle.original_function("block_scale_interleave")

    def refuse(*args, **kwargs):
        raise NoFp4KernelError("no FP4 kernel")

    monkeypatch.setattr(flashinfer, "block_scale_interleave", original)
    monkeypatch.setattr(flashinfer, "mxfp4_quantize", refuse)
    detail = checks.check_family("cpu")
    others = [n for n in replaced_family() if n not in ("block_scale_interleave", "mxfp4_quantize")]
    assert detail == (f"{len(replaced_family())} functions called once on cpu: result: {', '.join(others)}; "
                      "refused (no FP4 kernel): mxfp4_quantize; "
                      f"FlashInfer's own error: block_scale_interleave: ValueError: {LONG[:80]}")


def test_the_family_check_passes_each_example_its_keyword_arguments(monkeypatch):
    """mm_fp4's example names its output dtype; the function must be called with it (the real mm_fp4 defaults
    to the same dtype, so only a recording shows it was passed)."""
    mm_fp4, called = flashinfer.mm_fp4, []

    def recording(*args, **kwargs):
        called.append(kwargs)
        return mm_fp4(*args, **kwargs)

    monkeypatch.setattr(flashinfer, "mm_fp4", recording)
    checks.check_family("cpu")
    assert called == [{"out_dtype": torch.bfloat16}]


def test_verifys_compiled_vs_eager_check_fails_on_a_one_bit_difference(device_state):
    _flip_one_output_bit(device_state, at_launch=1)  # the compiled call on M=1
    with pytest.raises(AssertionError, match="^M=1: compiled output differs from eager$"):
        checks.check_compiled_matches_eager("cpu")
    torch._dynamo.reset()  # the kernel is right from then on: so is the check
    assert "equals eager bitwise" in checks.check_compiled_matches_eager("cpu")


def _flip_one_output_bit(device_state, at_launch: int):
    """Fault injection through the GPU-state seam: the CPU launcher (what eager calls and compiled regions run
    on CPU tensors) flips one bit of its scale factors on its ``at_launch``-th launch (from 1) only, as a
    kernel that is wrong now and then would: one side of a comparison differs."""
    reference, launches = devices.STATE.launchers[-1], []

    def flipping(input, *arguments):
        reference(input, *arguments)
        launches.append(input.shape)
        if len(launches) == at_launch:
            arguments[1].view(-1)[0] ^= 1

    device_state(launchers={**devices.STATE.launchers, -1: flipping})
    torch._dynamo.reset()


def test_the_declared_ops_check_names_every_op_torch_refused(monkeypatch, applied_with):
    helpers.torch_refuses_declared_ops(monkeypatch, ops=("layernorm", "rmsnorm_quant"))
    assert applied_with(FLASHINFER_OPS="sglang")["applied"]
    with pytest.raises(AssertionError, match=r"^1 of \d+ declared ops registered \(gate sglang\); failed: "
                                             r"flashinfer.norm.layernorm, flashinfer.norm.rmsnorm_quant$"):
        checks.check_flashinfer_ops("cpu")


def test_the_declared_ops_check_skips_a_release_whose_layernorm_is_not_registered(monkeypatch, applied_with):
    """A FlashInfer without ``flashinfer.norm.layernorm`` (stand-in: the installed one, the name deleted): the
    layer registers what it can and the check, which shows layernorm, says it is not there."""
    import flashinfer.norm

    monkeypatch.delattr(flashinfer.norm, "layernorm")
    assert applied_with(FLASHINFER_OPS="sglang")["applied"]
    with pytest.raises(checks.Skip, match=r"^2 of \d+ declared ops registered \(gate sglang\); "
                                          r"flashinfer.norm.layernorm is not among them here$"):
        checks.check_flashinfer_ops("cpu")


def test_the_declared_ops_check_fails_when_layernorm_reaches_no_shim_op(monkeypatch):
    import flashinfer.norm

    monkeypatch.setattr(flashinfer.norm, "layernorm",
                        lambda x, weight, bias, eps: torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps))
    with pytest.raises(AssertionError, match=r"layernorm: 1 graphs, shim ops \[\]"):
        checks.check_flashinfer_ops("cpu")


# --- what the checks' failures say, and what they call (from mutmut's survivors in checks.py) ------------------
def test_the_static_trace_check_fails_on_a_break_even_when_one_graph_is_counted(monkeypatch):
    """Stand-in for Dynamo's explain(): under fullgraph=True the trace itself raises on a break, so a real
    function cannot reach the count with one graph and one break; a graph break after the last op gives
    exactly that count, and the check must refuse it as it refuses two graphs."""
    from types import SimpleNamespace

    for graphs, breaks in ((1, 1), (2, 0)):
        monkeypatch.setattr(torch._dynamo, "explain", lambda function, g=graphs, b=breaks: lambda *args: SimpleNamespace(
            graph_count=g, graph_break_count=b))
        with pytest.raises(AssertionError) as failed:
            checks.check_trace_static("cpu")
        assert str(failed.value) == f"{graphs} graphs, {breaks} graph breaks"


def test_the_compiled_vs_eager_check_fails_on_another_layout_of_the_same_values(monkeypatch):
    """The compiled function is a stand-in that gives eager's outputs in column-major layout: same shape, same
    values, other strides. A caller that reads the strides (a GEMM taking the scales) would see other bytes."""
    def compile_to_column_major(function, **options):
        return lambda *args: tuple(t.t().contiguous().t() for t in function(*args))

    monkeypatch.setattr(torch, "compile", compile_to_column_major)
    with pytest.raises(AssertionError, match=r"^M=1: compiled output differs from eager$"):
        checks.check_compiled_matches_eager("cpu")


def test_the_flashinfer_op_check_compares_row_major_column_major_and_3d_input(monkeypatch):
    """What the check says it covers is what it calls: the function's eager side sees each layout once, and a
    fault in the 3-D case is named as the 3-D case."""
    if not flashinfer_op.flashinfer_has_op():
        pytest.skip("this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")
    quantize, seen = flashinfer.fp4_quantize, []

    def recording(x, s):
        seen.append((tuple(x.shape), x.stride()))
        return quantize(x, s)

    monkeypatch.setattr(flashinfer, "fp4_quantize", recording)
    checks.check_flashinfer_op("cpu")
    assert seen == [((64, 256), (256, 1)), ((64, 256), (1, 64)), ((2, 32, 256), (8192, 256, 1))]

    def wrong_for_3d(x, s):
        packed, scales = quantize(x, s)
        return (packed.reshape(-1, packed.shape[-1]), scales) if x.dim() == 3 else (packed, scales)

    monkeypatch.setattr(flashinfer, "fp4_quantize", wrong_for_3d)
    with pytest.raises(AssertionError, match=r"^3-D: compiled op gives \(2, 32, 128\)/"):
        checks.check_flashinfer_op("cpu")


def test_the_flashinfer_op_check_says_which_releases_have_the_op(monkeypatch):
    """On 0.6.3-0.6.11 (the matrix's legs) FlashInfer registers no op: the skip names the release that does."""
    monkeypatch.setattr(torch.ops, "flashinfer", types.SimpleNamespace())  # FlashInfer's ops as 0.6.11 has them
    assert _skip_reason(checks.check_flashinfer_op) == \
        "this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)"


def test_the_declared_ops_check_traces_layernorm_on_the_inputs_it_built(monkeypatch):
    """The traced call is layernorm(x, weight, bias, 1e-6): the op in the graph takes the three graph inputs in
    that order and eps as given (a call with other arguments would be traced just as well, and say nothing
    about the call verify means to show)."""
    graphs, compile = [], torch.compile

    def recording(function, backend, **options):  # the graph Dynamo hands the check's backend
        def record(graph_module, example_inputs):
            graphs.append(graph_module)
            return backend(graph_module, example_inputs)

        return compile(function, backend=record, **options)

    monkeypatch.setattr(torch, "compile", recording)
    checks.check_flashinfer_ops("cpu")
    (graph,) = graphs
    inputs = [n for n in graph.graph.nodes if n.op == "placeholder"]
    (op,) = [n for n in graph.graph.nodes if "fp4_dynamo_shim_flashinfer" in str(n.target)]
    assert [tuple(n.meta["example_value"].shape) for n in inputs] == [(64, 128), (128,), (128,)]
    assert list(op.args[:3]) == inputs and op.args[3:] + tuple(op.kwargs.values()) == (1e-6,)
