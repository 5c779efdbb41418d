"""Tiny local configs of the two DSA model families (no downloads): DeepSeek-V3.2 and GLM-5.

MLA geometry is the real one (kv_lora_rank 512, rope 64); everything else is shrunk.
"""

from __future__ import annotations

import json
from pathlib import Path

COMMON = dict(
    vocab_size=256,
    hidden_size=256,
    intermediate_size=256,
    moe_intermediate_size=64,
    num_hidden_layers=2,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    q_lora_rank=64,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    index_n_heads=4,
    index_head_dim=128,
    index_topk=128,
    max_position_embeddings=4096,
)

MODELS = {
    # DeepSeek-V3.2: 128 heads (16 per GPU at TP8), qk_nope 128, v 128.
    "deepseek_v32": dict(
        COMMON,
        model_type="deepseek_v32",
        architectures=["DeepseekV32ForCausalLM"],
        num_attention_heads=16,
        num_key_value_heads=16,
        qk_nope_head_dim=128,
        v_head_dim=128,
    ),
    # GLM-5: 64 heads (8 per GPU at TP8), qk_nope 192, v 256.
    "glm_moe_dsa": dict(
        COMMON,
        model_type="glm_moe_dsa",
        architectures=["GlmMoeDsaForCausalLM"],
        num_attention_heads=8,
        num_key_value_heads=8,
        qk_nope_head_dim=192,
        v_head_dim=256,
    ),
}


def write_model_dir(root: Path, name: str) -> Path:
    """Write ``config.json`` of model family ``name`` under ``root/name`` via transformers."""
    from transformers import AutoConfig

    spec = dict(MODELS[name])
    model_type = spec.pop("model_type")
    config = AutoConfig.for_model(model_type, **spec)
    path = root / name
    config.save_pretrained(path)
    assert json.loads((path / "config.json").read_text())["model_type"] == model_type
    return path
