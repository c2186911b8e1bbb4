import shutil

import pytest
import torch

from fastloop import FastloopError
from fastloop._compat import Trainer
from fastloop.recipes.imagenet.data import ImageData, dali_available, scan_images
from fastloop.recipes.imagenet.generate import default_dataset, generate
from fastloop.recipes.imagenet.module import ImageClassifier

needs_dali = pytest.mark.skipif(dali_available() is not None, reason="NVIDIA DALI not installed")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("img"), classes=3, train=8, val=2, workers=2)


def test_generated_files_are_imagenet_like(small):
    files, labels, classes = scan_images(small / "train")
    assert len(files) == 24 and sorted(set(labels)) == [0, 1, 2] and len(classes) == 3
    mean = int((small / "MANIFEST").read_text().split("mean_bytes=")[1])
    assert 70_000 <= mean <= 120_000, mean
    from PIL import Image

    w, h = Image.open(files[0]).size
    assert 300 <= h <= 420 and 360 <= w <= 500


@pytest.mark.parametrize("loader", ["torchvision", pytest.param("dali", marks=needs_dali), "synthetic"])
def test_loaders_agree_on_shapes_dtypes_and_labels(small, loader):
    d = ImageData(str(small), loader=loader, batch_size=4, crop=96)
    x, y = next(iter(d.train_dataloader()))
    assert x.shape == (4, 3, 96, 96) and x.dtype == torch.float32
    assert y.shape == (4,) and y.dtype == torch.int64 and 0 <= int(y.min()) and int(y.max()) < 3
    if loader != "synthetic":
        assert -3 < float(x.mean()) < 3 and 0.2 < float(x.std()) < 3  # normalised pixels
    assert len(d.train_dataloader()) == (6 if loader != "synthetic" else 1000)


@needs_dali
def test_dali_cpu_pipeline_epoch_and_validation(small):
    d = ImageData(str(small), loader="dali", batch_size=5, crop=64)
    batches = list(d.train_dataloader())
    assert len(batches) == 24 // 5  # last partial batch dropped in training
    val = list(d.val_dataloader())
    assert sum(len(b[1]) for b in val) == 6  # every validation image, partial batch kept


def test_corrupt_file_named_or_skipped(small, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(small, root)
    bad = root / "train" / "class_0001" / "broken.jpg"
    good = next((root / "train" / "class_0001").glob("0*.jpg")).read_bytes()
    bad.write_bytes(good[: len(good) // 2])  # truncated JPEG
    (root / "train" / "class_0002" / "notes.txt").write_text("not an image")
    with pytest.raises(FastloopError, match="broken.jpg is not a valid JPEG file"):
        ImageData(str(root))
    with pytest.warns(UserWarning, match="skipping 2 file"):
        d = ImageData(str(root), on_bad="skip", batch_size=4, crop=64)
    assert len(d.files) == 24
    x, _ = next(iter(d.train_dataloader()))
    assert x.shape[0] == 4


def test_missing_or_empty_folders(tmp_path):
    with pytest.raises(FastloopError, match="image folder not found"):
        ImageData(str(tmp_path / "nope"))
    (tmp_path / "train").mkdir()
    with pytest.raises(FastloopError, match="has no class folders"):
        ImageData(str(tmp_path))
    (tmp_path / "train" / "cat").mkdir()
    with pytest.raises(FastloopError, match="holds no JPEG images"):
        ImageData(str(tmp_path))


def test_unknown_arch_and_loader(small):
    with pytest.raises(FastloopError, match="torchvision has no model 'resnet51'"):
        ImageClassifier(arch="resnet51")
    with pytest.raises(FastloopError, match="unknown loader 'ffcv'"):
        ImageData(str(small), loader="ffcv")


@pytest.mark.slow  # a ResNet trained to above chance on the CPU: .ci/run's second step
def test_short_run_learns_above_chance():
    torch.manual_seed(0)
    d = ImageData(str(default_dataset()), batch_size=32, crop=64)
    m = ImageClassifier(
        arch="resnet18", num_classes=d.num_classes, batch_size=32, lr=0.4, warmup_steps=10, max_steps=60
    )
    t = Trainer(
        max_steps=60,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=10,
        check_val_every_n_epoch=None,
        val_check_interval=60,
        num_sanity_val_steps=0,
    )
    t.fit(m, datamodule=d)
    assert float(t.callback_metrics["val_top1"]) > 0.3  # chance is 0.1 with 10 classes


@needs_dali
def test_dali_speedup_swaps_the_loader_in_a_run():
    from fastloop.drivers.runner import run_configuration

    doc = run_configuration("imagenet", "workers:2,dali", steps=2, warmup=1, device="cpu")
    rec = {r["name"]: r for r in doc["speedups"]}
    # the recipe's torchvision loader is translated like any ImageFolder (no hook of the recipe's own)
    assert rec["dali"]["status"] == "applied" and "DALI reads the folder's" in rec["dali"]["detail"], rec["dali"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in rec["dali"]["detail"]  # a CPU pipeline: no hardware queues to name
    assert rec["workers"]["status"] == "applied"
    doc = run_configuration("tests/targets.py:tiny_mlp", "dali", steps=2, warmup=0, device="cpu")
    assert doc["speedups"][0]["status"] == "skipped" and "not a torchvision ImageFolder" in doc["speedups"][0]["reason"]


def test_dali_options_are_checked_and_parsed(small):
    from fastloop.recipes.imagenet.target import parse_options

    assert parse_options("num_threads=12, hw_decoder_load=0.99,dtype=float16,affine=false") == {
        "num_threads": 12,
        "hw_decoder_load": 0.99,
        "dtype": torch.float16,
        "affine": False,
    }
    with pytest.raises(FastloopError, match="not key=value"):
        parse_options("num_threads")
    with pytest.raises(FastloopError, match="cannot read option value 'fast'"):
        parse_options("dtype=fast")
    with pytest.raises(FastloopError, match="unknown DALI option.*threads.*valid: num_threads"):
        ImageData(str(small), loader="dali", dali_options={"threads": 4})


@needs_dali
def test_dali_cpu_pipeline_options(small):
    from fastloop.recipes.imagenet.data import DaliLoader

    files, labels, _ = scan_images(small / "train")
    x, y = next(iter(DaliLoader(files, labels, 4, crop=64, channels_last=True, dtype=torch.float16, num_threads=2)))
    assert x.shape == (4, 3, 64, 64) and x.dtype == torch.float16 and x.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(FastloopError, match="float32 or float16"):
        DaliLoader(files, labels, 4, dtype=torch.bfloat16)
    with pytest.raises(FastloopError, match="fraction in"):
        DaliLoader(files, labels, 4, hw_decoder_load=1.5)


def test_hw_decoder_share_defaults_by_gpu(monkeypatch):
    from fastloop.recipes.imagenet.data import default_hw_decoder_load

    assert default_hw_decoder_load(None) == 0.65  # CPU pipeline: no hardware decoder
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for cap, want in (((9, 0), 0.99), ((8, 0), 0.65), ((10, 0), 0.65)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d, c=cap: c)
        assert default_hw_decoder_load(0) == want, cap


def test_flops_per_batch_counts_resnet50_and_scales_with_batch_and_size():
    m = ImageClassifier("resnet50", num_classes=1000)
    per_image = m.flops_per_batch((torch.zeros(1, 3, 224, 224), None)) / 3
    assert abs(per_image - 2 * 4.09e9) / (2 * 4.09e9) < 0.02  # ResNet-50: 4.09 GMACs forward at 224 px
    assert m.flops_per_batch((torch.zeros(8, 3, 224, 224), None)) == 8 * 3 * per_image
    assert m.flops_per_batch((torch.zeros(1, 3, 112, 112), None)) / 3 < per_image / 3.5  # ~1/4 the pixels
