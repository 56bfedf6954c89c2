"""The curated mutations: each breaks one behaviour of the shim and names the tests that must catch it.

``edits`` are (path, old snippet, new snippet); each old snippet must occur exactly once in its file.
``fast`` mutations need no virtual environment or wheel build and form the subset CI runs.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    why: str
    edits: tuple
    tests: tuple
    fast: bool = True


def mutation(name, why, path, old, new, *tests, fast=True):
    return Mutation(name, why, ((path, old, new),), tuple(tests), fast)


PKG = "src/fp4_dynamo_shim"
FAMILY = "tests/test_family.py"
ACTIVATION = "tests/test_activation.py"

MUTATIONS = [
    # --- issue 9, item 1-9: breakages the suite once let through -------------------------------------------
    mutation("family-not-wrapped", "no FP4 family function is replaced",
             f"{PKG}/family.py", "        replaced[member.name] = (original, replacement)\n", "",
             f"{FAMILY}::test_traces_with_no_graph_breaks_runs_and_matches_eager"),
    mutation("mm_fp4-ignores-alpha", "the mm_fp4 reference drops alpha",
             f"{PKG}/reference.py", "    if alpha is not None:\n        product = product *",
             "    if False:\n        product = product *",
             f"{FAMILY}::test_mm_fp4_dequantizes_both_operands_and_applies_alpha"),
    mutation("silu-dropped", "the silu-and-mul experts reference multiplies without the silu",
             f"{PKG}/reference.py", "(gate / (1.0 + torch.exp(-gate)) * up)", "(gate * up)",
             f"{FAMILY}::test_silu_and_mul_experts_quantize_applies_silu_to_the_gate_half"),
    mutation("batched-rows-flipped", "per-row batched global scales applied per batch instead",
             f"{PKG}/reference.py", "global_scale.reshape(1, rows).expand(batches, rows)",
             "global_scale.reshape(rows, 1).expand(rows, batches)",
             f"{FAMILY}::test_batched_quantize_applies_a_per_row_global_scale_to_that_row_in_every_batch"),
    Mutation("mxfp4-dequantize-linear", "mxfp4_dequantize reads swizzled scales as linear", (
        (f"{PKG}/family.py", "        swizzled = sf_layout != context.SfLayout.layout_linear\n        is_8x4",
         "        swizzled = False\n        is_8x4"),
        (f"{PKG}/family.py", "        swizzled, is_8x4 = True, False", "        swizzled, is_8x4 = False, False"),
    ), (f"{FAMILY}::test_mxfp4_dequantize_reads_swizzled_scales",)),
    mutation("do_shuffle-expressed", "nvfp4_quantize(do_shuffle=True) runs the op and returns unshuffled bytes",
             f"{PKG}/family.py", "do_shuffle=(False,),", "do_shuffle=(False, True),",
             f"{FAMILY}::test_arguments_no_op_carries_reach_flashinfer_eagerly_and_fail_clearly_compiled"),
    mutation("mm_fp4-out-expressed", "mm_fp4(out=...) runs the op and ignores out",
             f"{PKG}/family.py", '    if blocked is None and arguments.get("out") is not None:\n'
             '        blocked = Unsupported("out=...")\n    if blocked is not None:\n        return blocked\n'
             '    return op("mm_fp4")',
             '    if blocked is not None:\n        return blocked\n    return op("mm_fp4")',
             f"{FAMILY}::test_arguments_no_op_carries_reach_flashinfer_eagerly_and_fail_clearly_compiled"),
    mutation("fake-skips-validation", "the fake accepts bad input; errors come only when the graph runs",
             f"{PKG}/ops.py", "        _problem(input, global_scale, sf_vec_size, sf_use_ue8m0, nvfp4_4over6_code, target)\n",
             "        if launch is not None:\n"
             "            _problem(input, global_scale, sf_vec_size, sf_use_ue8m0, nvfp4_4over6_code, target)\n",
             "tests/test_battery.py::test_the_fake_rejects_bad_input_while_tracing"),
    mutation("row-0.6.7-unpadded", "0.6.7's linear scale buffer loses its 16-row padding",
             f"{PKG}/targets.py", '">=0.6.7,<0.6.8"), _QUANTIZATION, _KERNEL_ARGS_BASE, False, 16, False)',
             '">=0.6.7,<0.6.8"), _QUANTIZATION, _KERNEL_ARGS_BASE, False, 1, False)',
             "tests/test_op.py::test_each_release_gets_the_row_its_wheel_calls_for"),
    mutation("row-0.6.8-unpadded-columns", "0.6.8's swizzled scales viewed with unpadded columns",
             f"{PKG}/targets.py", '">=0.6.8,<0.6.11"), _QUANTIZATION, _KERNEL_ARGS_BASE, True,',
             '">=0.6.8,<0.6.11"), _QUANTIZATION, _KERNEL_ARGS_BASE, False,',
             "tests/test_op.py::test_each_release_gets_the_row_its_wheel_calls_for"),
    mutation("row-0.6.11-no-inversed", "0.6.11's kernel called without is_global_scale_inversed",
             f"{PKG}/targets.py", '">=0.6.11,<0.6.13"), _QUANTIZATION, _KERNEL_ARGS_INVERSED,',
             '">=0.6.11,<0.6.13"), _QUANTIZATION, _KERNEL_ARGS_BASE,',
             "tests/test_op.py::test_each_release_gets_the_row_its_wheel_calls_for"),
    mutation("fast-path-drops-enable_pdl", "the eager fast path passes enable_pdl=None to the launcher",
             f"{PKG}/wrapper.py", '"                     is_sf_8x4_layout, {inversed}, enable_pdl, 0,',
             '"                     is_sf_8x4_layout, {inversed}, None, 0,',
             "tests/test_parity.py::test_kernel_entry_receives_identical_arguments"),
    mutation("plugin-skips-rebind", "the SGLang plugin applies but does not rescan the modules",
             f"{PKG}/sglang.py", "    if patching.apply():\n        patching.rebind_modules()\n",
             "    patching.apply()\n",
             f"{ACTIVATION}::test_sglang_plugin_rebinds_an_original_bound_after_the_shim_applied"),
    mutation("hook-ignores-value", "FP4_DYNAMO_SHIM=0 activates the hook like 1",
             "src/fp4_dynamo_shim_hook.py", 'return _flag("FP4_DYNAMO_SHIM") and',
             'return bool(os.environ.get("FP4_DYNAMO_SHIM", "").strip()) and',
             f"{ACTIVATION}::test_the_hook_follows_the_value_of_the_variable_not_its_presence", fast=False),
    mutation("import-exports-nothing", "import fp4_dynamo_shim no longer sets FP4_DYNAMO_SHIM=1 for children",
             f"{PKG}/__init__.py", '    os.environ[config.HOOK] = "1"\n', "",
             f"{ACTIVATION}::test_importing_the_shim_exports_the_variable_that_activates_spawned_children",
             fast=False),
    mutation("cuda-default-prefers-nvcc", "the default CUDA version is nvcc's, not torch's",
             f"{PKG}/cuda_version.py", 'version, source = (torch_cuda, "torch") if torch_cuda else (nvcc, "nvcc")',
             'version, source = (nvcc, "nvcc") if nvcc else (torch_cuda, "torch")',
             "tests/test_cuda_version.py::test_default_is_torchs_cuda_even_when_nvcc_reports_another"),
    mutation("unknown-cuda-fixed", "with no CUDA version known, a fixed one is returned",
             f"{PKG}/cuda_version.py", "        def get_cuda_version() -> Version:\n            return original_get_cuda_version()",
             '        def get_cuda_version() -> Version:\n            return Version("12.8")',
             "tests/test_cuda_version.py::test_with_no_version_known_the_replacements_defer_to_flashinfers_lookup_each_call"),
    mutation("pth-does-nothing", "the .pth line never calls the hook",
             "src/fp4_dynamo_shim.pth", '__import__("fp4_dynamo_shim_hook").install_if_enabled()', "None",
             f"{ACTIVATION}::test_a_broken_hook_module_does_not_stop_the_interpreter", fast=False),
    mutation("invalid-argument-not-runtime-error", "bad input no longer raises what FlashInfer callers catch",
             f"{PKG}/errors.py", "class InvalidArgumentError(ValueError, RuntimeError):",
             "class InvalidArgumentError(ValueError):",
             "tests/test_battery.py::test_eager_and_compiled_agree"),
    mutation("original-in-module-global", "an original kept in a module global of the shim (mm_fp4's recursion)",
             f"{PKG}/family_ops.py", "    _runtime.mm_fp4 = mm_fp4\n",
             "    _runtime.mm_fp4 = mm_fp4\n    global _mm_fp4_original\n    _mm_fp4_original = mm_fp4\n",
             "tests/test_lifecycle.py::test_no_module_of_the_shim_holds_an_original_once_applied"),
    # --- behaviours that already had a catching test ---------------------------------------------------------
    mutation("fake-contiguous-strides", "the fake returns contiguous outputs for column-major input",
             f"{PKG}/ops.py", "    return quantize(\n        input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, "
             "is_sf_8x4_layout,\n        is_global_scale_inversed, enable_pdl, nvfp4_4over6_code, launch=None,\n    )",
             "    return tuple(t.contiguous() for t in quantize(\n        input, global_scale, sf_vec_size, sf_use_ue8m0, "
             "is_sf_swizzled_layout, is_sf_8x4_layout,\n        is_global_scale_inversed, enable_pdl, "
             "nvfp4_4over6_code, launch=None,\n    ))",
             "tests/test_op.py::test_fake_matches_real_shapes_dtypes_and_strides_for_every_release_row"),
    mutation("aliases-not-rebound", "only globals named like the original are rebound",
             f"{PKG}/rebind.py", "if value is old]", "if value is old and name == getattr(old, '__name__', name)]",
             "tests/test_compile.py::test_module_that_imported_fp4_quantize_before_the_shim_is_rebound_and_compiles"),
    mutation("revert-keeps-replacements", "revert() forgets to put the originals back",
             f"{PKG}/patching.py", "    for old, new in reversed(swaps):\n        rebind.swap(new, old)",
             "    for old, new in reversed(swaps):\n        pass",
             "tests/test_lifecycle.py::test_revert_restores_every_identical_original_object"),
    mutation("e2m1-ties-up", "0.75 rounds to 1.0's neighbour the wrong way",
             f"{PKG}/reference.py", "        + (magnitude >= 0.75)\n", "        + (magnitude > 0.75)\n",
             "tests/test_reference.py::test_e2m1_rounds_to_nearest_with_ties_to_the_even_code_and_saturates"),
    mutation("e2m1-unsigned-zero", "-0.0 loses its sign bit",
             f"{PKG}/reference.py", "code | (torch.signbit(values).to(torch.uint8) << 3)",
             "code | ((values < 0).to(torch.uint8) << 3)",
             "tests/test_reference.py::test_e2m1_rounds_to_nearest_with_ties_to_the_even_code_and_saturates"),
    mutation("swizzle-order", "the 128x4 swizzle swaps its 32- and 4-row axes",
             f"{PKG}/layout.py", "    return tiles.permute(0, 3, 2, 1, 4).reshape(-1)",
             "    return tiles.permute(0, 3, 1, 2, 4).reshape(-1)",
             "tests/test_reference.py::test_swizzled_layouts_match_the_kernels_offset_functions"),
    mutation("sitecustomize-block-inert", "the sitecustomize block imports the hook but never installs it",
             f"{PKG}/hook.py", "    fp4_dynamo_shim_hook.install()\nexcept", "    pass\nexcept",
             f"{ACTIVATION}::test_sitecustomize_route_applies_the_shim_without_any_pth"),
    mutation("no-post-import-hook", "the import hook never registers its post-import hook",
             "src/fp4_dynamo_shim_hook.py", '            wrapt.register_post_import_hook(_on_flashinfer_imported, "flashinfer")\n',
             "", f"{ACTIVATION}::test_spawned_child_applies_the_shim_only_with_the_environment_variable", fast=False),
]
