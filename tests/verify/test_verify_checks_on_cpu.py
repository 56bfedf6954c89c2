"""verify's checks in this process, on CPU: each check that runs here passes and says what it showed, the ones
that need a GPU say so, and the branches a GPU takes run on CPU tensors. Each check handed the fault it exists to
see: test_verify_checks_see_their_faults.py.

verify's command line (a child process per call) is tested in test_activation.py and test_no_route_is_silently_off.py; here
the checks are called directly, so that a broken check is seen by a test that reaches it (and by mutmut's
trampolines, which do not follow child processes). Stand-in, because there is no GPU here: the device state
a GPU would report (its mode as verify reads it: the FP4 kernel, the launch-only fallback, or a refusal), so the
branches verify takes on an SM90 GPU run on CPU tensors; everything else is the real check.
"""

from __future__ import annotations

import flashinfer
import pytest
import torch

import fp4_dynamo_shim
from _fp4_dynamo_shim.verify import checks, report
from _fp4_dynamo_shim.verify import sglang
from _fp4_dynamo_shim.fp4 import flashinfer_op

FAMILY = ("nvfp4_quantize", "mxfp4_quantize", "block_scale_interleave", "e2m1_and_ufp8sf_scale_to_float",
          "mxfp4_dequantize", "mxfp4_dequantize_host", "nvfp4_batched_quantize", "scaled_fp4_grouped_quantize",
          "silu_and_mul_scaled_nvfp4_experts_quantize", "mm_fp4")


def replaced_family():
    return [n for n, s in fp4_dynamo_shim.status()["family"].items() if s.startswith("op-backed")]


@pytest.fixture
def device_mode(monkeypatch):
    """Stand-in for what a GPU reports (none here): "kernel" (SM100+), "launch" (the empty kernel of an SM90
    GPU, FP4_DYNAMO_SHIM_FALLBACK=launch) or "error" (SM90, the default)."""
    def use(mode):
        monkeypatch.setattr(checks, "_mode", lambda device: mode)
    return use


# --- what each check says when all is well -----------------------------------------------------------------

def test_the_checks_that_run_on_cpu_pass_and_say_what_they_showed():
    assert checks.check_trace_static("cpu") == \
        "fullgraph trace of flashinfer.fp4_quantize: 1 graph, 0 graph breaks (M=37)"
    assert checks.check_trace_dynamic("cpu") == \
        "dim 0 marked dynamic, M in (2, 17, 300): 1 graph, 0 graph breaks, no recompilation"
    assert checks.check_opcheck("cpu") == "torch.library.opcheck on fp4_dynamo_shim::fp4_quantize (cpu): all tests"
    assert checks.check_compiled_matches_eager("cpu") == \
        "inductor output equals eager bitwise for M in (1, 33, 256) (reference quantizer)"
    if flashinfer_op.flashinfer_has_op():
        assert checks.check_flashinfer_op("cpu") == \
            "compiled with fullgraph (row-major, column-major, 3-D): outputs equal the function's bitwise"


def test_the_family_check_calls_every_replaced_function_and_names_them():
    replaced = replaced_family()
    assert set(replaced) <= set(FAMILY) and replaced
    assert checks.check_family("cpu") == f"{len(replaced)} functions called once on cpu: result: {', '.join(replaced)}"


def test_the_family_check_calls_each_function_on_the_device_it_checks(monkeypatch):
    """On a GPU, examples built for another device would have the check call every function with CPU tensors
    while its line says cuda; the meta device stands for the GPU here (every function's fake runs there)."""
    seen, quantize = [], flashinfer.nvfp4_quantize

    def recording(x, *args, **kwargs):
        seen.append(x.device.type)
        return quantize(x, *args, **kwargs)

    monkeypatch.setattr(flashinfer, "nvfp4_quantize", recording)
    assert checks.check_family("meta").startswith(f"{len(replaced_family())} functions called once on meta")
    assert seen == ["meta"]


def test_the_family_examples_move_the_gpu_functions_inputs_to_the_device_and_keep_the_host_functions():
    """The device the check names reaches every input of the functions that run there, and only those: the two
    host functions take CPU tensors wherever the check runs. The meta device stands in for cuda (a CPU has
    none): moving a tensor there is the same ``.to(device)`` and leaves an unmistakable device behind, which a
    "cpu" check cannot tell from leaving the inputs where they were built."""
    host = {"e2m1_and_ufp8sf_scale_to_float", "mxfp4_dequantize_host"}
    for name, (args, _) in checks.family_examples("meta").items():
        devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
        assert devices == ({"cpu"} if name in host else {"meta"}), (name, devices)


def test_the_family_examples_are_valid_calls_on_cpu():
    examples = checks.family_examples("cpu")
    assert sorted(examples) == sorted(FAMILY)
    for name in replaced_family():
        args, kwargs = examples[name]
        assert all(a.device.type == "cpu" for a in args if isinstance(a, torch.Tensor))
        outputs = getattr(flashinfer, name)(*args, **kwargs)
        outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
        assert all(o.numel() for o in outputs if isinstance(o, torch.Tensor)), name
    packed, sf, inverse_scale = examples["e2m1_and_ufp8sf_scale_to_float"][0]
    x, scale = examples["nvfp4_quantize"][0]
    assert torch.equal(inverse_scale, 1.0 / scale) and sf.dim() == 1
    assert examples["mm_fp4"][1] == {"out_dtype": torch.bfloat16}


def test_the_family_examples_mean_what_they_are_for():
    """Each example is a call whose inputs fit together, not any valid call: block_scale_interleave gets the
    linear scales of the input whose swizzled scales fp4_quantize gives (so the two agree), mm_fp4's alpha undoes
    both global scales (so its product is that of the two operands dequantized, to bfloat16's precision), and the
    grouped functions' mask fills expert 0 and leaves expert 1 part-filled."""
    examples = checks.family_examples("cpu")
    x, scale = examples["nvfp4_quantize"][0]
    (linear,), _ = examples["block_scale_interleave"]
    assert torch.equal(flashinfer.block_scale_interleave(linear).reshape(-1),
                       flashinfer.fp4_quantize(x, scale)[1].reshape(-1))
    (a, b_t, a_sf, b_sf_t, alpha), kwargs = examples["mm_fp4"]
    product = flashinfer.mm_fp4(a, b_t, a_sf, b_sf_t, alpha, **kwargs).float()
    b_scale = 1.0 / (alpha * scale)

    def dequantized(packed, sf, global_scale):
        return flashinfer.e2m1_and_ufp8sf_scale_to_float(packed.contiguous(), sf.contiguous().reshape(-1),
                                                         1.0 / global_scale)

    exact = dequantized(a, a_sf, scale) @ dequantized(b_t.t(), b_sf_t.t(), b_scale).t()
    assert ((product - exact).norm() / exact.norm()).item() < 0.01
    for name in ("scaled_fp4_grouped_quantize", "silu_and_mul_scaled_nvfp4_experts_quantize"):
        (experts, mask, scales), _ = examples[name]
        rows = experts.shape[1]
        assert mask[0] == rows and 0 < mask[1] < rows and scales[0] != scales[1], name


def _skip_reason(check) -> str:
    with pytest.raises(checks.Skip) as skipped:
        check("cpu")
    return str(skipped.value)


def test_the_checks_that_need_a_gpu_skip_on_cpu_and_say_why():
    assert _skip_reason(checks.check_cuda_graph) == "CUDA graphs need a GPU"
    assert _skip_reason(checks.check_baseline) == \
        "the unpatched failure is shown on a GPU (on CPU FlashInfer stops earlier, at the device check)"
    with pytest.raises(checks.Skip):
        sglang.check_sglang_compile_path("cpu")
    assert fp4_dynamo_shim.status()["applied"]  # check_baseline reverts only on a GPU


@pytest.mark.parametrize("installed, reason", [
    (None, "sglang is not installed"),
    ("0.5.14", "sglang 0.5.14: verify drives SGLang's install_torch_compiled + set_compiled only on 0.5.3.post2-0.5.9"),
    ("0.5.10", "sglang 0.5.10: verify drives SGLang's install_torch_compiled + set_compiled only on 0.5.3.post2-0.5.9 "
               "(the compile path has no set_compiled: verify's sglang-compile check does not drive it)"),
    ("0.5.9", "SGLang's piecewise CUDA graph needs a GPU"),
])
def test_sglangs_compile_path_check_says_why_it_does_not_run_here(sglang_installed, installed, reason):
    # The compile path itself needs SGLang 0.5.3.post2-0.5.9 on a GPU (tests/gpu/test_gpu_sglang.py).
    sglang_installed(installed)
    assert _skip_reason(sglang.check_sglang_compile_path) == reason


def test_every_check_is_listed_once_in_verifys_order():
    names = [name for name, _, _ in report.ordered_checks()]
    assert names == ["trace-static", "trace-dynamic", "opcheck", "compiled-vs-eager", "cuda-graph", "flashinfer-op",
                     "sglang-release", "sglang-compile", "family", "flashinfer-ops", "worker-activation"]
    assert all(callable(check) and check.__name__.startswith("check_") for _, check, _ in report.ordered_checks())


# --- on a GPU without the FP4 kernel (stand-in: the device state) ---------------------------------------------

def test_where_nothing_launches_the_trace_checks_trace_on_fake_tensors_and_the_rest_skip(device_mode, kernel_stand_in):
    device_mode("error")
    note = " (traced on fake tensors: no FP4 kernel runs on this GPU)"
    assert checks.check_trace_static("cpu") == \
        "fullgraph trace of flashinfer.fp4_quantize: 1 graph, 0 graph breaks (M=37)" + note
    assert checks.check_trace_dynamic("cpu") == \
        "dim 0 marked dynamic, M in (2, 17, 300): 1 graph, 0 graph breaks, no recompilation" + note
    assert kernel_stand_in == []  # traced only: on such a GPU a launch would be refused
    assert _skip_reason(checks.check_opcheck) == \
        "this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error: nothing to run"
    assert _skip_reason(checks.check_compiled_matches_eager) == \
        "no FP4 values on this GPU (SM<100); FP4_DYNAMO_SHIM_FALLBACK=reference makes them"
    assert _skip_reason(checks.check_flashinfer_op) == (
        "this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error" if flashinfer_op.flashinfer_has_op()
        else "this FlashInfer registers no torch.ops.flashinfer.fp4_quantize (0.6.12+)")


def test_where_the_kernel_only_launches_the_checks_compare_shapes_not_values(device_mode):
    device_mode("launch")
    assert checks.check_opcheck("cpu") == \
        "opcheck schema + fake-tensor tests (the kernel computes no values on this GPU)"
    assert checks.check_trace_static("cpu").endswith("(M=37)")
    with pytest.raises(checks.Skip, match="SM<100"):
        checks.check_compiled_matches_eager("cpu")
    if flashinfer_op.flashinfer_has_op():
        assert checks.check_flashinfer_op("cpu") == ("compiled with fullgraph (row-major, column-major, 3-D): outputs "
                                                     "equal the function's in shape, stride and dtype (no FP4 values "
                                                     "on this GPU)")


def test_on_an_fp4_gpu_the_compared_values_are_said_to_be_the_kernels(device_mode):
    device_mode("kernel")  # SM100+: the values compared are FlashInfer's kernel's, and verify says so
    assert checks.check_compiled_matches_eager("cpu") == \
        "inductor output equals eager bitwise for M in (1, 33, 256) (FlashInfer kernel)"


_UNSET = "unset"


def test_each_check_compiles_as_it_says_on_the_inputs_it_names(monkeypatch):
    """What each line claims ("fullgraph", "inductor", "M in (1, 33, 256)", "dim 0 marked dynamic") is what the
    check asked torch for: a check that stopped asking for fullgraph, or compared other rows, still passes on a
    working shim, so its requests are recorded here."""
    compiled, rows, opchecked = [], [], []
    real_compile, real_opcheck = torch.compile, torch.library.opcheck

    def named(backend):  # a backend object by its class, and a counter by what it wraps
        if isinstance(backend, str):
            return backend
        wrapped = getattr(backend, "backend", None)
        return type(backend).__name__ + (f"({wrapped})" if isinstance(wrapped, str) else "")

    def recording_compile(function, **options):
        compiled.append((function.__name__, options.get("fullgraph", _UNSET), named(options.get("backend", _UNSET)),
                         options.get("dynamic", _UNSET)))
        run = real_compile(function, **options)

        def call(x, *args):  # the rows, and the device, of each input the compiled function is called on
            rows.append((x.shape[0], x.device.type))
            return run(x, *args)

        return call

    def recording_opcheck(op, arguments, **options):
        rows.append((arguments[0].shape[0], arguments[0].device.type))
        opchecked.append((tuple(a for a in arguments if not isinstance(a, torch.Tensor)), options.get("test_utils", _UNSET)))
        return real_opcheck(op, arguments, **options)

    monkeypatch.setattr(torch, "compile", recording_compile)
    monkeypatch.setattr(torch.library, "opcheck", recording_opcheck)
    expected = {
        checks.check_trace_static: ([("_quantize", True, "eager", _UNSET)], [37]),
        checks.check_trace_dynamic: ([("_quantize", True, "CompileCounterWithBackend(eager)", None)], [2, 17, 300]),
        checks.check_opcheck: ([], [64]),
        checks.check_compiled_matches_eager: ([("_quantize", True, "inductor", _UNSET)], [1, 33, 256]),
        checks.check_flashinfer_op: ([("call", True, "inductor", _UNSET)], [64, 64, 64, 2]),  # 2: [2, 32, 256]
        checks.check_flashinfer_ops: ([("call", True, "_TraceOnly", _UNSET)], [(64, "cuda")]),  # fake CUDA tensors
    }
    if not flashinfer_op.flashinfer_has_op():
        del expected[checks.check_flashinfer_op]
    for check, (compiles, counts) in expected.items():
        compiled.clear()
        rows.clear()
        check("cpu")
        assert compiled == compiles and rows == [(c, "cpu") if isinstance(c, int) else c for c in counts], (check.__name__, compiled, rows)
    assert opchecked == [((16, False, True, False, False, None, 0), _UNSET)]  # on CPU every opcheck test runs


@pytest.mark.parametrize("current, launches, computes", [
    (0, False, False), (1, True, True), (2, True, False), (3, True, True), (4, False, False), (None, False, False)])
def test_on_a_gpu_the_checks_go_by_what_the_current_gpu_loaded(current, launches, computes, monkeypatch):
    """Stand-ins: the GPUs status() reports (error, kernel, launch and reference, as apply() records them; None:
    none recorded) and the current CUDA device. Past its gate a check needs CUDA, which is not here: it raises
    where it would run, and skips where the GPU's mode says it cannot."""
    status = fp4_dynamo_shim.status()
    devices = None if current is None else [{"index": index, "mode": mode} for index, mode in
                                            enumerate(("error", "kernel", "launch", "reference"))]
    monkeypatch.setattr(checks.lifecycle, "status", lambda: {**status, "devices": devices})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current or 0)

    def goes_past_its_gate(check):
        try:
            check("cuda")
        except checks.Skip:
            return False
        except Exception:  # no CUDA here
            return True
        return True

    assert goes_past_its_gate(checks.check_cuda_graph) is launches
    assert goes_past_its_gate(checks.check_compiled_matches_eager) is computes


# --- FlashInfer's declared ops: verify's check on CPU (its GPU branch runs and compares on the H200) --------

def test_the_declared_ops_check_traces_layernorm_to_the_shims_op_and_says_the_gates_counts():
    import torch._dynamo  # noqa: F401  (the layer registers when Dynamo is imported)

    layer = fp4_dynamo_shim.status()["flashinfer_ops"]
    counts = layer["counts"]
    assert checks.check_flashinfer_ops("cpu") == (
        f"{counts['registered']} of {counts['declared']} declared ops registered (gate {layer['gate']}); layernorm "
        "traced to fp4_dynamo_shim_flashinfer.layernorm.default on fake CUDA tensors (no GPU here)")


def test_the_declared_ops_check_skips_with_the_gate_off_or_the_shim_reverted_and_says_why(applied_with):
    off = "FP4_DYNAMO_SHIM_FLASHINFER_OPS=off: FlashInfer's declared ops are not registered"
    assert applied_with(FLASHINFER_OPS="off")["applied"]
    assert _skip_reason(checks.check_flashinfer_ops) == off
    fp4_dynamo_shim.revert()
    assert _skip_reason(checks.check_flashinfer_ops) == off


# --- branches a GPU reaches, driven here with the device state and SGLang's outcome stood in ------------------
# Stand-ins: the GPU's mode as verify reads it (what the GPU's preload reports) and, for SGLang's compile path, what
# ``sglang_releases.describe`` and ``compile_path_check`` return (SGLang and a GPU are not here). What they cannot
# show: that SGLang's compile path on a GPU yields such an outcome; tests/gpu/test_gpu_sglang.py drives it.

NO_KERNEL = "this GPU has no FP4 kernel and FP4_DYNAMO_SHIM_FALLBACK=error"


def test_the_cuda_graph_check_skips_a_gpu_without_an_fp4_kernel_before_touching_it(device_mode):
    device_mode("error")
    with pytest.raises(checks.Skip) as skipped:
        checks.check_cuda_graph("cuda")
    assert str(skipped.value) == NO_KERNEL


@pytest.fixture
def sglang_outcome(monkeypatch, device_mode, sglang_installed):
    """``use(outcome)``: SGLang 0.5.9 on a GPU whose kernel computes values, its compile path returning ``outcome``
    (and recording the ``compare_values`` it was handed)."""
    handed = []

    def use(outcome, mode="kernel"):
        device_mode(mode)
        sglang_installed("0.5.9")
        monkeypatch.setattr(sglang, "compile_path_check",
                            lambda compare_values: handed.append(compare_values) or outcome)
        return handed

    return use


def test_sglangs_compile_path_check_skips_a_gpu_without_an_fp4_kernel(sglang_outcome):
    handed = sglang_outcome({}, mode="error")
    with pytest.raises(checks.Skip) as skipped:
        sglang.check_sglang_compile_path("cuda")
    assert str(skipped.value) == NO_KERNEL and handed == []


@pytest.mark.parametrize("mode, compared", [("kernel", "equal eager"),
                                            ("launch", "not compared (no FP4 values on this GPU)")])
def test_sglangs_compile_path_check_says_what_sglang_captured_and_compared(sglang_outcome, mode, compared):
    handed = sglang_outcome({"capture_sizes": [2, 4, 8], "cuda_graphs_captured": 3,
                             "replays_equal_eager": True if mode == "kernel" else None}, mode)
    assert sglang.check_sglang_compile_path("cuda") == (
        "sglang 0.5.9 install_torch_compiled + SGLangBackend, capture sizes [2, 4, 8]: traced, 3 CUDA graphs "
        f"captured, replayed; outputs {compared}")
    assert handed == [mode == "kernel"]


def test_sglangs_compile_path_check_fails_when_replays_differ_from_eager(sglang_outcome):
    sglang_outcome({"capture_sizes": [2, 4, 8], "cuda_graphs_captured": 3, "replays_equal_eager": False})
    with pytest.raises(AssertionError) as failed:
        sglang.check_sglang_compile_path("cuda")
    assert str(failed.value) == "replays through SGLang's piecewise CUDA graphs differ from eager"


def test_sglangs_compile_path_check_fails_when_fewer_graphs_are_captured_than_sizes(sglang_outcome):
    sglang_outcome({"capture_sizes": [2, 4, 8], "cuda_graphs_captured": 2, "replays_equal_eager": True})
    with pytest.raises(AssertionError) as failed:
        sglang.check_sglang_compile_path("cuda")
    assert str(failed.value) == "SGLang captured 2 CUDA graphs for capture sizes [2, 4, 8]"


def test_the_group_of_one_sglang_asks_for_is_gloo_on_an_ephemeral_port():
    import torch.distributed as dist

    assert not dist.is_initialized()  # no other test leaves a group behind: this one must make it
    try:
        sglang._one_rank_process_group()
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 1 and dist.get_rank() == 0
        port = int(dist.distributed_c10d._default_pg_init_method.rsplit(":", 1)[1])
        assert port >= 1024  # the kernel's choice; a fixed privileged port fails for a user who is not root
        sglang._one_rank_process_group()  # a second call keeps the group it has
        assert dist.distributed_c10d._default_pg_init_method.endswith(f":{port}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
