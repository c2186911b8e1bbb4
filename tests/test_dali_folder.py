"""DALI for a user's own image folder: an ImageFolder of generated JPEGs with the
standard torchvision transforms, translated into one DALI pipeline (run here on DALI's CPU
backend): the loader's batch structure, length and labels; values within a stated tolerance of
torchvision's on a deterministic pipeline; anything unrecognised refused by name."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("nvidia.dali")
from torchvision import datasets  # noqa: E402
from torchvision import transforms as T

from fastloop.speedups.dali.folder import DaliFolderLoader, NotTranslated, plan_folder  # noqa: E402

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
    plan = plan_folder(
        T.Compose(
            [
                T.RandomResizedCrop(32, scale=(0.2, 1.0)),
                T.RandomHorizontalFlip(0.3),
                T.ToTensor(),
                T.Normalize(MEAN, STD),
            ]
        )
    )
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
    gray = datasets.ImageFolder(
        str(folder), transform=t, loader=lambda path: datasets.folder.pil_loader(path).convert("L")
    )
    with pytest.raises(NotTranslated, match="reads its files with <lambda>, not torchvision's default loader"):
        DaliFolderLoader(DataLoader(gray, batch_size=4), device_id=None)
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


def test_each_rank_reads_its_own_shard(folder):
    """Under DDP (Lightning gives the loader its DistributedSampler; a plain loop gives its own)
    each rank reads its shard of the files (DALI's reader, from the sampler's rank and replica
    count), and ``len`` is per rank, every epoch; the shards of an epoch are disjoint, shuffled or
    not, whatever each rank's own seed (DALI permutes from a seed of its own)."""
    from torch.utils.data.distributed import DistributedSampler

    t = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()])
    ds = datasets.ImageFolder(str(folder), transform=t)  # 21 files
    for shuffle in (False, True):
        seen: list[list[set]] = [[], []]  # per epoch, per rank: the files read (by their pixels)
        for rank in (0, 1):  # DALI's split: shard i holds files [21*i//2, 21*(i+1)//2): 10 and 11
            sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=shuffle, seed=3)
            loader = DataLoader(ds, batch_size=2, sampler=sampler)
            dali = DaliFolderLoader(loader, device_id=None, seed=rank)  # the run's seeds may differ by rank
            assert (dali.shard, dali.num_shards) == (rank, 2) and len(dali) == 6  # ceil(ceil(21 / 2) / 2) on both
            for epoch in range(2):  # the same shard each epoch unshuffled; reshuffled after each epoch
                batches = list(dali)  # the shorter shard filled with repeats: the ranks step together
                assert len(batches) == len(dali) and [len(y) for _, y in batches] == [2] * 6
                seen[epoch].append({image.numpy().tobytes() for images, _ in batches for image in images})
        for ranks in seen:  # every file once an epoch, each on one rank
            assert len(ranks[0] | ranks[1]) == 21 and not ranks[0] & ranks[1], shuffle
        if not shuffle:  # each rank its own files every epoch, as the unshuffled DistributedSampler
            assert seen[0] == seen[1]


def test_a_loader_without_a_distributed_sampler_reads_every_file_on_each_rank(folder, monkeypatch):
    """A plain loop's loader with a RandomSampler under torch.distributed reads the whole folder on
    each rank (as the loader itself does); DALI does not shard behind its back."""
    import fastloop.speedups.dali.folder as F

    monkeypatch.setattr(F, "rank_world", lambda: (1, 2))
    t = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()])
    dali = DaliFolderLoader(_loader(folder, t, batch_size=3, shuffle=True), device_id=None)
    assert (dali.shard, dali.num_shards) == (0, 1) and sum(len(y) for _, y in dali) == 21


def test_the_recipes_loader_and_the_speedup_share_one_pipeline_builder():
    from fastloop.recipes.imagenet.data import DaliLoader
    from fastloop.speedups.dali.folder import DaliPipeline

    assert issubclass(DaliLoader, DaliPipeline) and issubclass(DaliFolderLoader, DaliPipeline)


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    """PNGs (lossless) whose pixels say where they are: red = 10 x column, green = 10 x row, blue 200."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("coded")
    yy, xx = np.mgrid[0:24, 0:20]
    img = np.stack([xx * 10, yy * 10, np.full_like(xx, 200)], -1).astype(np.uint8)
    for c in ("a", "b"):
        (root / c).mkdir()
        for i in range(20):
            Image.fromarray(img).save(root / c / f"{i}.png")
    return root, torch.from_numpy(img).permute(2, 0, 1)


def _place(x: torch.Tensor, crop_w: int) -> tuple[int, int, bool]:
    """Where a crop of a coded image was taken (top, left in the unpadded image) and whether it was flipped."""
    code = (x * 255).round().long()
    i, j = [int(v[0]) for v in torch.nonzero(code[2] == 200, as_tuple=True)]
    row = code[0, i][code[2, i] == 200]
    flipped = bool(row[0] > row[-1])
    col = (crop_w - 1 - j) if flipped else j
    return int(code[1, i, j]) // 10 - i, int(code[0, i, j]) // 10 - col, flipped


def test_random_crop_with_padding_draws_torchvisions_places_and_flips(coded):
    """RandomCrop((16, 12), padding=(3, 2)) and a flip, 1,000 draws on DALI's CPU backend: each
    output is exactly torchvision's crop of the zero-padded image at some place (lossless PNGs, no
    resize); the places are uniform over every place torchvision draws from (a chi-square test at
    the 0.1% level), and the flips come at p = 0.5 (within 4.5 standard errors)."""
    _check_places(coded, device_id=None)


@pytest.mark.gpu
def test_random_crop_with_padding_on_the_gpus_pipeline(coded):
    """The same on the GPU's pipeline (decode "mixed", the crop's slice on the GPU)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _check_places(coded, device_id=0)


def _check_places(coded, device_id):
    import torchvision.transforms.functional as F

    root, img = coded
    t = T.Compose([T.RandomCrop((16, 12), padding=(3, 2)), T.RandomHorizontalFlip(), T.ToTensor()])
    dali = DaliFolderLoader(_loader(root, t, batch_size=8, shuffle=True), device_id=device_id, seed=3)
    tops, lefts, flips = [], [], 0
    padded = F.pad(img, [3, 2])  # left/right 3, top/bottom 2, filled with 0
    for _ in range(25):
        for x, _y in dali:
            for one in x.cpu():
                top, left, flipped = _place(one, 12)
                want = padded[:, top + 2 : top + 18, left + 3 : left + 15]
                want = want.flip(-1) if flipped else want
                assert torch.allclose(one, want.float() / 255, atol=1e-6), (top, left, flipped)
                tops.append(top)
                lefts.append(left)
                flips += flipped
    n = len(tops)
    assert n == 1000
    for seen, lo, hi, chi2_999 in ((tops, -2, 24 + 2 - 16, 32.9), (lefts, -3, 20 + 3 - 12, 36.1)):
        counts = torch.bincount(torch.tensor(seen) - lo, minlength=hi - lo + 1).double()
        assert min(seen) == lo and max(seen) == hi and len(counts) == hi - lo + 1
        expected = n / len(counts)
        assert ((counts - expected) ** 2 / expected).sum() < chi2_999  # df 12 and 14 at the 0.1% level
    assert abs(flips / n - 0.5) < 4.5 * (0.25 / n) ** 0.5


def test_resize_to_torchvisions_size_then_a_random_crop_stays_within_the_tolerance(folder):
    """Resize(int) goes to torchvision's own output size (the longer side truncated), so a centre
    crop after it lands where torchvision's does; a RandomCrop after a resize keeps the batch's structure."""
    t = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor(), T.Normalize(MEAN, STD)])
    loader = _loader(folder, t)
    diffs = [(x - xw).abs().mean().item() for (x, _), (xw, _) in zip(DaliFolderLoader(loader, device_id=None), loader)]
    assert max(diffs) < TOLERANCE / 4, diffs
    t = T.Compose([T.Resize((36, 40)), T.RandomCrop(32, padding=4), T.ToTensor(), T.Normalize(MEAN, STD)])
    loader = _loader(folder, t, drop_last=True)
    got, want = list(DaliFolderLoader(loader, device_id=None)), list(loader)
    assert len(got) == len(want) and all(x.shape == xw.shape == (4, 3, 32, 32) for (x, _), (xw, _) in zip(got, want))


@pytest.mark.parametrize(
    "transform, name",
    [
        (T.Compose([T.RandomCrop(32, padding=4, padding_mode="reflect"), T.ToTensor()]), "padding_mode='reflect'"),
        (T.Compose([T.RandomCrop(32, pad_if_needed=True), T.ToTensor()]), "pad_if_needed=True"),
        (T.Compose([T.ToTensor(), T.Normalize(MEAN, STD), T.RandomCrop(32, padding=4)]), "pads after Normalize"),
        (T.Compose([T.CenterCrop(40), T.RandomCrop(32), T.ToTensor()]), "RandomCrop after a crop"),
        (T.Compose([T.Resize(36, max_size=50), T.CenterCrop(32), T.ToTensor()]), "max_size=50"),
    ],
)
def test_a_random_crop_or_resize_dali_cannot_copy_is_refused_by_what_it_does(transform, name):
    with pytest.raises(NotTranslated, match=name.replace("(", r"\(")):
        plan_folder(transform)


def test_v2_and_v1_random_crop_paddings_read_alike():
    from torchvision.transforms import v2

    for pad, want in ((4, (4, 4, 4, 4)), ((1, 2), (1, 2, 1, 2)), ((1, 2, 3, 4), (1, 2, 3, 4))):
        v1 = plan_folder(T.Compose([T.RandomCrop(32, padding=pad), T.ToTensor()]))
        two = plan_folder(
            v2.Compose([v2.ToImage(), v2.RandomCrop(32, padding=pad), v2.ToDtype(torch.float32, scale=True)])
        )
        assert v1.pad_crop == two.pad_crop == want and v1.crop == two.crop == (32, 32)
    after = plan_folder(T.Compose([T.ToTensor(), T.RandomCrop(32, padding=4, fill=0.5)]))
    assert after.fill == pytest.approx((127.5,))  # a float image's fill, in the decoded image's bytes


def test_a_random_split_of_the_folder_reads_only_its_own_files(folder):
    """``random_split`` (a Subset of the ImageFolder, the transform inside): DALI reads exactly the
    subset's files with their labels, and the loader's length is the subset's."""
    from torch.utils.data import random_split

    t = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()])
    train, _ = random_split(
        datasets.ImageFolder(str(folder), transform=t), [15, 6], generator=torch.Generator().manual_seed(0)
    )
    loader = DataLoader(train, batch_size=4, shuffle=False)
    dali = DaliFolderLoader(loader, device_id=None)
    assert len(dali) == len(loader) == 4 and dali.dataset is train
    got = torch.cat([y for _, y in dali])
    want = torch.cat([y for _, y in loader])
    assert torch.equal(got, want)  # the subset's files, in its order (no shuffling)
    files = [train.dataset.samples[i][0] for i in train.indices]
    assert dali.n == 15 and sorted(files) != sorted(p for p, _ in train.dataset.samples)


@pytest.mark.parametrize("mode", [T.InterpolationMode.BICUBIC, T.InterpolationMode.NEAREST])
def test_the_users_interpolation_is_translated_and_brings_the_values_closer(folder, monkeypatch, mode):
    """A bicubic (timm-style) or nearest Resize resized with DALI's linear filter before: within
    the tolerance still, but further from torchvision's than with the user's mode, which the
    translation now passes to DALI's resize (measured here: bicubic 0.014 against 0.025, nearest
    0.037 against 0.086, mean absolute difference after normalisation)."""
    import fastloop.speedups.dali.folder as F

    t = T.Compose([T.Resize(36, interpolation=mode), T.CenterCrop(32), T.ToTensor(), T.Normalize(MEAN, STD)])
    assert plan_folder(t).interp == {"bicubic": "INTERP_CUBIC", "nearest": "INTERP_NN"}[mode.value]

    def mean_diff() -> float:
        loader = _loader(folder, t, shuffle=False)
        diffs = [
            (x - xw).abs().mean().item() for (x, _), (xw, _) in zip(DaliFolderLoader(loader, device_id=None), loader)
        ]
        return sum(diffs) / len(diffs)

    translated = mean_diff()
    monkeypatch.setattr(F, "_interpolation", lambda op, name: "INTERP_LINEAR")  # the old translation
    assert translated < TOLERANCE and translated < 0.8 * mean_diff()


def test_an_interpolation_dali_lacks_or_a_resize_before_the_random_crop_is_refused_by_name():
    lanczos = T.Compose([T.RandomResizedCrop(32, interpolation=T.InterpolationMode.LANCZOS), T.ToTensor()])
    with pytest.raises(NotTranslated, match="RandomResizedCrop uses lanczos interpolation"):
        plan_folder(lanczos)
    with pytest.raises(NotTranslated, match="Resize before RandomResizedCrop"):
        plan_folder(T.Compose([T.Resize(64), T.RandomResizedCrop(32), T.ToTensor()]))
    assert plan_folder(T.Compose([T.RandomResizedCrop(32), T.ToTensor()])).interp == "INTERP_LINEAR"
