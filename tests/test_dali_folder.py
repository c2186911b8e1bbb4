"""DALI for a user's own image folder (issue 50): an ImageFolder of generated JPEGs with the
standard torchvision transforms, translated into one DALI pipeline (run here on DALI's CPU
backend): the loader's batch structure, length and labels; values within a stated tolerance of
torchvision's on a deterministic pipeline; anything unrecognised refused by name."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("nvidia.dali")
from torchvision import datasets, transforms as T  # noqa: E402

from fastloop.dali_folder import DaliFolderLoader, NotTranslated, plan_folder  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TOLERANCE = 0.12
"""Mean absolute difference after normalisation (units of one std) allowed between DALI's resize
and PIL's on the same image: the two interpolate differently (and decode with other IDCTs)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    g = torch.Generator().manual_seed(0)
    for c in ("cat", "dog", "emu"):
        (root / c).mkdir()
        for i in range(7):
            h, w = 40 + 4 * i, 56 - 2 * i
            base = torch.rand(3, 1, 1, generator=g) * 200
            img = (base + 40 * torch.rand(3, h, w, generator=g)).clamp(0, 255).byte().permute(1, 2, 0).numpy()
            Image.fromarray(img).save(root / c / f"{i}.jpg", quality=95)
    return root


def _loader(root, transform, **kw):
    return DataLoader(datasets.ImageFolder(str(root), transform=transform), batch_size=kw.pop("batch_size", 4), **kw)


def test_the_standard_training_transforms_translate_with_their_parameters():
    plan = plan_folder(T.Compose([T.RandomResizedCrop(32, scale=(0.2, 1.0)), T.RandomHorizontalFlip(0.3), T.ToTensor(),
                                  T.Normalize(MEAN, STD)]))
    assert plan.crop == (32, 32) and plan.random_crop == ((0.2, 1.0), (3 / 4, 4 / 3)) and plan.flip == 0.3
    assert plan.mean == tuple(MEAN) and plan.scale == pytest.approx(1 / 255)


@pytest.mark.parametrize("op", [T.ColorJitter(0.4), T.RandomRotation(10)])
def test_an_unrecognised_op_is_refused_by_name(op):
    with pytest.raises(NotTranslated, match=type(op).__name__):
        plan_folder(T.Compose([T.RandomResizedCrop(32), op, T.ToTensor()]))


def test_a_custom_sampler_or_collate_is_refused_by_name(folder):
    t = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()])
    ds = datasets.ImageFolder(str(folder), transform=t)
    with pytest.raises(NotTranslated, match="collate_fn"):
        DaliFolderLoader(DataLoader(ds, batch_size=4, collate_fn=lambda b: b), device_id=None)
    with pytest.raises(NotTranslated, match="WeightedRandomSampler"):
        sampler = torch.utils.data.WeightedRandomSampler([1.0] * len(ds), len(ds))
        DaliFolderLoader(DataLoader(ds, batch_size=4, sampler=sampler), device_id=None)


def test_batches_have_the_loaders_structure_length_and_labels(folder):
    t = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    for drop_last in (True, False):
        loader = _loader(folder, t, shuffle=True, drop_last=drop_last)
        dali = DaliFolderLoader(loader, device_id=None)
        assert len(dali) == len(loader)
        got = list(dali)
        want = list(loader)
        assert len(got) == len(want)
        for (x, y), (xw, yw) in zip(got, want):
            assert x.shape == xw.shape and x.dtype == xw.dtype and y.dtype == yw.dtype == torch.int64
        labels = torch.cat([y for _, y in got])
        if not drop_last:  # every file once an epoch, labelled as class_to_idx says
            assert sorted(labels.tolist()) == sorted(c for _, c in loader.dataset.samples)


def test_values_match_torchvision_within_the_stated_tolerance(folder):
    t = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor(), T.Normalize(MEAN, STD)])
    loader = _loader(folder, t, shuffle=False)
    dali = DaliFolderLoader(loader, device_id=None)
    diffs = []
    for (x, y), (xw, yw) in zip(dali, loader):
        assert torch.equal(y, yw)  # the same files in the same order without shuffling
        diffs.append((x - xw).abs().mean().item())
    assert max(diffs) < TOLERANCE, diffs


def test_each_rank_reads_its_own_shard(folder, monkeypatch):
    """Under DDP each rank reads its shard of the files (DALI's reader), and ``len`` is per rank."""
    import fastloop.dali_folder as F

    t = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()])
    loader = _loader(folder, t, batch_size=2, drop_last=False)  # 21 files
    seen = []
    for rank, files in ((0, 10), (1, 11)):  # DALI's split: shard i holds files [21*i//2, 21*(i+1)//2)
        monkeypatch.setattr(F, "rank_world", lambda r=rank: (r, 2))
        dali = DaliFolderLoader(loader, device_id=None)
        batches = list(dali)
        labels = [int(v) for _, y in batches for v in y]
        assert (dali.shard, dali.num_shards) == (rank, 2) and len(labels) == files
        assert len(dali) == -(-files // 2) == len(batches)
        seen += labels
    assert sorted(seen) == sorted(c for _, c in loader.dataset.samples)  # every file once, over the two ranks


def test_the_recipes_loader_and_the_speedup_share_one_pipeline_builder():
    from fastloop.dali_folder import DaliPipeline
    from fastloop.recipes.imagenet.data import DaliLoader

    assert issubclass(DaliLoader, DaliPipeline) and issubclass(DaliFolderLoader, DaliPipeline)
