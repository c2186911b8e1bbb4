"""gpu_augment (issue 50): a torchvision pipeline with random ops on in-memory images, translated
and run on each whole batch with per-sample draws. Distributional equivalence: crop offsets
uniform over the same range, flips at rate p, normalisation exact, the batch structure the
loader's; unrecognised ops skipped with their name. Run here on the CPU (the kernels are the
same torch code on the GPU)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from fastloop.speedups.base import Skip
from fastloop.speedups.gpu_augment import augment_why_not, make_augmented, run_ops, translate
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
    out = run_ops(batch, translate(v2.Compose([v2.RandomCrop(size, padding=pad), v2.RandomHorizontalFlip(p=0.0)])),
                  torch.Generator().manual_seed(0))
    row = out[:, 0, :, :].max(dim=1).values.long()  # (n, size), whatever the vertical shift
    first_real = (row > 0).float().argmax(dim=1)  # where column value 1 landed when the crop starts in the padding
    left = torch.where(row[:, 0] > 0, row[:, 0] - 1 + pad, pad - first_real)
    counts = torch.bincount(left, minlength=2 * pad + 1).float()
    expected = n / (2 * pad + 1)
    assert len(counts) == 2 * pad + 1 and ((counts - expected).abs() < 0.15 * expected).all(), counts
    flips = run_ops(batch, translate(v2.Compose([v2.RandomCrop(size, padding=0), v2.RandomHorizontalFlip(p=0.3)])),
                    torch.Generator().manual_seed(1))
    rate = (flips[:, 0, 0, 0] > flips[:, 0, 0, -1]).float().mean().item()
    assert abs(rate - 0.3) < 0.04, rate  # p = 0.3, n = 4000: about 5 sigma


def test_normalisation_is_exact():
    from torchvision.transforms import v2

    data = AugmentedImages(n=8).data
    t = v2.Compose([v2.RandomCrop(16, padding=0), v2.ToDtype(torch.float32, scale=True),
                    v2.Normalize([0.1, 0.2, 0.3], [0.5, 0.25, 0.2])])
    got = run_ops(data, translate(t), torch.Generator())
    want = torch.stack([t(x) for x in data])
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("op,name", [("ColorJitter", "ColorJitter"), ("RandomRotation", "RandomRotation")])
def test_an_unrecognised_op_is_skipped_with_its_name(op, name):
    from torchvision.transforms import v2

    t = v2.Compose([v2.RandomCrop(16, padding=2), getattr(v2, op)(0.5) if op == "ColorJitter" else v2.RandomRotation(10)])
    with pytest.raises(Skip, match=name):
        translate(t)
    loader = DataLoader(AugmentedImages(transform=t), batch_size=8)
    assert name in augment_why_not(loader)


def test_a_user_function_and_a_target_transform_are_named():
    loader = DataLoader(AugmentedImages(transform=lambda x: x.float()), batch_size=8)
    assert "function" in augment_why_not(loader) or "<lambda>" in augment_why_not(loader) or "not a torchvision op" in augment_why_not(loader)
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
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
                                  torch.nn.Flatten(), torch.nn.Linear(32, 4))
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
    got = run_ops(torch.stack([torch.from_numpy(a).permute(2, 0, 1) for a in ds.data]),
                  [op for op in translate(T.Compose([T.RandomHorizontalFlip(p=0.0), fixed])) if op.kind != "hwc_to_chw"],
                  torch.Generator())
    assert torch.allclose(got, torch.stack([fixed(ds[i][0]) for i in range(4)]), atol=1e-6)
