"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def tiny_llama() -> tuple[torch.nn.Module, torch.Tensor]:
    """A one-layer HF Llama (grouped-query attention, 32 wide) and a batch of token ids for it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config), torch.randint(0, 64, (2, 8))
