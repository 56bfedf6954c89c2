"""The newest tested FlashInfer release's sources, as ``release_parts`` compares an untested release with them.

Written by ``python tools/release_parts.py --record`` with that release installed; edit it only through that.
"""

RECORD = {
    'flashinfer': '0.7.4',
    'parts': {
        'block_scale_interleave': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['get_fp4_quantization_module'],
                'signature': [
                    ['unswizzled_sf', 'POSITIONAL_OR_KEYWORD', ''],
                    ['out', 'KEYWORD_ONLY', 'None'],
                ],
                'source': '2feaeb53c1694c9a',
            },
            'names': {},
        },
        'e2m1_and_ufp8sf_scale_to_float': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['get_fp4_quantization_module'],
                'signature': [
                    ['e2m1_tensor', 'POSITIONAL_OR_KEYWORD', ''],
                    ['ufp8_scale_tensor', 'POSITIONAL_OR_KEYWORD', ''],
                    ['global_scale_tensor', 'POSITIONAL_OR_KEYWORD', 'None'],
                    ['sf_vec_size', 'POSITIONAL_OR_KEYWORD', '16'],
                    ['ufp8_type', 'POSITIONAL_OR_KEYWORD', '1'],
                    ['is_sf_swizzled_layout', 'POSITIONAL_OR_KEYWORD', 'True'],
                    ['is_sf_8x4_layout', 'POSITIONAL_OR_KEYWORD', 'False'],
                ],
                'source': 'c501ce5cac1e7de2',
            },
            'names': {},
        },
        'fp4_quantize': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['get_fp4_quantization_module'],
                'signature': [
                    ['input', 'POSITIONAL_OR_KEYWORD', ''],
                    ['global_scale', 'POSITIONAL_OR_KEYWORD', 'None'],
                    ['sf_vec_size', 'POSITIONAL_OR_KEYWORD', '16'],
                    ['sf_use_ue8m0', 'POSITIONAL_OR_KEYWORD', 'False'],
                    ['is_sf_swizzled_layout', 'POSITIONAL_OR_KEYWORD', 'True'],
                    ['is_sf_8x4_layout', 'POSITIONAL_OR_KEYWORD', 'False'],
                    ['is_global_scale_inversed', 'POSITIONAL_OR_KEYWORD', 'False'],
                    ['enable_pdl', 'POSITIONAL_OR_KEYWORD', 'None'],
                    ['backend', 'POSITIONAL_OR_KEYWORD', "'auto'"],
                    ['nvfp4_4over6', 'POSITIONAL_OR_KEYWORD', '_UNSET'],
                    ['batch_invariant', 'KEYWORD_ONLY', 'False'],
                ],
                'source': 'daa86ed57f13d756',
            },
            'names': {},
        },
        'get_cuda_version': {
            'function': {
                'module': 'flashinfer.jit.cpp_ext',
                'signature': [],
            },
            'names': {
                'is_cuda_version_at_least': True,
            },
        },
        'get_fp4_quantization_module': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['mxfp4_dequantize_host'],
                'signature': [
                    ['backend', 'POSITIONAL_OR_KEYWORD', "'100'"],
                ],
                'source': '0e756917dcf8f318',
            },
            'names': {
                'SfLayout': True,
                'nvfp4_4over6_code': True,
                'nvfp4_4over6_from_code': True,
                'resolve_nvfp4_4over6': True,
            },
            'returns': {
                'block_scale_interleave_sm100': True,
                'e2m1_and_ufp8sf_scale_to_float_sm100': True,
                'fp4_batched_quantize_sm100': True,
                'fp4_quantize_sm100': True,
                'mxfp4_dequantize_host': True,
                'scaled_fp4_grouped_quant_sm100': True,
                'silu_and_mul_scaled_nvfp4_experts_quantize_sm100': True,
            },
        },
        'mm_fp4': {
            'function': {
                'module': 'flashinfer.gemm.gemm_base',
                'reaches': [],
                'signature': [
                    ['a', 'POSITIONAL_OR_KEYWORD', ''],
                    ['b', 'POSITIONAL_OR_KEYWORD', ''],
                    ['a_descale', 'POSITIONAL_OR_KEYWORD', ''],
                    ['b_descale', 'POSITIONAL_OR_KEYWORD', ''],
                    ['alpha', 'POSITIONAL_OR_KEYWORD', 'None'],
                    ['out_dtype', 'POSITIONAL_OR_KEYWORD', 'torch.bfloat16'],
                    ['out', 'POSITIONAL_OR_KEYWORD', 'None'],
                    ['block_size', 'POSITIONAL_OR_KEYWORD', '16'],
                    ['use_8x4_sf_layout', 'POSITIONAL_OR_KEYWORD', 'False'],
                    ['backend', 'POSITIONAL_OR_KEYWORD', "'auto'"],
                    ['use_nvfp4', 'POSITIONAL_OR_KEYWORD', 'True'],
                    ['enable_pdl', 'POSITIONAL_OR_KEYWORD', 'True'],
                    ['batch_invariant', 'KEYWORD_ONLY', 'False'],
                ],
                'source': 'f983099ad9478133',
            },
            'names': {},
        },
        'mxfp4_dequantize': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['e2m1_and_ufp8sf_scale_to_float'],
                'signature': [
                    ['a_fp4', 'POSITIONAL_OR_KEYWORD', ''],
                    ['a_sf', 'POSITIONAL_OR_KEYWORD', ''],
                    ['sfLayout', 'POSITIONAL_OR_KEYWORD', 'SfLayout.layout_128x4'],
                ],
                'source': '026e2d4807cc38e4',
            },
            'names': {},
        },
        'mxfp4_dequantize_host': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['get_fp4_quantization_module'],
                'signature': [
                    ['weight', 'POSITIONAL_OR_KEYWORD', ''],
                    ['scale', 'POSITIONAL_OR_KEYWORD', ''],
                    ['group_size', 'POSITIONAL_OR_KEYWORD', '32'],
                ],
                'source': '031d8553ae9fbc82',
            },
            'names': {},
        },
        'mxfp4_quantize': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['fp4_quantize'],
                'signature': [
                    ['a', 'POSITIONAL_OR_KEYWORD', ''],
                    ['backend', 'POSITIONAL_OR_KEYWORD', "'auto'"],
                    ['enable_pdl', 'POSITIONAL_OR_KEYWORD', 'None'],
                    ['sfLayout', 'POSITIONAL_OR_KEYWORD', 'SfLayout.layout_128x4'],
                    ['batch_invariant', 'KEYWORD_ONLY', 'False'],
                ],
                'source': '4fc0ede4fcb39c2f',
            },
            'names': {},
        },
        'nvfp4_batched_quantize': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['get_fp4_quantization_module'],
                'signature': [
                    ['a', 'POSITIONAL_OR_KEYWORD', ''],
                    ['a_global_sf', 'POSITIONAL_OR_KEYWORD', ''],
                    ['sf_vec_size', 'POSITIONAL_OR_KEYWORD', '16'],
                    ['nvfp4_4over6', 'POSITIONAL_OR_KEYWORD', '_UNSET'],
                ],
                'source': '1875f24a05ed36ed',
            },
            'names': {},
        },
        'nvfp4_quantize': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['block_scale_interleave', 'fp4_quantize', 'get_fp4_quantization_module'],
                'signature': [
                    ['a', 'POSITIONAL_OR_KEYWORD', ''],
                    ['a_global_sf', 'POSITIONAL_OR_KEYWORD', ''],
                    ['sfLayout', 'POSITIONAL_OR_KEYWORD', 'SfLayout.layout_128x4'],
                    ['do_shuffle', 'POSITIONAL_OR_KEYWORD', 'False'],
                    ['sf_vec_size', 'POSITIONAL_OR_KEYWORD', '16'],
                    ['enable_pdl', 'POSITIONAL_OR_KEYWORD', 'None'],
                    ['backend', 'POSITIONAL_OR_KEYWORD', "'auto'"],
                    ['per_token_activation', 'POSITIONAL_OR_KEYWORD', 'False'],
                    ['expanded_idx_to_permuted_idx', 'POSITIONAL_OR_KEYWORD', 'None'],
                    ['out_scale', 'POSITIONAL_OR_KEYWORD', 'None'],
                    ['nvfp4_4over6', 'POSITIONAL_OR_KEYWORD', '_UNSET'],
                    ['batch_invariant', 'KEYWORD_ONLY', 'False'],
                ],
                'source': '0b7115ed37d30f9c',
            },
            'names': {},
        },
        'scaled_fp4_grouped_quantize': {
            'function': {
                'module': 'flashinfer.quantization.fp4_quantization',
                'reaches': ['get_fp4_quantization_module'],
                'signature': [
                    ['a', 'POSITIONAL_OR_KEYWORD', ''],
                    ['mask', 'POSITIONAL_OR_KEYWORD', ''],
                    ['a_global_sf', 'POSITIONAL_OR_KEYWORD', ''],
                    ['nvfp4_4over6', 'POSITIONAL_OR_KEYWORD', '_UNSET'],
                ],
                'source': '549fbad252c5014d',
            },
            'names': {},
        },
        'silu_and_mul_scaled_nvfp4_experts_quantize': {
            'function': {
                'module': 'flashinfer.activation',
                'reaches': [],
                'signature': [
                    ['a', 'POSITIONAL_OR_KEYWORD', ''],
                    ['mask', 'POSITIONAL_OR_KEYWORD', ''],
                    ['a_global_sf', 'POSITIONAL_OR_KEYWORD', ''],
                    ['nvfp4_4over6', 'POSITIONAL_OR_KEYWORD', '_UNSET'],
                ],
                'source': '9bb99123682edd67',
            },
            'names': {},
        },
    },
}
