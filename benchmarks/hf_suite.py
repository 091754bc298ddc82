"""Hugging Face models built from configs, the way PyTorch's dynamo harness builds them.

``benchmarks/dynamo/huggingface.py`` builds each model as ``model_cls(config_cls())`` with
random weights and feeds it ``randint(0, vocab_size, (batch, seq))``; nothing is downloaded.
This module does the same at two sizes of our own (the harness's default configs are the
full-size checkpoints, far too slow for a 2-core CPU), so the benchmark
(``benchmarks/models.py``) and tests share one model list:

    from benchmarks.hf_suite import MODELS, build, loss_of
    model, inputs = build("bert", "tiny", torch.device("cpu"))
    loss = loss_of(model(**inputs), inputs)

Every family of the harness's ``huggingface_models_list.txt`` is here, one head each (the
harness runs several heads of some families: BertForMaskedLM and BertForQuestionAnswering ...),
its LLM entries as the same architectures from configs (Llama, Qwen3, Gemma 2 and 3, Mistral,
gpt-oss, Whisper; the harness times ``generate()`` on them, we time training and forward), plus
Qwen2, Gemma, Phi-3 and vision models (ViT, ResNet, ConvNeXt). All of them build and run with
transformers 5.24 at both sizes; none had to be left out.

The table is data, not code: each entry names a ``transformers`` class, how its config spells
hidden size, layer and head counts (``FAMILY`` mappings: BERT says ``hidden_size``, GPT-2
``n_embd``, BART ``d_model``), what inputs its head takes (``kind``) and the few overrides its
architecture needs. Like the harness, every float config attribute with "drop" in its name is
set to 0 (dropout, attention dropout, layerdrop, drop path) so that training is deterministic
and comparable across modes, and ``use_cache`` is off.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

# --- sizes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """The generic dimensions one size gives every architecture (each maps them to its own names)."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int  # small, so the embedding and LM head do not dominate the step
    batch: int
    seq: int
    image: int  # square image side for vision models

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_heads(self) -> int:
        """Grouped-query attention (as Llama 3, Qwen, Mistral use) with two query heads per KV head."""
        return max(1, self.heads // 2)

    @property
    def positions(self) -> int:
        # Roberta-style models offset positions by padding_idx + 1: leave headroom over seq.
        return 2 * self.seq


SIZES: dict[str, Size] = {
    # op-bound: tiny matmuls, so per-op overhead (dispatch, Python) is most of the step
    "tiny": Size(hidden=64, layers=2, heads=4, ffn=256, vocab=1000, batch=4, seq=32, image=32),
    # compute-bound at one CPU thread: 512 tokens through 256-wide layers, matmuls dominate
    "small": Size(hidden=256, layers=2, heads=4, ffn=1024, vocab=2000, batch=4, seq=128, image=64),
}

# --- how configs name the generic dimensions --------------------------------------------------

Names = Mapping[str, str | tuple[str, ...]]

BERT: Names = {
    "hidden": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "ffn": "intermediate_size",
    "vocab": "vocab_size",
    "positions": "max_position_embeddings",
}
DECODER: Names = {**BERT, "kv_heads": "num_key_value_heads", "head_dim": "head_dim"}  # Llama and kin
BART: Names = {
    "hidden": "d_model",
    "layers": ("encoder_layers", "decoder_layers"),
    "heads": ("encoder_attention_heads", "decoder_attention_heads"),
    "ffn": ("encoder_ffn_dim", "decoder_ffn_dim"),
    "vocab": "vocab_size",
    "positions": "max_position_embeddings",
}
T5: Names = {
    "hidden": "d_model",
    "layers": ("num_layers", "num_decoder_layers"),
    "heads": "num_heads",
    "ffn": "d_ff",
    "head_dim": "d_kv",
    "vocab": "vocab_size",
}
GPT2: Names = {
    "hidden": "n_embd",
    "layers": "n_layer",
    "heads": "n_head",
    "ffn": "n_inner",
    "vocab": "vocab_size",
    "positions": "n_positions",
}
DISTILBERT: Names = {
    "hidden": "dim",
    "layers": "n_layers",
    "heads": "n_heads",
    "ffn": "hidden_dim",
    "vocab": "vocab_size",
    "positions": "max_position_embeddings",
}
XLNET: Names = {
    "hidden": "d_model",
    "layers": "n_layer",
    "heads": "n_head",
    "ffn": "d_inner",
    "head_dim": "d_head",
    "vocab": "vocab_size",
}
GPT_NEO: Names = {
    "hidden": "hidden_size",
    "layers": "num_layers",
    "heads": "num_heads",
    "ffn": "intermediate_size",
    "vocab": "vocab_size",
    "positions": "max_position_embeddings",
}
OPT: Names = {**BERT, "ffn": "ffn_dim"}
XGLM: Names = {
    "hidden": "d_model",
    "layers": "num_layers",
    "heads": "attention_heads",
    "ffn": "ffn_dim",
    "vocab": "vocab_size",
    "positions": "max_position_embeddings",
}
TROCR: Names = {
    "hidden": "d_model",
    "layers": "decoder_layers",
    "heads": "decoder_attention_heads",
    "ffn": "decoder_ffn_dim",
    "vocab": "vocab_size",
    "positions": "max_position_embeddings",
}
VIT: Names = {
    "hidden": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "ffn": "intermediate_size",
    "image": "image_size",
}
CNN: Names = {"image": "image_size"}  # stage widths and depths are lists: see the entries' extra

# --- the model table --------------------------------------------------------------------------

#: What inputs a head takes (and which of them are labels).
KINDS = ("lm", "seq2seq", "qa", "cls", "image", "speech")
LABEL_KEYS = ("labels", "start_positions", "end_positions")
IMAGE_LABELS = 10


def _none(size: Size) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class ModelSpec:
    """One benchmark entry: a transformers class, its config's names for the sizes, its inputs."""

    model_cls: str  # a class exported by ``transformers``; its ``config_class`` builds the config
    names: Names
    kind: str  # one of KINDS
    extra: Callable[[Size], dict[str, Any]] = field(default=_none)  # applied after ``names``
    harness: str = ""  # the entry of huggingface_models_list.txt it stands for, if any


def _half_embedding(size: Size) -> dict[str, Any]:
    return {"embedding_size": size.hidden // 2}


MODELS: dict[str, ModelSpec] = {
    # encoders (masked LM, QA, classification heads)
    "bert": ModelSpec("BertForMaskedLM", BERT, "lm", harness="BertForMaskedLM"),
    "albert": ModelSpec("AlbertForMaskedLM", BERT, "lm", _half_embedding, harness="AlbertForMaskedLM"),
    "distilbert": ModelSpec(
        "DistilBertForQuestionAnswering", DISTILBERT, "qa", harness="DistilBertForQuestionAnswering"
    ),
    "roberta": ModelSpec(
        "RobertaForCausalLM", BERT, "lm", lambda s: {"is_decoder": True}, harness="RobertaForCausalLM"
    ),
    "camembert": ModelSpec("CamembertForMaskedLM", BERT, "lm", harness="CamemBert"),
    "electra": ModelSpec(
        "ElectraForCausalLM",
        BERT,
        "lm",
        lambda s: {**_half_embedding(s), "is_decoder": True},
        harness="ElectraForCausalLM",
    ),
    "mobilebert": ModelSpec(
        "MobileBertForMaskedLM",
        BERT,
        "lm",
        # bottlenecked blocks: attention and FFN run at half width (true_hidden_size)
        lambda s: {
            "embedding_size": s.hidden // 2,
            "intra_bottleneck_size": s.hidden // 2,
            "intermediate_size": 2 * s.hidden,
        },
        harness="MobileBertForMaskedLM",
    ),
    "deberta-v2": ModelSpec(
        "DebertaV2ForMaskedLM",
        BERT,
        "lm",
        # disentangled relative attention, as the released DeBERTa-v2/v3 checkpoints use
        lambda s: {"relative_attention": True, "pos_att_type": ["p2c", "c2p"], "position_buckets": 16},
        harness="DebertaV2ForMaskedLM",
    ),
    "layoutlm": ModelSpec(
        "LayoutLMForMaskedLM",
        BERT,
        "lm",
        lambda s: {"max_2d_position_embeddings": 128},  # bbox defaults to zeros
        harness="LayoutLMForMaskedLM",
    ),
    "megatron-bert": ModelSpec(
        "MegatronBertForQuestionAnswering", BERT, "qa", harness="MegatronBertForQuestionAnswering"
    ),
    "convbert": ModelSpec(
        "ConvBertForMaskedLM", BERT, "lm", lambda s: {"embedding_size": s.hidden}, harness="YituTechConvBert"
    ),
    "fnet": ModelSpec("FNetForMaskedLM", BERT, "lm", harness="GoogleFnet"),  # FFT mixing, no attention
    "longformer": ModelSpec(
        "LongformerForMaskedLM",
        BERT,
        "lm",
        lambda s: {"attention_window": s.seq // 2},  # sliding-window attention really windows
        harness="AllenaiLongformerBase",
    ),
    "reformer": ModelSpec(
        "ReformerForMaskedLM",
        BERT,
        "lm",
        # local and LSH (hashed) attention; axial position embeddings factor seq into two axes
        lambda s: {
            "attn_layers": ["local", "lsh"] * (s.layers // 2),
            "attention_head_size": s.head_dim,
            "feed_forward_size": s.ffn,
            "axial_pos_shape": [8, s.seq // 8],
            "axial_pos_embds_dim": [s.hidden // 2, s.hidden // 2],
            "max_position_embeddings": s.seq,
            "local_attn_chunk_length": s.seq // 4,
            "lsh_attn_chunk_length": s.seq // 4,
            "num_buckets": 4,
            "is_decoder": False,
            "hash_seed": 0,  # fixed rotations: without it every forward hashes differently
        },
        harness="Reformer",
    ),
    "xlnet": ModelSpec(
        "XLNetLMHeadModel",
        XLNET,
        "lm",
        lambda s: {"use_mems_eval": False, "use_mems_train": False},  # mems are XLNet's KV cache
        harness="XLNetLMHeadModel",
    ),
    # classic decoders
    "gpt2": ModelSpec("GPT2LMHeadModel", GPT2, "lm", harness="DistillGPT2"),
    "gpt2-cls": ModelSpec(
        "GPT2ForSequenceClassification",
        GPT2,
        "cls",
        lambda s: {"pad_token_id": 0},  # as the harness: batches > 1 need a pad token
        harness="GPT2ForSequenceClassification",
    ),
    "gptj": ModelSpec(
        "GPTJForCausalLM", GPT2, "lm", lambda s: {"rotary_dim": s.head_dim // 2}, "GPTJForCausalLM"
    ),
    "gpt-neo": ModelSpec(
        "GPTNeoForCausalLM",
        GPT_NEO,
        "lm",
        lambda s: {"attention_types": [[["global", "local"], s.layers // 2]], "window_size": s.seq // 2},
        harness="GPTNeoForCausalLM",
    ),
    "opt": ModelSpec(
        "OPTForCausalLM", OPT, "lm", lambda s: {"word_embed_proj_dim": s.hidden}, "OPTForCausalLM"
    ),
    "xglm": ModelSpec("XGLMForCausalLM", XGLM, "lm", harness="XGLMForCausalLM"),
    "trocr": ModelSpec("TrOCRForCausalLM", TROCR, "lm", harness="TrOCRForCausalLM"),
    # encoder-decoders (decoder inputs and labels)
    "t5": ModelSpec("T5ForConditionalGeneration", T5, "seq2seq", harness="T5ForConditionalGeneration"),
    "mt5": ModelSpec("MT5ForConditionalGeneration", T5, "seq2seq", harness="MT5ForConditionalGeneration"),
    "bart": ModelSpec(
        "BartForConditionalGeneration", BART, "seq2seq", harness="BartForConditionalGeneration"
    ),
    "mbart": ModelSpec(
        "MBartForConditionalGeneration", BART, "seq2seq", harness="MBartForConditionalGeneration"
    ),
    "plbart": ModelSpec(
        "PLBartForConditionalGeneration", BART, "seq2seq", harness="PLBartForConditionalGeneration"
    ),
    "pegasus": ModelSpec(
        "PegasusForConditionalGeneration", BART, "seq2seq", harness="PegasusForConditionalGeneration"
    ),
    "blenderbot": ModelSpec(
        "BlenderbotForConditionalGeneration", BART, "seq2seq", harness="BlenderbotForConditionalGeneration"
    ),
    "blenderbot-small": ModelSpec(
        "BlenderbotSmallForConditionalGeneration",
        BART,
        "seq2seq",
        harness="BlenderbotSmallForConditionalGeneration",
    ),
    "m2m100": ModelSpec(
        "M2M100ForConditionalGeneration", BART, "seq2seq", harness="M2M100ForConditionalGeneration"
    ),
    # current decoder LMs (RMSNorm, rotary embeddings, gated MLPs, grouped-query attention)
    "llama": ModelSpec("LlamaForCausalLM", DECODER, "lm", harness="meta-llama/Llama-3.2-1B"),
    "qwen2": ModelSpec("Qwen2ForCausalLM", DECODER, "lm"),
    "qwen3": ModelSpec("Qwen3ForCausalLM", DECODER, "lm", harness="Qwen/Qwen3-0.6B"),
    "gemma": ModelSpec("GemmaForCausalLM", DECODER, "lm"),
    "gemma2": ModelSpec(
        "Gemma2ForCausalLM",
        DECODER,
        "lm",
        # logit soft-capping in attention and head, local and global layers alternating
        lambda s: {"query_pre_attn_scalar": s.head_dim, "sliding_window": s.seq // 2},
        harness="google/gemma-2-2b",
    ),
    "gemma3": ModelSpec(
        "Gemma3ForCausalLM",
        DECODER,
        "lm",
        # local (sliding-window) and global layers, as Gemma 3 interleaves them
        lambda s: {
            "query_pre_attn_scalar": s.head_dim,
            "sliding_window": s.seq // 2,
            "layer_types": ["sliding_attention", "full_attention"] * (s.layers // 2),
        },
        harness="google/gemma-3-4b-it",
    ),
    "mistral": ModelSpec("MistralForCausalLM", DECODER, "lm", harness="mistralai/Mistral-7B-Instruct-v0.3"),
    "gpt-oss": ModelSpec(
        "GptOssForCausalLM",
        DECODER,
        "lm",
        # mixture of experts (top-2 of 4 here), sliding-window and full layers alternating
        lambda s: {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": s.seq // 2},
        harness="openai/gpt-oss-20b",
    ),
    "phi3": ModelSpec(
        "Phi3ForCausalLM", DECODER, "lm", lambda s: {"original_max_position_embeddings": s.positions}
    ),
    # speech: log-mel features into the encoder (two conv layers halve 2 * seq frames to seq)
    "whisper": ModelSpec(
        "WhisperForConditionalGeneration",
        BART,
        "speech",
        lambda s: {"max_source_positions": s.seq, "max_target_positions": s.positions, "num_mel_bins": 80},
        harness="openai/whisper-tiny",
    ),
    # vision (pixel_values and class labels)
    "vit": ModelSpec(
        "ViTForImageClassification", VIT, "image", lambda s: {"patch_size": 8, "num_labels": IMAGE_LABELS}
    ),
    "resnet": ModelSpec(
        "ResNetForImageClassification",
        CNN,
        "image",
        lambda s: {
            "embedding_size": s.hidden // 4,
            "hidden_sizes": [s.hidden // 4, s.hidden // 2],
            "depths": [1] * s.layers,
            "layer_type": "basic",
            "num_labels": IMAGE_LABELS,
        },
    ),
    "convnext": ModelSpec(
        "ConvNextForImageClassification",
        CNN,
        "image",
        lambda s: {
            "num_stages": s.layers,
            "hidden_sizes": [s.hidden // 2, s.hidden],
            "depths": [1] * s.layers,
            "num_labels": IMAGE_LABELS,
        },
    ),
}

# --- building ---------------------------------------------------------------------------------

_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id")


def model_class(name: str) -> type[torch.nn.Module]:
    return getattr(importlib.import_module("transformers"), MODELS[name].model_cls)


def config_for(name: str, size: str | Size) -> Any:
    """The model's config at this size: dimensions, no dropout, no KV cache, token ids in range."""
    spec, dims = MODELS[name], SIZES[size] if isinstance(size, str) else size
    overrides: dict[str, Any] = {}
    for key, attrs in spec.names.items():
        for attr in (attrs,) if isinstance(attrs, str) else attrs:
            overrides[attr] = getattr(dims, key)
    overrides.update(spec.extra(dims))
    config_cls = model_class(name).config_class
    # Default special-token ids index the full-size vocabulary (GPT-2's 50256, Phi-3's 32000);
    # configs are dataclass-like, so the class holds the defaults to check before building.
    for attr in _TOKEN_IDS:
        default = overrides.get(attr, getattr(config_cls, attr, None))
        if isinstance(default, int) and default >= dims.vocab:
            overrides[attr] = dims.vocab - 1
    config = config_cls(**overrides)
    # As the harness does: dropout of every kind off, so two runs and two modes can match.
    for attr, value in config.to_dict().items():
        if "drop" in attr and isinstance(value, float):
            setattr(config, attr, 0.0)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    return config


def make_inputs(
    name: str,
    size: str | Size,
    config: Any,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """The harness's inputs: random token ids (and labels) from a fixed generator."""
    spec, dims = MODELS[name], SIZES[size] if isinstance(size, str) else size
    gen = torch.Generator().manual_seed(seed)
    b, s = dims.batch, dims.seq

    def tokens(high: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=gen, dtype=torch.int64)

    if spec.kind == "image":
        channels = getattr(config, "num_channels", 3)
        inputs = {
            "pixel_values": torch.randn(b, channels, dims.image, dims.image, generator=gen, dtype=dtype),
            "labels": tokens(config.num_labels, (b,)),
        }
    elif spec.kind == "speech":
        frames = 2 * config.max_source_positions  # the encoder's convolutions stride by 2
        inputs = {
            "input_features": torch.randn(b, config.num_mel_bins, frames, generator=gen, dtype=dtype),
            "decoder_input_ids": tokens(config.vocab_size, (b, s)),
            "labels": tokens(config.vocab_size, (b, s)),
        }
    else:
        vocab = config.vocab_size
        inputs = {"input_ids": tokens(vocab, (b, s))}
        if spec.kind == "lm":
            inputs["labels"] = tokens(vocab, (b, s))
        elif spec.kind == "seq2seq":
            inputs["decoder_input_ids"] = tokens(vocab, (b, s))
            inputs["labels"] = tokens(vocab, (b, s))
        elif spec.kind == "qa":
            inputs["start_positions"] = tokens(s, (b,))
            inputs["end_positions"] = tokens(s, (b,))
        elif spec.kind == "cls":
            inputs["labels"] = tokens(config.num_labels, (b,))
        else:
            raise ValueError(f"unknown kind {spec.kind!r} for {name}")
    return {key: value.to(device) for key, value in inputs.items()}


def build(
    name: str,
    size: str | Size,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A model with random weights (seeded: two builds are bitwise equal) and its inputs.

    The model is left in train mode, as ``nn.Module`` starts; callers pick ``train()`` or
    ``eval()`` for the task, as the harness does.
    """
    device = torch.device(device)
    config = config_for(name, size)
    torch.manual_seed(seed)
    model = model_class(name)(config).to(device=device, dtype=dtype)
    return model, make_inputs(name, size, config, device, dtype, seed)


def loss_of(output: Any, inputs: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The head's loss (every entry gets labels, so HF computes it); cross entropy on the
    logits when a head returns none."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is not None:
        return loss
    if inputs is None or "labels" not in inputs:
        raise ValueError("the model returned no loss and there are no labels to compute one")
    logits = output["logits"] if isinstance(output, Mapping) else output.logits
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), inputs["labels"].reshape(-1)
    )
