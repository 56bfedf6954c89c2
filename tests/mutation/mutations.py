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
ROUTES = "tests/test_routes.py"

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
             f"{PKG}/sglang.py", "        rebound = patching.rebind_modules()\n", "        rebound = []\n",
             f"{ACTIVATION}::test_sglang_plugin_rebinds_an_original_bound_after_the_shim_applied"),
    mutation("hook-ignores-value", "FP4_DYNAMO_SHIM=0 activates the hook like 1",
             "src/fp4_dynamo_shim_hook.py", "    enabled, problem = switch(HOOK_VARIABLE)\n",
             '    enabled, problem = bool(os.environ.get(HOOK_VARIABLE, "").strip()), None\n',
             f"{ACTIVATION}::test_the_hook_follows_the_value_of_the_variable_not_its_presence", fast=False),
    mutation("import-exports-nothing", "import fp4_dynamo_shim no longer sets FP4_DYNAMO_SHIM=1 for children",
             f"{PKG}/__init__.py", "    patching.export_for_children()\n", "    pass\n",
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
    # --- issue 10: no route may be silently off ---------------------------------------------------------------
    mutation("editable-without-pth", "pip install -e writes no fp4_dynamo_shim.pth",
             "setup.py", '        if getattr(self, "editable_mode", False):\n            target = self.get_finalized_command("install").install_lib',
             '        if getattr(self, "editable_mode", False):\n            return',
             f"{ROUTES}::test_an_editable_install_carries_the_hook_and_a_spawned_worker_applies_the_shim", fast=False),
    mutation("install-hook-always-sitecustomize", "install-hook writes sitecustomize.py even into a site directory",
             f"{PKG}/hook.py", 'route = "sitecustomize" if sitecustomize or not _is_site_dir(directory) else "pth"',
             'route = "sitecustomize"',
             f"{ROUTES}::test_install_hook_in_a_debian_python_venv_writes_a_pth_that_runs", fast=False),
    mutation("install-hook-unchecked", "install-hook reports success without checking the hook runs",
             f"{PKG}/hook.py", "    if check:\n        hook_route, origin", "    if False:\n        hook_route, origin",
             f"{ROUTES}::test_a_sitecustomize_that_a_system_file_shadows_is_refused_and_named", fast=False),
    mutation("kill-switch-ignored", "apply() (and so the plugin) does not read FP4_DYNAMO_SHIM_DISABLE",
             f"{PKG}/patching.py", "        if settings.disabled:\n", "        if False:\n",
             f"{ROUTES}::test_the_kill_switch_stops_the_plugin_and_every_route_and_status_says_so"),
    mutation("strict-ignores-unknown-values", "FP4_DYNAMO_SHIM_STRICT=1 only warns about an unknown value",
             f"{PKG}/patching.py", "            if settings.strict:\n                _refuse(problem, settings)\n", "",
             f"{ROUTES}::test_strict_turns_an_unknown_value_into_an_apply_error"),
    mutation("unknown-values-silent", "an unknown value of a variable is used without a word",
             f"{PKG}/patching.py", "            _warn_once(problem)\n", "",
             f"{ROUTES}::test_an_unknown_value_gets_one_warning_naming_the_variable_and_its_values"),
    mutation("hook-variable-unknown-silent", "FP4_DYNAMO_SHIM=enabled is ignored without a word at start-up",
             "src/fp4_dynamo_shim_hook.py", "    enabled, problem = switch(HOOK_VARIABLE)\n    if problem:\n        warn(problem)\n",
             "    enabled, problem = switch(HOOK_VARIABLE)\n",
             f"{ROUTES}::test_an_unknown_value_of_the_hook_variable_warns_once_at_start_up", fast=False),
    mutation("status-keys-vary", "status() drops the keys that do not apply",
             f"{PKG}/patching.py", "        if applied is None:\n            return report\n",
             "        if applied is None:\n            return {k: v for k, v in report.items() if v is not None}\n",
             f"{ROUTES}::test_status_has_the_same_keys_applied_not_applied_and_after_a_failed_apply"),
    mutation("revert-keeps-export", "revert() leaves FP4_DYNAMO_SHIM=1 for children",
             f"{PKG}/patching.py", "            del os.environ[config.HOOK]\n", "            pass\n",
             f"{ROUTES}::test_revert_withdraws_the_variable_the_import_set_and_says_whether_it_reverted"),
    mutation("float-scale-attribute-error", "a Python float global scale fails with an AttributeError again",
             f"{PKG}/ops.py", '    except AttributeError:\n        raise not_a_tensor("global_scale", global_scale) from None',
             '    except ZeroDivisionError:\n        raise not_a_tensor("global_scale", global_scale) from None',
             "tests/test_battery.py::test_eager_and_compiled_agree"),
    mutation("usage-error-exits-2", "a usage error exits like 'not applied'",
             f"{PKG}/verify.py", "        self.exit(EXIT_USAGE,", "        self.exit(EXIT_NOT_APPLIED,",
             f"{ROUTES}::test_usage_errors_exit_3_and_are_not_confused_with_not_applied"),
    mutation("benchmark-always-saves", "a benchmark run overwrites the committed results",
             "benchmarks/common.py", '    if save is None:\n        return "result not saved (pass --save to write it)"',
             "    if save is None:\n        save = RESULTS",
             f"{ROUTES}::test_benchmarks_write_results_only_when_asked"),
    mutation("replacement-prints-like-a-function", "the replacement has no repr of its own",
             f"{PKG}/wrapper.py", "    def __repr__(self):", "    def _repr(self):",
             f"{ROUTES}::test_the_replacement_says_it_is_the_shims_and_names_the_original"),
    mutation("verify-prints-every-module", "verify lists every rebound module without --verbose",
             f"{PKG}/verify.py", '_rebound_lines(status["rebound"], verbose)', '_rebound_lines(status["rebound"], True)',
             f"{ROUTES}::test_verify_groups_rebound_names_by_package_and_lists_modules_only_when_verbose"),
    mutation("worker-check-never-fails", "verify's worker check skips instead of failing",
             f"{PKG}/verify.py", "    raise AssertionError(f\"{' and '.join(asked)}, but {detail}.",
             "    raise Skip(f\"{' and '.join(asked)}, but {detail}.",
             f"{ROUTES}::test_where_no_hook_can_run_the_import_warns_and_verify_fails_the_worker_check", fast=False),
    mutation("import-export-unwarned", "import exports FP4_DYNAMO_SHIM=1 where no hook runs, silently",
             f"{PKG}/patching.py", "        _warn_once(\n            f\"import fp4_dynamo_shim exports",
             "        (lambda message: None)(\n            f\"import fp4_dynamo_shim exports",
             f"{ROUTES}::test_where_no_hook_can_run_the_import_warns_and_verify_fails_the_worker_check", fast=False),
]
