"""FlashInfer's declared ops proven on a GPU, per release: traced with no graph break, compiled equal to
eager bit for bit, replayed from a CUDA graph, clean under torch.library.opcheck, through the public
functions named (their eager cost is FlashInfer's own: the layer rebinds nothing). Read by the
declared-ops layer (``FP4_DYNAMO_SHIM_FLASHINFER_OPS=proven``), ``status()`` and verify.

Written by ``python tools/gpu/proven_record.py`` from a GPU run's JUnit XML; edit it only through that.
"""

#: What each release's record says of the run that measured it.
MEASURED = ('date', 'machine', 'torch', 'shim', 'functions_passed', 'functions_run')

#: FlashInfer release -> {each of MEASURED, "declarations": {key: {"module", "op", "functions"}}}
PROVEN = {
    '0.6.12': {
        'date': '2026-12-04, 2026-12-05',
        'machine': 'NVIDIA H200, NVIDIA H100 80GB HBM3',
        'torch': '2.11.0+cu130',
        'shim': '0f1c2b4, 1ce6143, 9077ffc',
        'functions_passed': 38,
        'functions_run': 38,
        'declarations': {
            'flashinfer.activation.get_act_and_mul_module._act_and_mul': {'module': 'flashinfer.activation', 'op': 'act_and_mul', 'functions': ['activation.silu_and_mul', 'activation.gelu_and_mul', 'activation.gelu_tanh_and_mul']},
            'flashinfer.cascade.merge_state': {'module': 'flashinfer.cascade', 'op': 'merge_state', 'functions': ['cascade.merge_state']},
            'flashinfer.cascade.merge_state_in_place': {'module': 'flashinfer.cascade', 'op': 'merge_state_in_place', 'functions': ['cascade.merge_state_in_place']},
            'flashinfer.cascade.merge_states': {'module': 'flashinfer.cascade', 'op': 'merge_states', 'functions': ['cascade.merge_states']},
            'flashinfer.decode.get_batch_decode_module.run_batch_decode': {'module': 'flashinfer.decode', 'op': 'batch_decode_run_batch_decode', 'functions': ['decode.BatchDecodeWithPagedKVCacheWrapper.run']},
            'flashinfer.decode.get_single_decode_module.run_single_decode': {'module': 'flashinfer.decode', 'op': 'run_single_decode', 'functions': ['decode.single_decode_with_kv_cache']},
            'flashinfer.fused_moe.fused_routing_dsv3.get_dsv3_fused_routing_module.NoAuxTc': {'module': 'flashinfer.fused_moe.fused_routing_dsv3', 'op': 'NoAuxTc', 'functions': ['fused_moe.fused_topk_deepseek']},
            'flashinfer.mla._core.get_batch_mla_module.run': {'module': 'flashinfer.mla._core', 'op': 'batch_mla_run', 'functions': ['mla.BatchMLAPagedAttentionWrapper.run']},
            'flashinfer.norm._gemma_rmsnorm_impl': {'module': 'flashinfer.norm', 'op': 'gemma_rmsnorm', 'functions': ['norm.gemma_rmsnorm']},
            'flashinfer.norm._rmsnorm_impl': {'module': 'flashinfer.norm', 'op': 'rmsnorm', 'functions': ['norm.rmsnorm']},
            'flashinfer.norm.fused_add_rmsnorm': {'module': 'flashinfer.norm', 'op': 'fused_add_rmsnorm', 'functions': ['norm.fused_add_rmsnorm']},
            'flashinfer.norm.fused_add_rmsnorm_quant': {'module': 'flashinfer.norm', 'op': 'fused_add_rmsnorm_quant', 'functions': ['norm.fused_add_rmsnorm_quant']},
            'flashinfer.norm.gemma_fused_add_rmsnorm': {'module': 'flashinfer.norm', 'op': 'gemma_fused_add_rmsnorm', 'functions': ['norm.gemma_fused_add_rmsnorm']},
            'flashinfer.norm.layernorm': {'module': 'flashinfer.norm', 'op': 'layernorm', 'functions': ['norm.layernorm']},
            'flashinfer.norm.rmsnorm_quant': {'module': 'flashinfer.norm', 'op': 'rmsnorm_quant', 'functions': ['norm.rmsnorm_quant']},
            'flashinfer.prefill.get_batch_prefill_module.paged_run': {'module': 'flashinfer.prefill', 'op': 'batch_prefill_paged_run', 'functions': ['decode.BatchDecodeWithPagedKVCacheWrapper.run', 'prefill.BatchPrefillWithPagedKVCacheWrapper.run']},
            'flashinfer.prefill.get_batch_prefill_module.ragged_run': {'module': 'flashinfer.prefill', 'op': 'batch_prefill_ragged_run', 'functions': ['prefill.BatchPrefillWithRaggedKVCacheWrapper.run']},
            'flashinfer.prefill.get_single_prefill_module.run_single_prefill': {'module': 'flashinfer.prefill', 'op': 'run_single_prefill', 'functions': ['prefill.single_prefill_with_kv_cache', 'decode.single_decode_with_kv_cache']},
            'flashinfer.rope._apply_llama31_rope_pos_ids': {'module': 'flashinfer.rope', 'op': 'apply_llama31_rope_pos_ids', 'functions': ['rope.apply_llama31_rope_pos_ids']},
            'flashinfer.rope._apply_rope': {'module': 'flashinfer.rope', 'op': 'apply_rope', 'functions': ['rope.apply_rope']},
            'flashinfer.rope._apply_rope_pos_ids': {'module': 'flashinfer.rope', 'op': 'apply_rope_pos_ids', 'functions': ['rope.apply_rope_pos_ids', 'rope.apply_rope_pos_ids_inplace']},
            'flashinfer.rope._apply_rope_pos_ids_cos_sin_cache': {'module': 'flashinfer.rope', 'op': 'apply_rope_pos_ids_cos_sin_cache', 'functions': ['rope.apply_rope_with_cos_sin_cache']},
            'flashinfer.sampling.get_sampling_module.min_p_sampling_from_probs': {'module': 'flashinfer.sampling', 'op': 'min_p_sampling_from_probs', 'functions': ['sampling.min_p_sampling_from_probs']},
            'flashinfer.sampling.get_sampling_module.sampling_from_logits': {'module': 'flashinfer.sampling', 'op': 'sampling_from_logits', 'functions': ['sampling.sampling_from_logits']},
            'flashinfer.sampling.get_sampling_module.sampling_from_probs': {'module': 'flashinfer.sampling', 'op': 'sampling_from_probs', 'functions': ['sampling.sampling_from_probs']},
            'flashinfer.sampling.get_sampling_module.softmax': {'module': 'flashinfer.sampling', 'op': 'softmax', 'functions': ['sampling.softmax']},
            'flashinfer.sampling.get_sampling_module.top_k_mask_logits': {'module': 'flashinfer.sampling', 'op': 'top_k_mask_logits', 'functions': ['sampling.top_k_mask_logits']},
            'flashinfer.sampling.get_sampling_module.top_k_renorm_probs': {'module': 'flashinfer.sampling', 'op': 'top_k_renorm_probs', 'functions': ['sampling.top_k_top_p_sampling_from_probs', 'sampling.top_k_renorm_probs']},
            'flashinfer.sampling.get_sampling_module.top_k_sampling_from_probs': {'module': 'flashinfer.sampling', 'op': 'top_k_sampling_from_probs', 'functions': ['sampling.top_k_sampling_from_probs']},
            'flashinfer.sampling.get_sampling_module.top_p_renorm_probs': {'module': 'flashinfer.sampling', 'op': 'top_p_renorm_probs', 'functions': ['sampling.top_p_renorm_probs']},
            'flashinfer.sampling.get_sampling_module.top_p_sampling_from_probs': {'module': 'flashinfer.sampling', 'op': 'top_p_sampling_from_probs', 'functions': ['sampling.top_p_sampling_from_probs', 'sampling.top_k_top_p_sampling_from_probs']},
            'flashinfer.topk.get_topk_module.radix_topk': {'module': 'flashinfer.topk', 'op': 'radix_topk', 'functions': ['topk.top_k']},
        },
    },
    '0.6.3': {
        'date': '2026-12-03',
        'machine': 'NVIDIA H200',
        'torch': '2.11.0+cu130',
        'shim': 'c94da3d',
        'functions_passed': 30,
        'functions_run': 30,
        'declarations': {
            'flashinfer.activation.get_act_and_mul_module._act_and_mul': {'module': 'flashinfer.activation', 'op': 'act_and_mul', 'functions': ['activation.silu_and_mul', 'activation.gelu_and_mul', 'activation.gelu_tanh_and_mul']},
            'flashinfer.cascade.merge_state': {'module': 'flashinfer.cascade', 'op': 'merge_state', 'functions': ['cascade.merge_state']},
            'flashinfer.cascade.merge_state_in_place': {'module': 'flashinfer.cascade', 'op': 'merge_state_in_place', 'functions': ['cascade.merge_state_in_place']},
            'flashinfer.cascade.merge_states': {'module': 'flashinfer.cascade', 'op': 'merge_states', 'functions': ['cascade.merge_states']},
            'flashinfer.fused_moe.fused_routing_dsv3.get_dsv3_fused_routing_module.NoAuxTc': {'module': 'flashinfer.fused_moe.fused_routing_dsv3', 'op': 'NoAuxTc', 'functions': ['fused_moe.fused_topk_deepseek']},
            'flashinfer.norm._gemma_rmsnorm': {'module': 'flashinfer.norm', 'op': 'gemma_rmsnorm', 'functions': ['norm.gemma_rmsnorm']},
            'flashinfer.norm._rmsnorm': {'module': 'flashinfer.norm', 'op': 'rmsnorm', 'functions': ['norm.rmsnorm']},
            'flashinfer.norm.fused_add_rmsnorm': {'module': 'flashinfer.norm', 'op': 'fused_add_rmsnorm', 'functions': ['norm.fused_add_rmsnorm']},
            'flashinfer.norm.fused_add_rmsnorm_quant': {'module': 'flashinfer.norm', 'op': 'fused_add_rmsnorm_quant', 'functions': ['norm.fused_add_rmsnorm_quant']},
            'flashinfer.norm.gemma_fused_add_rmsnorm': {'module': 'flashinfer.norm', 'op': 'gemma_fused_add_rmsnorm', 'functions': ['norm.gemma_fused_add_rmsnorm']},
            'flashinfer.norm.layernorm': {'module': 'flashinfer.norm', 'op': 'layernorm', 'functions': ['norm.layernorm']},
            'flashinfer.norm.rmsnorm_quant': {'module': 'flashinfer.norm', 'op': 'rmsnorm_quant', 'functions': ['norm.rmsnorm_quant']},
            'flashinfer.rope._apply_llama31_rope_pos_ids': {'module': 'flashinfer.rope', 'op': 'apply_llama31_rope_pos_ids', 'functions': ['rope.apply_llama31_rope_pos_ids']},
            'flashinfer.rope._apply_rope': {'module': 'flashinfer.rope', 'op': 'apply_rope', 'functions': ['rope.apply_rope']},
            'flashinfer.rope._apply_rope_pos_ids': {'module': 'flashinfer.rope', 'op': 'apply_rope_pos_ids', 'functions': ['rope.apply_rope_pos_ids', 'rope.apply_rope_pos_ids_inplace']},
            'flashinfer.rope._apply_rope_pos_ids_cos_sin_cache': {'module': 'flashinfer.rope', 'op': 'apply_rope_pos_ids_cos_sin_cache', 'functions': ['rope.apply_rope_with_cos_sin_cache']},
            'flashinfer.sampling.get_sampling_module.min_p_sampling_from_probs': {'module': 'flashinfer.sampling', 'op': 'min_p_sampling_from_probs', 'functions': ['sampling.min_p_sampling_from_probs']},
            'flashinfer.sampling.get_sampling_module.sampling_from_logits': {'module': 'flashinfer.sampling', 'op': 'sampling_from_logits', 'functions': ['sampling.sampling_from_logits']},
            'flashinfer.sampling.get_sampling_module.sampling_from_probs': {'module': 'flashinfer.sampling', 'op': 'sampling_from_probs', 'functions': ['sampling.sampling_from_probs']},
            'flashinfer.sampling.get_sampling_module.softmax': {'module': 'flashinfer.sampling', 'op': 'softmax', 'functions': ['sampling.softmax']},
            'flashinfer.sampling.get_sampling_module.top_k_mask_logits': {'module': 'flashinfer.sampling', 'op': 'top_k_mask_logits', 'functions': ['sampling.top_k_mask_logits']},
            'flashinfer.sampling.get_sampling_module.top_k_renorm_probs': {'module': 'flashinfer.sampling', 'op': 'top_k_renorm_probs', 'functions': ['sampling.top_k_top_p_sampling_from_probs', 'sampling.top_k_renorm_probs']},
            'flashinfer.sampling.get_sampling_module.top_k_sampling_from_probs': {'module': 'flashinfer.sampling', 'op': 'top_k_sampling_from_probs', 'functions': ['sampling.top_k_sampling_from_probs']},
            'flashinfer.sampling.get_sampling_module.top_p_renorm_probs': {'module': 'flashinfer.sampling', 'op': 'top_p_renorm_probs', 'functions': ['sampling.top_p_renorm_probs']},
            'flashinfer.sampling.get_sampling_module.top_p_sampling_from_probs': {'module': 'flashinfer.sampling', 'op': 'top_p_sampling_from_probs', 'functions': ['sampling.top_p_sampling_from_probs', 'sampling.top_k_top_p_sampling_from_probs']},
            'flashinfer.topk.get_topk_module.radix_topk': {'module': 'flashinfer.topk', 'op': 'radix_topk', 'functions': ['topk.top_k']},
        },
    },
}
