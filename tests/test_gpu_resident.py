"""GPU-resident data on CPU tensors standing in for the device: same batches as the DataLoader
for the same seed, drop_last and epochs honoured, refusals with reasons; the batched
augmentations match torchvision's per-sample transforms."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from fastloop.speedups.base import Context, Skip
from fastloop.speedups.gpu_augment.ops import normalize, random_crop, random_flip
from fastloop.speedups.gpu_resident.gpu_resident import GPUResident, NotResident, make_resident

CPU = torch.device("cpu")


def _ds(n=50):
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g), torch.arange(n))


@pytest.mark.parametrize("shuffle,drop_last", [(True, False), (True, True), (False, False), (False, True)])
def test_same_batches_as_the_dataloader_over_epochs(shuffle, drop_last):
    ds = _ds()

    def loader():
        return DataLoader(
            ds, batch_size=8, shuffle=shuffle, drop_last=drop_last, generator=torch.Generator().manual_seed(7)
        )

    ref, resident = loader(), make_resident(loader(), CPU)
    assert len(resident) == len(ref)
    for _ in range(3):  # epochs: a new permutation each, from the same generator
        got = list(resident)
        want = list(ref)
        assert len(got) == len(want) == (6 if drop_last else 7)
        for (gx, gy), (wx, wy) in zip(got, want):
            assert gx.dtype == torch.uint8  # stored dtype kept
            assert torch.equal(gx, wx) and torch.equal(gy, wy)


def test_subset_and_batch_sampler_follow_the_loader():
    ds = _ds()
    sub = Subset(ds, list(range(0, 50, 3)))
    ref = DataLoader(sub, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3))
    res = make_resident(DataLoader(sub, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3)), CPU)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(res, ref))
    bs = [[0, 1], [5, 7, 9], [2]]
    res = make_resident(DataLoader(ds, batch_sampler=bs), CPU)
    assert [b[1].tolist() for b in res] == bs


class Augmented(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.rand(3), i


@pytest.mark.parametrize(
    "loader,why",
    [
        (DataLoader(Augmented(), batch_size=2), "its __getitem__ may transform each sample"),
        (DataLoader(_ds(), batch_size=2, collate_fn=lambda b: b), "custom collate_fn"),
        ([1, 2, 3], "not a torch DataLoader"),
        (DataLoader(_ds(), batch_size=None), r"does not batch \(batch_size=None"),
    ],
)
def test_refusals_say_why(loader, why):
    with pytest.raises(NotResident, match=why):
        make_resident(loader, CPU)
    with pytest.raises(Skip, match=why) as skipped:  # the adapter records it as skipped, with this reason
        GPUResident().apply_loader(loader, Context(CPU))
    assert skipped.value.status == "skipped"


def test_too_large_for_the_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000, 10_000))
    with pytest.raises(NotResident, match="more than 50% of the"):
        make_resident(DataLoader(_ds(), batch_size=4), torch.device("cuda"))


def test_other_data_speedups_step_aside():
    """gpu_resident, applied, declares in the run's inputs that the batches are on the device; the
    CPU feed applied after it in the same run steps aside with that reason."""
    from fastloop.speedups import resolve

    (gpu_resident,) = resolve("gpu_resident")
    ctx = Context(CPU)
    resident = gpu_resident.apply_loader(DataLoader(_ds(), batch_size=4), ctx)
    assert ctx.inputs.batches_on_device == "gpu_resident"
    for s in resolve("workers,pin_memory,prefetch"):
        with pytest.raises(Skip) as skipped:
            s.apply_loader(resident, ctx)
        assert skipped.value.reason == "the data is already on the GPU (gpu_resident)"


def test_random_crop_matches_torchvision_in_distribution():
    from torchvision.transforms import RandomCrop

    x = torch.arange(36, dtype=torch.uint8).reshape(1, 1, 6, 6).repeat(4000, 1, 1, 1)
    g = torch.Generator().manual_seed(0)
    ours = random_crop(x, 6, padding=2, generator=g)
    torch.manual_seed(0)
    tv = torch.stack([RandomCrop(6, padding=2)(img) for img in x[:4000]])
    # the top-left pixel's value identifies the offset: compare the offset histograms
    h_ours = np.bincount(ours[:, 0, 2, 2].numpy(), minlength=36)
    h_tv = np.bincount(tv[:, 0, 2, 2].numpy(), minlength=36)
    assert (h_ours > 0).sum() == (h_tv > 0).sum() == 25  # every one of the 5x5 offsets occurs
    chi2 = (((h_ours - h_tv) ** 2) / np.maximum(h_ours + h_tv, 1)).sum()
    assert chi2 < 60, chi2  # two samples of one uniform distribution (24 dof)
    # each crop is an exact window of the padded image
    padded = torch.nn.functional.pad(x[:1], (2, 2, 2, 2))
    windows = {tuple(padded[0, 0, i : i + 6, j : j + 6].flatten().tolist()) for i in range(5) for j in range(5)}
    assert all(tuple(c.flatten().tolist()) in windows for c in ours[:50, 0])


def test_flip_rate_and_exactness():
    x = torch.arange(8.0).reshape(1, 1, 2, 4).repeat(10000, 1, 1, 1)
    out = random_flip(x, generator=torch.Generator().manual_seed(0))
    flipped = (out[:, 0, 0, 0] == 3).float()
    assert abs(flipped.mean().item() - 0.5) < 0.02
    assert torch.equal(out[flipped.bool()][0], x[0].flip(-1))
    assert torch.equal(random_flip(x[:3], p=0.0), x[:3]) and torch.equal(random_flip(x[:3], p=1.0), x[:3].flip(-1))


def test_normalize_equals_totensor_then_normalize():
    from torchvision.transforms import Normalize
    from torchvision.transforms.functional import to_tensor

    x = torch.randint(0, 256, (3, 3, 5, 5), dtype=torch.uint8)
    mean, std = [0.49, 0.48, 0.45], [0.25, 0.24, 0.26]
    ref = torch.stack([Normalize(mean, std)(to_tensor(img.permute(1, 2, 0).numpy())) for img in x])
    assert torch.allclose(normalize(x, mean, std), ref, atol=1e-6)
    with pytest.raises(ValueError, match="one value per channel"):
        normalize(x, [0.5], [0.5])


class InMemory(Dataset):
    """The pattern users write instead of a TensorDataset: tensors held by the dataset, a
    deterministic ``__getitem__`` (a scale and a Python int label)."""

    def __init__(self, n=50, bare=False):
        g = torch.Generator().manual_seed(2)
        self.images = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g)
        self.labels = np.arange(n) % 7
        self.bare = bare

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i].float() / 255
        return x if self.bare else (x, self.labels[i])  # a numpy int64 label, as indexing an array gives


class RarelyFlipped(InMemory):
    """A random augmentation applied to 5% of reads: fixed_samples must still see it."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return (x.flip(-1) if torch.rand(()) < 0.05 else x), y


class WithTransform(InMemory):
    def __init__(self):
        super().__init__()
        self.transform = lambda x: x


class OwnGenerator(InMemory):
    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(0)


@pytest.mark.parametrize("bare", [False, True])
def test_a_dataset_holding_its_samples_is_read_once_and_serves_the_loaders_batches(bare):
    def loader():
        return DataLoader(InMemory(bare=bare), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(5))

    ref, resident = loader(), make_resident(loader(), CPU)
    for _ in range(2):  # two epochs, the same permutations
        for got, want in zip(resident, ref, strict=True):
            if bare:
                assert torch.is_tensor(got) and torch.equal(got, want)  # a tensor, not a list of one
            else:
                assert isinstance(got, list) and len(got) == 2
                assert got[0].dtype == want[0].dtype == torch.float32 and torch.equal(got[0], want[0])
                assert got[1].dtype == want[1].dtype == torch.int64 and torch.equal(got[1], want[1])
    sub = Subset(InMemory(), list(range(1, 50, 4)))
    res = make_resident(DataLoader(sub, batch_size=4), CPU)
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(res, DataLoader(sub, batch_size=4), strict=True)
    )


@pytest.mark.parametrize(
    "dataset,why",
    [
        (RarelyFlipped(), "gave different values when read again"),
        (WithTransform(), "passes its samples through transform"),
        (OwnGenerator(), "owns a random generator"),
    ],
)
def test_a_dataset_whose_samples_may_change_is_refused_and_the_probe_draws_nothing(dataset, why):
    torch.manual_seed(11)
    np.random.seed(11)
    expected = torch.rand(3), np.random.rand()
    torch.manual_seed(11)
    np.random.seed(11)
    with pytest.raises(NotResident, match=why):
        make_resident(DataLoader(dataset, batch_size=4), CPU)
    after = torch.rand(3), np.random.rand()
    assert torch.equal(after[0], expected[0]) and after[1] == expected[1]  # the global random streams untouched


def test_the_run_document_tells_the_ladder_such_data_can_live_on_the_gpu():
    from fastloop.drivers.run_document import describe_dataset

    held = describe_dataset(DataLoader(InMemory(n=40), batch_size=4))
    assert held["in_memory_tensors"] is True and held["read_once"] is True
    assert held["bytes"] == 40 * (3 * 8 * 8 * 4 + 8)
    flipped = describe_dataset(DataLoader(RarelyFlipped(), batch_size=4))
    assert flipped["in_memory_tensors"] is False and "different values" in flipped["why_not"]


def test_a_dataset_too_slow_to_read_once_is_refused_after_one_probe(monkeypatch):
    import fastloop.data as data

    reads = []

    class Slow(InMemory):
        def __getitem__(self, i):
            reads.append(i)
            return super().__getitem__(i)

    monkeypatch.setattr(data, "FIXED_MAX_S", 1e-9)
    found = data.fixed_samples(Slow())
    assert isinstance(found, str) and "would take about" in found
    assert reads == [0, 0, 0]  # one index read three times, not all 50


def test_a_list_of_sample_tensors_counts_as_held_and_a_list_of_strings_does_not():
    from fastloop.data import fixed_samples

    class Listed(Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(3)
            self.samples = [(torch.rand(4, generator=g), torch.tensor(i % 3)) for i in range(20)]

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            return self.samples[i]

    class Lines(Listed):
        def __init__(self):
            super().__init__()
            self.lines = [str(i) for i in range(20)]
            del self.samples

        def __len__(self):
            return len(self.lines)

        def __getitem__(self, i):
            return torch.tensor([float(self.lines[i])]), 0

    assert fixed_samples(Listed()).n == 20
    ref = DataLoader(Listed(), batch_size=6)
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(make_resident(DataLoader(Listed(), batch_size=6), CPU), ref, strict=True)
    )
    assert "holds no tensor, array or list of tensors" in fixed_samples(Lines())


class CifarLike(Dataset):
    """Laid out as torchvision's CIFAR10: HWC uint8 images in an array, labels in a list of ints,
    a PIL image through ``transform`` (torchvision's), ``target_transform`` None."""

    def __init__(self, transform, n=40):
        rng = np.random.default_rng(0)
        self.data = rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
        self.targets = [int(t) for t in rng.integers(0, 10, n)]
        self.transform, self.target_transform = transform, None

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        from PIL import Image

        img, target = Image.fromarray(self.data[i]), self.targets[i]
        if self.transform is not None:
            img = self.transform(img)
        return img, target


def test_a_fixed_torchvision_transform_is_read_once_and_a_random_one_is_named():
    from torchvision import transforms as T

    fixed = CifarLike(T.Compose([T.ToTensor(), T.Normalize((0.49, 0.48, 0.45), (0.25, 0.24, 0.26))]))

    def loader(ds):
        return DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2))

    for got, want in zip(make_resident(loader(fixed), CPU), loader(fixed), strict=True):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[1].dtype == torch.int64
    flipped = CifarLike(T.Compose([T.RandomHorizontalFlip(), T.ToTensor()]))
    with pytest.raises(NotResident, match=r"transform \(RandomHorizontalFlip\)"):
        make_resident(loader(flipped), CPU)
    own = CifarLike(lambda img: T.functional.to_tensor(img))  # any other callable may draw: refused
    with pytest.raises(NotResident, match=r"transform \(<lambda>\)"):
        make_resident(loader(own), CPU)


class Encoded(Dataset):
    """As Hugging Face's fine-tuning tutorials write it: a tokenizer's encodings (a dict of lists
    of token ids) and a list of labels, a dict of tensors per sample."""

    def __init__(self, n=30):
        rng = np.random.default_rng(1)
        self.encodings = {
            "input_ids": [[int(t) for t in rng.integers(1, 100, 12)] for _ in range(n)],
            "attention_mask": [[1] * 12 for _ in range(n)],
        }
        self.labels = [int(t) for t in rng.integers(0, 2, n)]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        item = {key: torch.tensor(val[idx]) for key, val in self.encodings.items()}
        item["labels"] = torch.tensor(self.labels[idx])
        return item


def test_dict_samples_of_a_tokenized_dataset_are_served_as_the_loaders_dict_batches():
    def loader(ds):
        return DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(4))

    ds = Encoded()
    resident = make_resident(loader(ds), CPU)
    n = 0
    for got, want in zip(resident, loader(ds), strict=True):
        assert isinstance(got, dict) and list(got) == ["input_ids", "attention_mask", "labels"] == list(want)
        assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
        n += 1
    assert n == 4

    class Nested(Encoded):
        def __getitem__(self, idx):
            return {"inputs": super().__getitem__(idx), "idx": idx}

    with pytest.raises(NotResident, match="does not stack into tensors alone"):
        make_resident(loader(Nested()), CPU)


def test_a_concatenation_of_in_memory_datasets_is_read_once_and_one_random_part_refuses_it():
    from torch.utils.data import ConcatDataset

    both = ConcatDataset([_ds(20), InMemory(n=12)])  # a TensorDataset and a dataset of one's own
    with pytest.raises(NotResident, match="could not be stacked"):  # tensor labels beside numpy ones: no stacking
        make_resident(DataLoader(both, batch_size=4), CPU)
    same = ConcatDataset([InMemory(n=12), InMemory(n=8)])

    def loader(ds):
        return DataLoader(ds, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(1))

    for got, want in zip(make_resident(loader(same), CPU), loader(same), strict=True):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(NotResident, match="gave different values when read again"):
        make_resident(loader(ConcatDataset([InMemory(n=12), RarelyFlipped()])), CPU)


def _batches_equal(a, b) -> bool:
    from fastloop.speedups.gpu_resident.padded import first_difference

    return len(a) == len(b) and all(first_difference(x, y) is None for x, y in zip(a, b))


def _two_epochs(loader) -> list:
    torch.manual_seed(11)
    return [b for _ in range(2) for b in loader]


@pytest.mark.parametrize("collate", ["pad_collate", "left_pad_lm_collate"])
def test_a_padding_collate_is_served_from_padded_samples_with_the_collates_own_batches(collate):
    """In-memory token rows with a collate that pads to the batch's longest row (right,
    or left with -100 labels): gpu_resident stores the samples padded and cuts every batch as the
    collate builds it; two epochs of shuffled batches equal the loader's, key by key, dtype by dtype."""
    from fastloop.speedups.gpu_resident.padded import PaddedResidentLoader
    from tests import targets

    def make():  # 25 batches an epoch: more than the 8 the padding is read from
        return DataLoader(
            targets.TextRows(n=200, causal=collate != "pad_collate"),
            batch_size=8,
            shuffle=True,
            collate_fn=getattr(targets, collate),
        )

    resident = make_resident(make(), torch.device("cpu"))
    assert isinstance(resident, PaddedResidentLoader)
    assert _batches_equal(_two_epochs(make()), _two_epochs(resident))
    assert GPUResident().why_not_data(make()) is None


def _sorted_collate(samples):
    """Sorts the batch by length (not the samples' own order): not a padding gpu_resident reproduces."""
    from tests.targets import pad_collate

    return pad_collate(sorted(samples, key=lambda s: len(s["input_ids"])))


def _multiple_of_8(samples):
    """Pads to a multiple of 8 (Hugging Face's pad_to_multiple_of=8): a sample alone is padded so too,
    so the cut batches are the collate's (learnt by example, not parsed)."""
    from tests.targets import pad_collate

    b = pad_collate(samples)
    extra = -b["input_ids"].shape[1] % 8
    return {k: torch.nn.functional.pad(v, (0, extra)) if v.dim() == 2 else v for k, v in b.items()}


def _weighted(samples):
    """A weight per row that depends on the whole batch (its share of the batch's tokens)."""
    from tests.targets import pad_collate

    b = pad_collate(samples)
    n = b["attention_mask"].sum(1).float()
    return {**b, "weight": n / n.sum()}


def test_a_collate_that_pads_to_a_multiple_is_reproduced_too():
    from tests.targets import TextRows

    make = lambda: DataLoader(TextRows(n=60), batch_size=8, shuffle=True, collate_fn=_multiple_of_8)  # noqa: E731
    assert GPUResident().why_not_data(make()) is None
    assert _batches_equal(_two_epochs(make()), _two_epochs(make_resident(make(), torch.device("cpu"))))


@pytest.mark.parametrize(
    "collate, words",
    [
        (_sorted_collate, "batch 0, batch['input_ids']: different values"),
        (_weighted, "batch 0, batch['weight']: different values"),
    ],
)
def test_a_collate_it_does_not_reproduce_is_refused_with_the_first_difference_before_the_run(collate, words):
    from tests.targets import TextRows

    loader = DataLoader(TextRows(n=60), batch_size=8, collate_fn=collate)
    why = GPUResident().why_not_data(loader)
    assert why is not None and words in why and "(collate_fn vs cut from the padded samples)" in why, why
    with pytest.raises(NotResident, match=re.escape(words)):
        make_resident(loader, torch.device("cpu"))


def test_a_custom_collate_over_samples_that_are_not_fixed_keeps_the_refusal_before_the_run():
    from tests.targets import pad_collate

    class Drawn(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return {"input_ids": torch.randint(1, 50, (5 + i % 7,)), "label": i % 2}

    why = GPUResident().why_not_data(DataLoader(Drawn(), batch_size=4, collate_fn=pad_collate))
    assert why is not None and why.startswith("the loader has a custom collate_fn and the dataset (Drawn) holds no"), (
        why
    )


class WithOutliers(Dataset):
    """TextRows' 5-40 token rows, and four of 100 tokens far into the epoch (indices 180-183)."""

    def __init__(self, n: int = 200) -> None:
        from tests.targets import TextRows

        self.rows = [
            r if not 180 <= i < 184 else torch.arange(1, 101) % 49 + 1 for i, r in enumerate(TextRows(n=n).rows)
        ]
        self.labels = [i % 3 for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "label": self.labels[i]}


def _token_budget(samples):
    """Pads to the batch's longest row, cut to a token budget of 512 a batch (64 a row in a batch
    of 8; a sample alone keeps 512): only a batch holding a row over 64 tokens is truncated."""
    from tests.targets import pad_collate

    b = pad_collate(samples)
    keep = max(64, 512 // len(samples))
    return {k: v[:, :keep] if v.dim() == 2 else v for k, v in b.items()}


def test_a_collate_that_truncates_only_the_longest_rows_is_refused_at_the_batch_that_shows_it():
    """The cut batches are compared with the collate's on every batch of an epoch (and on batches
    of the longest rows): a difference past the batches the padding is read from is caught."""
    loader = DataLoader(WithOutliers(), batch_size=8, collate_fn=_token_budget)
    with pytest.raises(NotResident, match=r"batch 22, batch\['input_ids'\]: shape \(8, 64\) vs \(8, 100\)"):
        make_resident(loader, CPU)


def test_the_padded_store_is_sized_before_it_is_built_and_refused_with_the_figure(monkeypatch):
    """N x the longest row x the dtype, every field, from the samples' shapes: refused against the
    host's available memory and the device's free memory before anything is padded."""
    import fastloop.speedups.gpu_resident.padded as rp

    def built(*args):
        raise AssertionError("the padded samples were built before their size was checked")

    monkeypatch.setattr(rp, "_store", built)
    loader = DataLoader(WithOutliers(), batch_size=8, collate_fn=_multiple_of_8)
    # input_ids and attention_mask, int64, 200 x 104 (the longest, 100, padded to a multiple of 8), and labels
    want = 200 * 104 * 8 * 2 + 200 * 8
    monkeypatch.setattr(rp, "host_available_bytes", lambda: 2 * want - 2)
    with pytest.raises(NotResident, match=r"padded to their longest take 0.32 MiB \(200 samples; input_ids 104 long, "):
        make_resident(loader, CPU)
    monkeypatch.setattr(rp, "host_available_bytes", lambda: 2 * want)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * want - 2, 10**12))
    with pytest.raises(NotResident, match="take 0.32 MiB, more than 50% of the 0.64 MiB of free GPU memory"):
        make_resident(loader, torch.device("cuda"))
    size, what = rp._padded_size(
        {i: rp.tensors_of(_multiple_of_8([WithOutliers()[i]])) for i in range(200)},
        {0: (1, "tail", 0), 1: (1, "tail", 0)},
        ["input_ids", "attention_mask", "labels"],
    )
    assert size == want and what == "200 samples; input_ids 104 long, int64, attention_mask 104 long, int64"


def _with_text(samples):
    """A padding collate that also hands out each sample's raw text (a list of strings) and a tag."""
    from tests.targets import pad_collate

    return {
        **pad_collate(samples),
        "text": [" ".join(map(str, s["input_ids"][:3].tolist())) for s in samples],
        "source": "train",
    }


def _with_longest(samples):
    """A number that depends on the whole batch (its longest row), beside the tensors."""
    from tests.targets import pad_collate

    b = pad_collate(samples)
    return {**b, "longest": b["input_ids"].shape[1]}


def test_parts_without_tensors_are_built_per_batch_or_the_collate_is_refused():
    """A list of one value per sample is gathered for each batch, a value the same in every batch
    is kept; a part that depends on the batch otherwise is refused with its name (it would be
    copied from one batch to all)."""
    from tests.targets import TextRows

    make = lambda: DataLoader(TextRows(n=200), batch_size=8, shuffle=True, collate_fn=_with_text)  # noqa: E731
    resident = make_resident(make(), CPU)
    assert _batches_equal(_two_epochs(make()), _two_epochs(resident))
    assert resident.store.same == {("source",): "train"} and list(resident.store.per_sample) == [("text",)]
    loader = DataLoader(TextRows(n=200), batch_size=8, shuffle=True, collate_fn=_with_longest)
    with pytest.raises(NotResident, match=r"holds batch\['longest'\] \(int\), which is neither one value per sample"):
        make_resident(loader, CPU)
    assert "batch['longest'] (int)" in GPUResident().why_not_data(loader)
