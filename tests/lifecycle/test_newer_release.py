"""A FlashInfer release newer than the tested range: judged part by part from its sources, never refused whole
(what verify reports for one: tests/verify/test_verify_skips_parts_left_as_flashinfers.py).

Each test runs a fresh interpreter against a copy of the installed (newest tested) release that says it is 0.7.9,
with at most one thing edited (tests/support/simulated_release.py): the registry here has nothing newer.
"""

from __future__ import annotations

import pytest

import simulated_release
from simulated_release import replace

# The copy is of the newest tested release whatever is installed; a copy and an interpreter per test: the slow tier.
pytestmark = [pytest.mark.release_independent, pytest.mark.slow]

FP4 = "quantization/fp4_quantization.py"
NEWER = "0.7.9"


def judged(tmp_path, edits=None, env=None, code=simulated_release.PROBE) -> dict:
    if simulated_release.TESTED != "0.7.4":
        pytest.skip(f"the edits are written against 0.7.4's sources; {simulated_release.TESTED} is installed")
    return simulated_release.probe(simulated_release.make(tmp_path, NEWER, edits), env, code)


def parts(result: dict) -> dict:
    return result["status"]["flashinfer"]["parts"]


def test_a_newer_release_whose_parts_all_match_applies_as_the_newest_row_and_says_untested(tmp_path):
    result = judged(tmp_path)
    status = result["status"]
    assert status["applied"] and status["flashinfer"]["version"] == NEWER
    assert status["flashinfer"]["tested"] is False and status["flashinfer"]["matched_row"] == "0.7.4"
    assert parts(result) and all(part["matches"] and part["applied"] for part in parts(result).values())
    assert all(result["shim"].values()), result["shim"]
    assert status["target"]["versions"] == "<0.7.5,>=0.7.4"
    assert not [line for line in result["warnings"] if "differs" in line]


def test_strict_mode_refuses_an_untested_release_by_name_and_touches_nothing(tmp_path):
    result = judged(tmp_path, env={"FP4_DYNAMO_SHIM_STRICT": "1"})
    assert result["error"] is not None and "ApplyError" in result["error"] and NEWER in result["error"]
    assert "newer than the tested range" in result["error"]
    assert not result["status"]["applied"] and not any(result["shim"].values())


def test_fp4_quantize_with_a_new_parameter_stays_flashinfers_and_the_rest_applies(tmp_path):
    result = judged(tmp_path, {FP4: replace("    *,\n    batch_invariant: bool = False,\n",
                                            "    x: int = 0,\n    *,\n    batch_invariant: bool = False,\n")})
    assert result["status"]["applied"]
    assert parts(result)["fp4_quantize"] == {"matches": False, "difference": "new parameter `x`", "applied": False,
                                             "left_because": None}
    shim = result["shim"]
    assert not shim["fp4_quantize"] and shim["block_scale_interleave"] and shim["e2m1_and_ufp8sf_scale_to_float"]
    assert shim["mm_fp4"] and shim["get_cuda_version"]
    # the two members that call fp4_quantize follow it; the declared layer applies as ever
    assert not shim["nvfp4_quantize"] and not shim["mxfp4_quantize"]
    assert parts(result)["nvfp4_quantize"]["left_because"] == "it runs through fp4_quantize, which differs"
    assert result["status"]["flashinfer_ops"]["gate"] == "proven"
    (warning,) = [line for line in result["warnings"] if "differs" in line]
    assert "fp4_quantize" in warning and "new parameter `x`" in warning and NEWER in warning
    assert "nvfp4_quantize, mxfp4_quantize" in warning


def test_a_renamed_cuda_version_lookup_is_skipped_with_a_warning_and_the_rest_applies(tmp_path):
    def rename(text):  # callers keep working through an alias, as a real rename would keep them
        text = replace("def get_cuda_version() -> Version:", "def get_nvcc_version() -> Version:")(text)
        return text + "\n\nget_cuda_version = get_nvcc_version\n"

    result = judged(tmp_path, {"jit/cpp_ext.py": rename})
    assert result["status"]["applied"]
    assert not result["shim"]["get_cuda_version"] and result["shim"]["fp4_quantize"]
    assert parts(result)["get_cuda_version"]["difference"] == "`flashinfer.jit.cpp_ext` no longer defines `get_cuda_version`"
    assert any(line.startswith("CUDA version: get_cuda_version differs") for line in result["status"]["skipped"])
    assert [line for line in result["warnings"] if "get_cuda_version differs" in line]


def test_a_family_member_whose_signature_changed_alone_stays_flashinfers(tmp_path):
    result = judged(tmp_path, {FP4: replace(
        "    sfLayout: SfLayout = SfLayout.layout_128x4,\n    *,\n    batch_invariant: bool = False,\n) -> Tuple[torch.Tensor, torch.Tensor]:\n    r\"\"\"Quantize input tensor to MXFP4",
        "    sfLayout: SfLayout = SfLayout.layout_8x4,\n    *,\n    batch_invariant: bool = False,\n) -> Tuple[torch.Tensor, torch.Tensor]:\n    r\"\"\"Quantize input tensor to MXFP4")})
    assert result["status"]["applied"]
    assert parts(result)["mxfp4_quantize"]["difference"] == (
        "default of `sfLayout` SfLayout.layout_128x4 -> SfLayout.layout_8x4")
    assert {name for name, shim in result["shim"].items() if not shim} == {"mxfp4_quantize"}
    assert result["status"]["family"]["mxfp4_quantize"].startswith("left as FlashInfer's: default of `sfLayout`")


@pytest.mark.parametrize("edit, named", [
    (replace("        block_scale_interleave_sm100=block_scale_interleave_sm100,\n", ""),
     "`block_scale_interleave_sm100` no longer returned"),
    (replace("    resolve_nvfp4_4over6,\n)", ")"),
     "`flashinfer.quantization.fp4_quantization` no longer has `resolve_nvfp4_4over6`"),
], ids=["namespace-entry", "module-function"])
def test_a_jit_getter_without_a_function_the_shim_binds_leaves_the_fp4_layer_and_names_it(tmp_path, edit, named):
    result = judged(tmp_path, {FP4: edit})
    assert result["status"]["applied"]
    getter = parts(result)["get_fp4_quantization_module"]
    assert not getter["matches"] and named in getter["difference"]
    shim = result["shim"]
    assert shim["get_cuda_version"] and not any(shim[name] for name in shim if name != "get_cuda_version")
    assert all(part["left_because"] for name, part in parts(result).items()
               if name not in ("get_cuda_version", "get_fp4_quantization_module"))
    assert result["status"]["flashinfer_ops"] is not None


REVERT_PROBE = """
import json, sys, types
import flashinfer, flashinfer.jit.cpp_ext
def bindings():
    return {(name, key): id(value) for name, module in list(sys.modules.items())
            if name.split(".")[0] == "flashinfer" and isinstance(module, types.ModuleType)
            for key, value in list(vars(module).items())}
before = bindings()
from _fp4_dynamo_shim import lifecycle
applied = lifecycle.apply()
during = bindings()
status = lifecycle.status()
lifecycle.revert()
after = bindings()
changed = sorted(f"{n}.{k}" for (n, k), v in before.items() if after.get((n, k)) != v)
print(json.dumps({"applied": applied, "rebound": len([k for k in before if during.get(k) != before[k]]),
                  "parts": status["flashinfer"]["parts"], "changed_after_revert": changed}))
"""


def test_revert_after_a_partial_apply_puts_back_every_name(tmp_path):
    result = judged(tmp_path, {FP4: replace("    *,\n    batch_invariant: bool = False,\n",
                                            "    x: int = 0,\n    *,\n    batch_invariant: bool = False,\n")},
                    code=REVERT_PROBE)
    assert result["applied"] and not result["parts"]["fp4_quantize"]["applied"]
    assert result["rebound"] > 0  # the rest was rebound...
    assert result["changed_after_revert"] == []  # ...and every name is FlashInfer's own object again
