"""gpu_augment: a torchvision pipeline with random ops on in-memory images, translated
and run on each whole batch with per-sample draws. Distributional equivalence: crop offsets
uniform over the same range, flips at rate p, normalisation exact, the batch structure the
loader's; unrecognised ops skipped with their name. Run here on the CPU (the kernels are the
same torch code on the GPU)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader

from fastloop.speedups.base import Skip
from fastloop.speedups.gpu_augment.gpu_augment import augment_why_not, make_augmented, run_ops, translate
from tests.targets import AugmentedImages, augmented_images, v2_pipeline

CPU = torch.device("cpu")


def test_the_batches_have_the_loaders_structure_order_and_dtypes():
    _, loader = augmented_images()
    _, again = augmented_images()
    aug = make_augmented(again, CPU)
    assert len(aug) == len(loader)
    for (x, y), (xa, ya) in zip(loader, aug):
        assert xa.shape == x.shape and xa.dtype == x.dtype
        assert torch.equal(torch.as_tensor(y), ya)  # the loader's own sampler, the same seed: the same order
    assert aug.resident.tensors[0].dtype == torch.uint8  # stored as stored


def test_crop_offsets_are_uniform_and_flips_happen_at_rate_p():
    from torchvision.transforms import v2

    n, size, pad = 4000, 8, 2
    # every pixel holds its column index + 1 (the padding is 0): the crop's left offset is read
    # off the first row of each output
    img = (torch.arange(size, dtype=torch.uint8) + 1).expand(3, size, size).contiguous()
    batch = img.expand(n, 3, size, size).contiguous()
    out = run_ops(
        batch,
        translate(v2.Compose([v2.RandomCrop(size, padding=pad), v2.RandomHorizontalFlip(p=0.0)])),
        torch.Generator().manual_seed(0),
    )
    row = out[:, 0, :, :].max(dim=1).values.long()  # (n, size), whatever the vertical shift
    first_real = (row > 0).float().argmax(dim=1)  # where column value 1 landed when the crop starts in the padding
    left = torch.where(row[:, 0] > 0, row[:, 0] - 1 + pad, pad - first_real)
    counts = torch.bincount(left, minlength=2 * pad + 1).float()
    expected = n / (2 * pad + 1)
    assert len(counts) == 2 * pad + 1 and ((counts - expected).abs() < 0.15 * expected).all(), counts
    flips = run_ops(
        batch,
        translate(v2.Compose([v2.RandomCrop(size, padding=0), v2.RandomHorizontalFlip(p=0.3)])),
        torch.Generator().manual_seed(1),
    )
    rate = (flips[:, 0, 0, 0] > flips[:, 0, 0, -1]).float().mean().item()
    assert abs(rate - 0.3) < 0.04, rate  # p = 0.3, n = 4000: about 5 sigma


def test_normalisation_is_exact():
    from torchvision.transforms import v2

    data = AugmentedImages(n=8).data
    t = v2.Compose(
        [
            v2.RandomCrop(16, padding=0),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.1, 0.2, 0.3], [0.5, 0.25, 0.2]),
        ]
    )
    got = run_ops(data, translate(t), torch.Generator())
    want = torch.stack([t(x) for x in data])
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("op,name", [("ColorJitter", "ColorJitter"), ("RandomRotation", "RandomRotation")])
def test_an_unrecognised_op_is_skipped_with_its_name(op, name):
    from torchvision.transforms import v2

    t = v2.Compose(
        [v2.RandomCrop(16, padding=2), getattr(v2, op)(0.5) if op == "ColorJitter" else v2.RandomRotation(10)]
    )
    with pytest.raises(Skip, match=name):
        translate(t)
    loader = DataLoader(AugmentedImages(transform=t), batch_size=8)
    assert name in augment_why_not(loader)


def test_a_user_function_and_a_target_transform_are_named():
    loader = DataLoader(AugmentedImages(transform=lambda x: x.float()), batch_size=8)
    assert (
        "function" in augment_why_not(loader)
        or "<lambda>" in augment_why_not(loader)
        or "not a torchvision op" in augment_why_not(loader)
    )
    ds = AugmentedImages(transform=v2_pipeline())
    ds.target_transform = lambda y: y
    with pytest.raises(Skip, match="target_transform"):
        make_augmented(DataLoader(ds, batch_size=8), CPU)


def test_training_on_the_augmented_batches_tracks_the_cpu_pipeline():
    """The loss trajectory of a small conv net trained on the translated pipeline stays within
    15% (mean over 40 steps, after the first 10) of the same training on the CPU pipeline: the
    draws differ, their distribution does not."""

    def train(loader) -> float:
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 4),
        )
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        losses = []
        while len(losses) < 50:
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(net(x), torch.as_tensor(y))
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return sum(losses[10:50]) / 40

    _, cpu = augmented_images()
    _, again = augmented_images()
    a, b = train(cpu), train(make_augmented(again, CPU))
    assert abs(a - b) / a < 0.15, (a, b)


def test_pil_images_made_from_stored_hwc_arrays_are_read_once_as_chw():
    """torchvision's CIFAR10 hands its transform a PIL image made from a stored HWC uint8 array:
    the images are read once as CHW uint8 (ToTensor's layout, unscaled), and the v1 pipeline's
    ops run on each batch, giving the CPU pipeline's shapes and dtypes and, with the random ops
    set aside, its exact values."""
    from tests.targets import PilCifar, pil_cifar

    _, loader = pil_cifar()
    _, again = pil_cifar()
    assert augment_why_not(again) is None
    aug = make_augmented(again, CPU)
    stored = aug.resident.tensors[0]
    assert stored.dtype == torch.uint8 and stored.shape[1:] == (3, 16, 16)
    assert torch.equal(stored[0].permute(1, 2, 0), torch.from_numpy(again.dataset.data[0]))
    for (x, y), (xa, ya) in zip(loader, aug):
        assert xa.shape == x.shape and xa.dtype == x.dtype and torch.equal(torch.as_tensor(y), ya)
    from torchvision import transforms as T

    fixed = T.Compose([T.ToTensor(), T.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])
    ds = PilCifar(n=4)
    got = run_ops(
        torch.stack([torch.from_numpy(a).permute(2, 0, 1) for a in ds.data]),
        [op for op in translate(T.Compose([T.RandomHorizontalFlip(p=0.0), fixed])) if op.kind != "hwc_to_chw"],
        torch.Generator(),
    )
    assert torch.allclose(got, torch.stack([fixed(ds[i][0]) for i in range(4)]), atol=1e-6)


RESIZED_TOLERANCE = 0.02
"""Mean absolute difference (in [0, 1] units of the image) allowed between the batched
RandomResizedCrop (``roi_align``: bilinear on pixel centres, averaged over ceil(box / size)
samples where the box is larger) and torchvision's antialiased resize of the same box, on smooth
images (measured: 0.0024; on white noise, where antialiasing filters differ most, 0.011)."""


def test_resized_crop_boxes_are_drawn_as_torchvision_draws_them():
    """20,000 boxes each from torchvision's own ``get_params`` and from the batched draw, on a
    32x48 image: the area fraction's and the log aspect ratio's quantiles agree within 0.02, the
    centre-crop fallback (no try fits) lands where torchvision puts it, and every box is inside."""
    from torchvision.transforms import v2

    from fastloop.speedups.gpu_augment.ops import resized_crop_boxes

    n, h, w = 20_000, 32, 48
    ours = resized_crop_boxes(n, h, w, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    theirs = torch.tensor(
        [v2.RandomResizedCrop.get_params(torch.zeros(3, h, w), [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(n)],
        dtype=torch.float,
    )
    q = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95])
    for stat in (lambda b: b[:, 2] * b[:, 3] / (h * w), lambda b: torch.log(b[:, 3] / b[:, 2])):
        assert (stat(ours).quantile(q) - stat(theirs).quantile(q)).abs().max() < 0.02
    top, left, bh, bw = ours.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (top + bh <= h).all() and (left + bw <= w).all()
    # every place equally likely: the top offset's share of its range is uniform (mean 1/2)
    assert abs(((top + 0.5) / (h - bh + 1)).mean().item() - 0.5) < 0.01
    # a scale no try can fit (the area is above the image's): torchvision's centre crop, clamped to the ratio
    wide = resized_crop_boxes(4, 10, 40, scale=(2.0, 3.0), ratio=(1.0, 2.0), generator=torch.Generator())
    assert wide.tolist() == [[0.0, 10.0, 10.0, 20.0]] * 4
    assert v2.RandomResizedCrop.get_params(torch.zeros(3, 10, 40), [2.0, 3.0], [1.0, 2.0]) == (0, 10, 10, 20)


def test_resized_crop_values_are_torchvisions_within_the_stated_tolerance():
    import torchvision.transforms.v2.functional as F

    from fastloop.speedups.gpu_augment.ops import random_resized_crop, resized_crop_boxes

    smooth = torch.nn.functional.interpolate(
        torch.rand(64, 3, 8, 12, generator=torch.Generator().manual_seed(2)), size=(32, 48), mode="bilinear"
    )
    x = (smooth * 255).round().to(torch.uint8)
    got = random_resized_crop(x, 24, generator=torch.Generator().manual_seed(1))
    boxes = resized_crop_boxes(64, 32, 48, generator=torch.Generator().manual_seed(1)).long()
    want = torch.stack([F.resized_crop(x[i], *boxes[i].tolist(), [24, 24], antialias=True) for i in range(64)])
    assert got.dtype == torch.uint8 and got.shape == want.shape == (64, 3, 24, 24)
    assert (got.float() - want.float()).abs().mean().item() / 255 < RESIZED_TOLERANCE


def test_a_random_resized_crop_pipeline_is_translated_and_trains_like_the_cpu_one():
    """An ImageNet-style v2 pipeline on stored uint8 images: translated (not skipped), the batch's
    structure the loader's, and a small net's loss trajectory within 15% of the CPU pipeline's."""
    from torchvision.transforms import v2

    t = v2.Compose(
        [
            v2.RandomResizedCrop(12, scale=(0.3, 1.0)),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.5] * 3, [0.25] * 3),
        ]
    )
    assert [op.kind for op in translate(t)] == ["resized_crop", "flip", "to_float", "normalize"]
    with pytest.raises(Skip, match="nearest interpolation"):
        translate(v2.RandomResizedCrop(12, interpolation=v2.InterpolationMode.NEAREST))

    def loader():
        torch.manual_seed(0)
        ds = AugmentedImages(n=128, transform=t)
        level = (
            torch.tensor(ds.targets, dtype=torch.float)[:, None, None, None] * 50 + 20
        )  # learnable: the class is the level
        ds.data = (level + ds.data.float() * 0.3).clamp(0, 255).to(torch.uint8)
        return DataLoader(ds, batch_size=16, shuffle=True)

    cpu, gpu = loader(), make_augmented(loader(), CPU)
    x, y = next(iter(cpu))
    xa, ya = next(iter(gpu))
    assert xa.shape == x.shape == (16, 3, 12, 12) and xa.dtype == x.dtype == torch.float32
    a, b = train_loss(cpu), train_loss(gpu)
    assert a < 0.9 * math.log(4) and abs(a - b) / a < 0.15, (a, b)  # it learns, on both pipelines alike


def train_loss(loader) -> float:
    """The mean loss of steps 10-50 of a small conv net trained on ``loader``."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 4),
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    losses: list[float] = []
    while len(losses) < 50:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(net(x), torch.as_tensor(y) % 4)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return sum(losses[10:50]) / 40


def test_a_random_split_of_the_dataset_is_augmented_from_the_transform_inside():
    """``random_split``'s Subset has no transform of its own: the one of the dataset inside is
    translated, and the subset's images are the ones read (the loader's order, its length)."""
    from torch.utils.data import random_split

    from tests.targets import v2_pipeline

    def loader():
        torch.manual_seed(0)
        ds = AugmentedImages(n=64, transform=v2_pipeline())
        train, _ = random_split(ds, [48, 16], generator=torch.Generator().manual_seed(1))
        return DataLoader(train, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2))

    assert augment_why_not(loader()) is None
    cpu, aug = loader(), make_augmented(loader(), CPU)
    assert len(aug) == len(cpu) == 6 and aug.resident.tensors[0].shape[0] == 48
    for (x, y), (xa, ya) in zip(cpu, aug):
        assert xa.shape == x.shape and torch.equal(torch.as_tensor(y), ya)


@pytest.mark.gpu
def test_the_translated_pipelines_run_on_the_gpu_with_a_generator_there():
    """On CUDA: the stored uint8 images on the device, a CIFAR-style and an ImageNet-style pipeline
    run on each batch there (the draws from a CUDA generator), the batch structure the loader's."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torchvision.transforms import v2

    cuda = torch.device("cuda")
    for t in (
        v2.Compose(
            [v2.RandomCrop(16, padding=(2, 4)), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)]
        ),
        v2.Compose(
            [
                v2.RandomResizedCrop(12),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize([0.5] * 3, [0.25] * 3),
            ]
        ),
    ):
        loader = DataLoader(
            AugmentedImages(n=64, transform=t), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        aug = make_augmented(loader, cuda)
        x, y = next(iter(loader))
        xa, ya = next(iter(aug))
        assert (
            xa.is_cuda and xa.shape == x.shape and xa.dtype == x.dtype and aug.resident.tensors[0].dtype == torch.uint8
        )
        assert torch.isfinite(xa).all() and len(aug) == len(loader)


@pytest.mark.gpu
def test_the_gpu_batches_never_make_the_host_wait_for_the_gpu():
    """The batches queue behind the step: after the first, iterating makes no host sync (CUDA's
    sync debug mode raises on one). Before the fix, Normalize's mean and std were copied from
    pageable memory on every batch, a sync that kept the host from running ahead."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torchvision.transforms import v2

    for t in (
        v2.Compose(
            [
                v2.RandomCrop(16, padding=4),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize([0.5] * 3, [0.25] * 3),
            ]
        ),
        v2.Compose(
            [
                v2.RandomResizedCrop(12),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize([0.4] * 3, [0.2] * 3),
            ]
        ),
    ):
        loader = DataLoader(
            AugmentedImages(n=128, transform=t), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        it = iter(make_augmented(loader, torch.device("cuda")))
        next(it)  # the first batch may make what later ones reuse
        torch.cuda.set_sync_debug_mode("error")
        try:
            batches = [next(it) for _ in range(4)]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert all(x.is_cuda and x.dtype == torch.float32 and y.is_cuda for x, y in batches)


def test_normalize_makes_its_mean_and_std_once_per_device_and_dtype():
    """The per-channel tensors are built once and reused (on CUDA, building them each batch was a
    copy from pageable memory that waited for the queued step); another dtype gets its own."""
    from fastloop.speedups.gpu_augment.ops import _channel_stats, normalize

    m, s = _channel_stats((0.5, 0.4, 0.3), (0.25, 0.2, 0.1), torch.float32, CPU)
    again = _channel_stats((0.5, 0.4, 0.3), (0.25, 0.2, 0.1), torch.float32, CPU)
    assert again[0] is m and again[1] is s and m.shape == (1, 3, 1, 1)
    assert torch.equal(m.flatten(), torch.tensor([0.5, 0.4, 0.3])) and torch.equal(
        s.flatten(), torch.tensor([0.25, 0.2, 0.1])
    )
    half = _channel_stats((0.5, 0.4, 0.3), (0.25, 0.2, 0.1), torch.float16, CPU)
    assert half[0] is not m and half[0].dtype == torch.float16
    x = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    assert torch.allclose(normalize(x, [0.5, 0.4, 0.3], [0.25, 0.2, 0.1]).flatten()[::4], torch.tensor([2.0, 3.0, 7.0]))


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_reflect_and_edge_padding_crop_as_torchvision_pads(mode):
    """CIFAR recipes often pad by reflection: every translated crop is one of torchvision's crops
    of the same image padded the same way, and every offset is drawn."""
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as TF

    pad, size = 2, 6
    img = torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    t = v2.Compose([v2.RandomCrop(size, padding=pad, padding_mode=mode)])
    assert translate(t)[0].params["padding_mode"] == mode
    out = run_ops(img.expand(400, 3, size, size).contiguous(), translate(t), torch.Generator().manual_seed(0))
    padded = TF.pad(img, [pad], padding_mode=mode)
    places = {(i, j): padded[:, i : i + size, j : j + size] for i in range(2 * pad + 1) for j in range(2 * pad + 1)}
    seen = set()
    for x in out:
        hit = [ij for ij, crop in places.items() if torch.equal(x, crop)]
        assert hit, "a crop that torchvision's padding cannot give"
        seen.add(hit[0])
    assert seen == set(places)  # 25 places, 400 draws: each drawn


def test_a_vertical_flip_is_translated_at_its_rate_and_symmetric_padding_is_named():
    from torchvision.transforms import v2

    img = torch.arange(16, dtype=torch.uint8).reshape(1, 1, 4, 4).expand(2000, 3, 4, 4).contiguous()
    out = run_ops(img, translate(v2.RandomVerticalFlip(p=0.3)), torch.Generator().manual_seed(0))
    flipped = (out == img.flip(-2)).flatten(1).all(1)
    assert ((out == img).flatten(1).all(1) | flipped).all() and abs(flipped.float().mean().item() - 0.3) < 0.04
    with pytest.raises(Skip, match="padding_mode='symmetric'"):
        translate(v2.RandomCrop(8, padding=2, padding_mode="symmetric"))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_the_fused_crops_and_flips_draw_and_compute_what_the_ops_one_by_one_do(mode):
    """The fused form (one gather a batch, pixels looked up) makes the same draws from the same
    generator state as the ops run one by one, and the same bits: crop with padding, both flips,
    scaling and normalisation."""
    from torchvision.transforms import v2

    from fastloop.speedups.gpu_augment.gpu_augment import Fused
    from fastloop.speedups.gpu_augment.ops import normalize, random_crop, random_flip

    x = torch.randint(0, 256, (64, 3, 9, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    t = v2.Compose(
        [
            v2.RandomCrop((8, 6), padding=[1, 2, 3, 0], fill=7, padding_mode=mode),
            v2.RandomHorizontalFlip(),
            v2.RandomVerticalFlip(p=0.3),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.1, 0.2, 0.3], [0.3, 0.2, 0.1]),
        ]
    )
    ops = translate(t)
    assert Fused.of(ops, x) is not None
    got = run_ops(x, ops, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    want = random_crop(x, (8, 6), padding=(1, 2, 3, 0), fill=7, padding_mode=mode, generator=g)
    want = random_flip(random_flip(want, p=0.5, generator=g), p=0.3, vertical=True, generator=g)
    want = normalize(want.float() / 255.0, [0.1, 0.2, 0.3], [0.3, 0.2, 0.1])
    assert torch.equal(got, want)
    assert Fused.of(translate(v2.Compose([v2.RandomHorizontalFlip(), v2.RandomResizedCrop(8)])), x) is None
    assert (
        Fused.of(translate(v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.RandomHorizontalFlip()])), x) is None
    )


def test_the_loader_makes_a_batch_in_a_few_ops_and_draws_anew_past_each_chunk():
    """A CIFAR-style batch costs the host a few dispatched ops (it launches them between steps;
    the ops one by one were about 30), and past each chunk of draws the crops are drawn anew:
    every sample is still one of the crops and flips of its own stored image."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as TF

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    pad = 2
    t = v2.Compose([v2.RandomCrop(16, padding=pad), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])
    ds = AugmentedImages(n=24, transform=t)
    aug = make_augmented(DataLoader(ds, batch_size=4), CPU)
    assert aug.fused is not None
    it = iter(aug)
    next(it)
    with Count() as count:
        next(it)
    assert len(count.ops) <= 10, count.ops
    aug.chunk = 5  # a new draw at the 2nd, 3rd, ... batch
    out = torch.cat([x for x, _ in aug])
    assert out.shape == (24, 3, 16, 16)
    for i, x in enumerate(out):
        padded = TF.pad(ds.data[i], [pad]).float() / 255.0
        crops = [
            c
            for a in range(2 * pad + 1)
            for b in range(2 * pad + 1)
            for c in (padded[:, a : a + 16, b : b + 16], padded[:, a : a + 16, b : b + 16].flip(-1))
        ]
        assert any(torch.equal(x, c) for c in crops), i


def test_float_images_are_fused_too_their_pixels_computed_after_the_gather():
    """Stored float images get no per-value table (it needs uint8): the gather is fused and the
    per-pixel ops run after it, the same draws and bits as the ops one by one."""
    from torchvision.transforms import v2

    from fastloop.speedups.gpu_augment.gpu_augment import Fused
    from fastloop.speedups.gpu_augment.ops import normalize, random_crop, random_flip

    x = torch.rand(32, 3, 10, 10, generator=torch.Generator().manual_seed(2))
    ops = translate(
        v2.Compose(
            [
                v2.RandomCrop(8, padding=1, fill=0.5),
                v2.RandomHorizontalFlip(),
                v2.Normalize([0.4, 0.5, 0.6], [0.2, 0.3, 0.4]),
            ]
        )
    )
    fused = Fused.of(ops, x)
    assert fused is not None and fused.table is None
    got = run_ops(x, ops, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    want = random_flip(random_crop(x, 8, padding=1, fill=0.5, generator=g), generator=g)
    assert torch.equal(got, normalize(want, [0.4, 0.5, 0.6], [0.2, 0.3, 0.4]))


def test_a_random_resized_crop_is_fused_with_the_same_draws_and_bits():
    """RandomResizedCrop then flips then per-pixel work: the boxes and flips drawn for many samples
    at once, a batch one roi_align and one table lookup, the same draws and bits as the ops one by
    one; the loader redraws only past each chunk."""
    from torchvision.transforms import v2

    from fastloop.speedups.gpu_augment.gpu_augment import Fused
    from fastloop.speedups.gpu_augment.ops import normalize, random_flip, random_resized_crop

    x = torch.randint(0, 256, (48, 3, 20, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    t = v2.Compose(
        [
            v2.RandomResizedCrop((12, 10), scale=(0.2, 1.0)),
            v2.RandomHorizontalFlip(),
            v2.RandomVerticalFlip(0.4),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.3, 0.4, 0.5], [0.2, 0.25, 0.3]),
        ]
    )
    ops = translate(t)
    assert Fused.of(ops, x) is not None and Fused.of(ops, x).resized is not None
    got = run_ops(x, ops, torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(9)
    want = random_resized_crop(x, (12, 10), (0.2, 1.0), (3 / 4, 4 / 3), generator=g)
    want = random_flip(random_flip(want, p=0.5, generator=g), p=0.4, vertical=True, generator=g)
    assert torch.equal(got, normalize(want.float() / 255.0, [0.3, 0.4, 0.5], [0.2, 0.25, 0.3]))
    ds = AugmentedImages(
        n=40,
        size=16,
        transform=v2.Compose(
            [v2.RandomResizedCrop(8), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)]
        ),
    )
    aug = make_augmented(DataLoader(ds, batch_size=8), CPU)
    assert aug.fused is not None and aug.chunk >= 8
    aug.chunk = 12  # a new draw every other batch
    out = torch.cat([b for b, _ in aug])
    assert out.shape == (40, 3, 8, 8) and out.dtype == torch.float32 and 0 <= out.min() and out.max() <= 1


@pytest.mark.gpu
def test_on_cuda_the_fused_forms_give_the_ops_one_by_one_bits():
    """On the GPU (the draws from a CUDA generator): the fused crop-and-flip and resized-crop forms
    give the same bits as the ops one by one from the same generator state."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torchvision.transforms import v2

    x = torch.randint(0, 256, (64, 3, 24, 20), dtype=torch.uint8, device="cuda")
    for t in (
        v2.Compose(
            [
                v2.RandomCrop(16, padding=4, padding_mode="reflect"),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize([0.5] * 3, [0.25] * 3),
            ]
        ),
        v2.Compose(
            [
                v2.RandomResizedCrop(12),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize([0.4] * 3, [0.2] * 3),
            ]
        ),
    ):
        ops = translate(t)
        fused = run_ops(x, ops, torch.Generator(device="cuda").manual_seed(7))
        one_by_one = run_ops(x, ops, torch.Generator(device="cuda").manual_seed(7), fuse=False)
        assert fused.is_cuda and torch.equal(fused, one_by_one)


class _Unchecked(torch.utils.data.Dataset):
    """A hand-written dataset as many are: it calls ``self.transform`` without checking for None,
    on a PIL image made from a stored HWC uint8 array; ``as_dict``: samples as dicts."""

    def __init__(self, transform, n: int = 64, as_dict: bool = False) -> None:
        import numpy as np

        self.data = np.random.default_rng(0).integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)
        self.labels = [i % 10 for i in range(n)]
        self.transform, self.as_dict = transform, as_dict

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        from PIL import Image

        image = self.transform(Image.fromarray(self.data[i]))
        return {"image": image, "label": self.labels[i]} if self.as_dict else (image, self.labels[i])


def test_a_dataset_calling_its_transform_unchecked_is_read_and_dict_samples_are_named():
    """The stored sample was once read with the transform set to None, so a ``__getitem__``
    that calls ``self.transform(img)`` unchecked failed with a TypeError inside the run (the check
    before it had passed). It is read with a transform that changes nothing; samples that are dicts
    are refused by the check itself, with the reason."""
    from torchvision import transforms as T

    tf = T.Compose(
        [
            T.RandomCrop(16, padding=2),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]),
        ]
    )
    loader = DataLoader(_Unchecked(tf), batch_size=16, shuffle=True, drop_last=True)
    assert augment_why_not(loader) is None
    aug = make_augmented(loader, CPU)
    assert aug.resident.tensors[0].dtype == torch.uint8 and aug.resident.tensors[0].shape[1:] == (3, 16, 16)
    assert torch.equal(aug.resident.tensors[0][0].permute(1, 2, 0), torch.from_numpy(loader.dataset.data[0]))
    (x, y), (xa, ya) = next(iter(loader)), next(iter(aug))
    assert xa.shape == x.shape and xa.dtype == x.dtype and ya.dtype == torch.as_tensor(y).dtype
    assert loader.dataset.transform is tf  # put back
    dicts = DataLoader(_Unchecked(tf, as_dict=True), batch_size=16)
    assert "gives dict samples, not (image, ...) tuples" in augment_why_not(dicts)
    with pytest.raises(Skip, match="gives dict samples"):
        make_augmented(dicts, CPU)
