"""The bf16 fused-MoE call both MoE op tests make (trtllm's and prims_ts's take the same routing and weights)."""

from __future__ import annotations

import torch

#: A small MoE: tokens, hidden size, experts, intermediate size, experts per token.
TOKENS, HIDDEN, EXPERTS, INTERMEDIATE, TOP_K = 4, 128, 8, 64, 2


def bf16_moe_arguments(**extra) -> dict:
    """The keyword arguments of a bf16 MoE call over seeded inputs, with ``extra`` added or replacing."""
    generator = torch.Generator().manual_seed(0)
    return dict(routing_logits=torch.randn(TOKENS, EXPERTS, generator=generator), routing_bias=None,
                hidden_states=torch.randn(TOKENS, HIDDEN, generator=generator).to(torch.bfloat16),
                gemm1_weights=torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, generator=generator).to(torch.bfloat16),
                gemm2_weights=torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, generator=generator).to(torch.bfloat16),
                num_experts=EXPERTS, top_k=TOP_K, n_group=None, topk_group=None, intermediate_size=INTERMEDIATE,
                local_expert_offset=0, local_num_experts=EXPERTS, **{"do_finalize": False, **extra})
