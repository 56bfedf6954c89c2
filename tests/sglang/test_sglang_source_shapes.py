"""The readers of SGLang's source over hand-written files shaped as a future release might write them.

The 36 recorded releases (test_sglang_source_read_for_every_release.py) agree on details a reader could get wrong without any of them
showing it: the order of a call's keywords, an annotated assignment, a second phase in the backends table, a
decorator that is an attribute call, both bindings of ``fp4_quantize`` in one file, a requirement with a marker
that is not an extra. Each test here writes the smallest set of files that differ in that one detail and holds
``read_release`` (or ``pins``) to what the release would mean.
"""

from __future__ import annotations

import textwrap

from _fp4_dynamo_shim.sglang import source


def read(files: dict) -> dict:
    """``read_release`` over these files (path under ``sglang/srt/`` -> text); every other file is absent."""
    texts = {path: textwrap.dedent(text) for path, text in files.items()}
    return source.read_release(texts.get)


def test_a_compile_module_with_exactly_the_two_functions_is_the_driven_compile_path():
    facts = read({source.COMPILE: """
        def install_torch_compiled(module):
            pass

        def set_compiled(value):
            pass
        """})
    assert facts["compile_path"] is True
    assert read({source.COMPILE: "def install_torch_compiled(module):\n    pass\n"})["compile_path"] is False


def test_the_op_name_is_read_from_its_keyword_whatever_keywords_come_first():
    facts = read({source.FP4_UTILS: """
        from flashinfer import fp4_quantize as _flashinfer_fp4_quantize

        register_custom_op_from_extern(_flashinfer_fp4_quantize, eager=True, op_name="fp4_quantize")
        """})
    assert facts["fp4_quantize_op"] == "sglang::fp4_quantize"
    assert facts["fp4_quantize_op_at"] == f"{source.FP4_UTILS}:4"


OP_UTILS = """
    from flashinfer import fp4_quantize as _flashinfer_fp4_quantize

    register_custom_op_from_extern(_flashinfer_fp4_quantize, op_name="fp4_quantize")
    """


def test_a_modelopt_that_imports_sglangs_op_and_flashinfers_function_binds_the_op():
    """SGLang's op is what the layer calls when it imports it; a second, raw import of FlashInfer's function in
    the same file (for another use) does not make the binding module-global."""
    facts = read({source.FP4_UTILS: OP_UTILS, source.MODELOPT: """
        from sglang.srt.layers.quantization.fp4_utils import fp4_quantize
        from flashinfer import fp4_quantize as raw_fp4_quantize
        """})
    assert facts["fp4_quantize_binding"] == "sglang-op"
    assert facts["fp4_quantize_bound_at"] == f"{source.FP4_UTILS}:2"


GEMM = """
    from flashinfer import mm_fp4

    {decorator}
    def fp4_gemm(a, b):
        return mm_fp4(a, b)
    """


def test_only_sglangs_register_custom_op_makes_fp4_gemm_an_op():
    registered = read({source.MODELOPT: GEMM.format(decorator='@register_custom_op(mutates_args=[])')})
    assert (registered["mm_fp4_op"], registered["mm_fp4_op_at"]) == ("sglang::fp4_gemm", f"{source.MODELOPT}:5")
    other_call = read({source.MODELOPT: GEMM.format(decorator="@lru_cache(maxsize=None)")})
    assert other_call["mm_fp4_op"] is None and other_call["mm_fp4_bound_at"] == f"{source.MODELOPT}:2"


def test_a_decorator_called_through_a_module_is_read_without_failing():
    facts = read({source.MODELOPT: GEMM.format(decorator="@functools.lru_cache(maxsize=None)")})
    assert facts["mm_fp4_op"] is None and facts["mm_fp4_bound_at"] == f"{source.MODELOPT}:2"


BACKENDS = """
    from enum import Enum

    class Backend(Enum):
        FULL = 1
        TC_PIECEWISE = 2

    config.debug = False
    ALLOWED_BACKENDS_PER_PHASE{annotation} = {{
        Phase.DECODE: (Backend.FULL,),
        Phase.PREFILL: ({prefill}),
    }}
    """


def test_the_prefill_backends_are_read_from_the_prefill_entry_of_an_annotated_or_plain_table():
    for annotation in ("", ": dict"):
        selectable = read({source.CUDA_GRAPH_CONFIG: BACKENDS.format(
            annotation=annotation, prefill="Backend.FULL, Backend.TC_PIECEWISE")})
        assert selectable["tc_piecewise"] == "opt-in", annotation
        gone = read({source.CUDA_GRAPH_CONFIG: BACKENDS.format(annotation=annotation, prefill="Backend.FULL,")})
        assert gone["tc_piecewise"] == "removed", annotation


def test_a_config_without_a_cuda_default_has_no_default_prefill_graph():
    facts = read({source.CUDA_GRAPH_CONFIG: BACKENDS.format(annotation="", prefill="Backend.TC_PIECEWISE,")})
    assert (facts["prefill_graph_default"], facts["prefill_graph_default_at"]) == (None, None)


def test_pins_skip_only_extras_and_read_past_them():
    requirements = ['transformers==4.0; extra == "dev"', 'torch==2.9.1; platform_system == "Linux"',
                    "flashinfer_python==0.6.3"]
    assert source.pins(requirements) == {"torch": "2.9.1", "flashinfer-python": "0.6.3", "sglang-kernel": None,
                                         "transformers": None}
