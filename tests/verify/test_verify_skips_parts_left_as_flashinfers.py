"""verify on a FlashInfer newer than the tested range whose ``fp4_quantize`` differs (a new parameter): it names
the parts left as FlashInfer's, skips each check that exercises ``fp4_quantize`` through the shim, saying why,
and still checks what was applied.

One run of ``python -m fp4_dynamo_shim.verify`` in a fresh interpreter, against a copy of the installed (newest
tested) release that says it is 0.7.9 with that one edit (tests/support/simulated_release.py).
"""

from __future__ import annotations

import re

import pytest

import simulated_release
from simulated_release import replace

# The copy is of the newest tested release whatever is installed; verify's worker check starts two interpreters.
pytestmark = [pytest.mark.release_independent, pytest.mark.slow]

NEWER = "0.7.9"
#: Why a check of fp4_quantize does not run: the part it needs is FlashInfer's own here.
LEFT = "fp4_quantize is left as FlashInfer's on this release (new parameter `x`)"
CHECK_LINE = re.compile(r"^  (PASS|FAIL|SKIP|INFO)  (\S+) +(.*) \[\d+\.\d s\]$")


@pytest.fixture(scope="module")
def verify(tmp_path_factory):
    """verify's text report and exit status, with ``results``: check name -> (result, detail) as printed."""
    if simulated_release.TESTED != "0.7.4":
        pytest.skip(f"the edit is written against 0.7.4's sources; {simulated_release.TESTED} is installed")
    folder = simulated_release.make(tmp_path_factory.mktemp("release"), NEWER, {
        "quantization/fp4_quantization.py": replace("    *,\n    batch_invariant: bool = False,\n",
                                                    "    x: int = 0,\n    *,\n    batch_invariant: bool = False,\n")})
    completed = simulated_release.run(folder, ["-m", "fp4_dynamo_shim.verify"])
    lines = [CHECK_LINE.match(line) for line in completed.stdout.splitlines()]
    completed.results = {match[2]: (match[1], match[3]) for match in lines if match}
    return completed


def test_verify_says_which_parts_are_left_and_passes(verify):
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
    out = verify.stdout
    assert f"  flashinfer   {NEWER} (newer than the tested range: flashinfer-python >=0.5.3, <=0.7.4)" in out
    assert (f"FlashInfer {NEWER} is newer than the tested range (flashinfer-python >=0.5.3, <=0.7.4); 12 of 13 parts "
            "match 0.7.4's; `fp4_quantize` differs (new parameter `x`); `nvfp4_quantize` (it runs through "
            "fp4_quantize, which differs); `mxfp4_quantize` (it runs through fp4_quantize, which differs); left as "
            "FlashInfer's") in out


def test_the_cuda_graph_check_is_skipped_because_fp4_quantize_is_left_as_flashinfers(verify):
    """On CPU the check would skip anyway (CUDA graphs need a GPU): the reason shows which skip it was."""
    assert verify.results["cuda-graph"] == ("SKIP", LEFT)


def test_every_check_of_fp4_quantize_is_skipped_saying_why_and_what_was_applied_is_still_checked(verify):
    of_fp4_quantize = ("trace-static", "trace-dynamic", "compiled-vs-eager", "cuda-graph", "flashinfer-op",
                       "sglang-compile")
    assert {name: verify.results[name] for name in of_fp4_quantize} == dict.fromkeys(of_fp4_quantize, ("SKIP", LEFT))
    assert verify.results["opcheck"][0] == verify.results["family"][0] == "PASS"  # the shim's op and family
    assert all(detail != LEFT for name, (_, detail) in verify.results.items() if name not in of_fp4_quantize)
