"""A Hugging Face model trained in a fused scope captures as one graph: the once-a-process
logger call on its loss path (``logger.warning_once``) is skipped by Dynamo, not a graph break
(workarounds.py's ``once_logging_out_of_graphs``), for the scope only."""

from __future__ import annotations

import pytest
import torch

from tpunb.fuse import FuseOptions, FusionEngine

transformers = pytest.importorskip("transformers")


def test_a_hugging_face_model_given_labels_captures_as_one_graph():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16)
    )
    ids = torch.randint(0, 64, (2, 16))
    engine = FusionEngine(torch.device("cpu"))
    breaks = sum(counters["graph_break"].values())
    graphs = counters["stats"]["unique_graphs"]
    ignored = set(torch._dynamo.config.ignore_logging_functions)
    with engine.scope(FuseOptions(hot_training=True, sync_compile=True), adopt=(model,)):
        for _ in range(5):
            model(input_ids=ids, labels=ids).loss.backward()
    assert torch._dynamo.config.ignore_logging_functions == ignored, "Dynamo's config is the user's again"
    assert model._compiled_call_impl.called, "the model ran compiled whole"
    assert counters["stats"]["unique_graphs"] - graphs == 1
    assert sum(counters["graph_break"].values()) == breaks
