"""pad_buckets: pad values read from the collate's own output, a model that ignores its
mask refused, a tensor that does not vary left alone, buckets bounding the shapes, the loss
trajectory unchanged, and the ladder putting it in the compute bundle."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from fastloop.drivers.runner import run_configuration
from fastloop.errors import FastloopError
from fastloop.speedups.base import Skip, resolve
from fastloop.speedups.pad_buckets.pad_buckets import PadOptions, _sample, find_padding
from tests.targets import TextRows, masked_text, pad_collate, padded_lm


def _plan(loader, **kw):
    return find_padding(_sample(loader, 8), **kw)


def test_pad_values_and_side_are_read_from_the_collate():
    _, lm = padded_lm(batch_size=4)
    plan = _plan(lm)
    assert [(p.name, p.side, p.value) for p in plan.pads] == [
        ("input_ids", "tail", 0),
        ("attention_mask", "tail", 0),
        ("labels", "tail", -100),
    ]
    _, left = padded_lm(batch_size=4, left=True)
    assert {(p.name, p.side, p.value) for p in _plan(left).pads} == {
        ("input_ids", "head", 0),
        ("attention_mask", "head", 0),
        ("labels", "head", -100),
    }
    plan = _plan(left, multiple=8)
    batch = next(b for b in left if plan.bucket(b["labels"].shape[1]) != b["labels"].shape[1])
    n = batch["labels"].shape[1]
    padded = plan.pad(batch)
    extra = padded["labels"].shape[1] - n
    assert extra > 0 and (padded["labels"][:, :extra] == -100).all()  # the head, where a left-padding collate pads
    assert torch.equal(padded["labels"][:, extra:], batch["labels"])


def test_a_pad_id_other_than_zero_and_a_bool_mask_are_what_gets_written():
    def collate(samples):
        b = pad_collate(samples, pad_id=7)
        return {"ids": b["input_ids"], "mask": b["attention_mask"].bool(), "y": b["labels"]}

    loader = DataLoader(TextRows(n=64), batch_size=4, collate_fn=collate)
    plan = _plan(loader, multiple=64)
    assert {(p.name, p.value) for p in plan.pads} == {("ids", 7), ("mask", False)}
    out = plan.pad(next(iter(loader)))
    n = next(iter(loader))["ids"].shape[1]
    assert out["mask"].dtype == torch.bool and out["ids"].shape[1] == plan.bucket(n) >= n
    assert (out["ids"][:, n:] == 7).all() and not out["mask"][:, n:].any()


def test_a_tensor_that_does_not_vary_is_left_alone():
    _, loader = masked_text(batch_size=4)
    plan = _plan(loader)
    assert "labels" not in {p.name for p in plan.pads}  # [B] class labels: nothing varies
    batch = next(iter(loader))
    assert plan.pad(batch)["labels"] is batch["labels"]


def test_a_tensor_whose_pad_value_cannot_be_established_is_left_alone_with_the_reason():
    def collate(samples):
        b = pad_collate(samples)
        feats = torch.randn(b["input_ids"].shape)  # varies in length, but no pad value at its end
        return {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"], "feats": feats}

    loader = DataLoader(TextRows(n=64), batch_size=4, collate_fn=collate)
    plan = _plan(loader)
    assert "feats" not in {p.name for p in plan.pads}
    assert "feats" in plan.left_alone and "left alone" in plan.left_alone["feats"]


def test_batches_that_keep_one_shape_are_refused():
    loader = DataLoader(torch.utils.data.TensorDataset(torch.zeros(32, 5)), batch_size=4)
    with pytest.raises(Skip, match="nothing to pad"):
        _plan(loader)


def test_buckets_bound_the_number_of_distinct_shapes():
    _, loader = masked_text(batch_size=2)  # lengths 5-40: many shapes per epoch
    plan = _plan(loader, multiple=8)
    raw = {next(iter([b["input_ids"].shape[1]])) for b in loader}
    padded = {plan.pad(b)["input_ids"].shape[1] for b in loader}
    assert len(raw) > 8 and padded <= set(plan.buckets()) and len(padded) <= 5
    assert all(n % 8 == 0 or n == plan.top for n in padded)


def test_the_option_is_checked_where_it_is_parsed():
    with pytest.raises(
        FastloopError, match="pad_buckets: multiple must be an integer from 1 to 65,536 or none, got 'abc'"
    ):
        resolve("pad_buckets:abc")
    with pytest.raises(FastloopError, match="max_buckets"):
        PadOptions(max_buckets=0)
    assert resolve("pad_buckets:32")[0].opts.multiple == 32


@pytest.mark.filterwarnings("ignore")
def test_a_model_that_ignores_its_mask_is_refused_with_the_reason():
    doc = run_configuration(
        "tests/targets.py:unmasked_text",
        "pad_buckets",
        steps=4,
        warmup=1,
        device="cpu",
        steady_warmup=False,
        target_kwargs={"batch_size": 4},
    )
    rec = doc["speedups"][0]
    assert rec["status"] == "skipped" and rec["reason"].startswith(
        "the model's output depends on the padding (is the mask used?)"
    )


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("target", ["masked_text", "padded_lm", "typed_text", "encoded_text"])
def test_the_loss_trajectory_matches_the_unpadded_one(target):
    """The model masks its padding (labels -100 on the LM's): padded, the same losses within 1e-5
    relative (fp32 on the CPU: only the summation order of the masked positions differs)."""
    kw = dict(steps=12, warmup=2, device="cpu", steady_warmup=False, target_kwargs={"batch_size": 4})
    base = run_configuration(f"tests/targets.py:{target}", "none", **kw)
    pad = run_configuration(f"tests/targets.py:{target}", "pad_buckets", **kw)
    rec = pad["speedups"][0]
    assert rec["status"] == "applied", rec
    assert "loss in eval mode agreed" in rec["detail"]
    assert len(base["losses"]) == len(pad["losses"])
    worst = max(abs(a - b) / abs(a) for a, b in zip(base["losses"], pad["losses"]))
    assert worst <= 1e-5, worst
    assert pad["batch_shapes"]["distinct"] < base["batch_shapes"]["distinct"]
    assert pad["throughput"]["value"] > 0 and pad["extra"]["pad_buckets"]["buckets"]


def test_the_ladder_puts_the_padding_in_the_compute_bundle_and_measures_cuda_graph_with_it():
    from fastloop.drivers.ladder.candidates import split_groups
    from fastloop.drivers.run_document import data_checks

    feed, compute, _ = split_groups(resolve("workers,pad_buckets,bf16,compile"))
    assert [s.name for s in feed] == ["workers"] and "pad_buckets" in [s.name for s in compute]
    varying = {"steps": 40, "distinct": 30, "most_common_share": 0.05, "varying": "input 0 dim 1: 5-40"}
    assert "cuda_graph" in data_checks(varying) and "pad_buckets" not in data_checks(varying)
    one = {"steps": 40, "distinct": 2, "most_common_share": 0.9, "varying": "input 0 dim 0: 8-16"}
    assert "nothing to pad" in data_checks(one)["pad_buckets"]


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore")
def test_cuda_graph_keeps_one_whole_step_graph_per_bucket_and_trains_the_same():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    kw = dict(steps=40, warmup=4, device="cuda", steady_warmup=False, target_kwargs={"batch_size": 2})
    eager = run_configuration("tests/targets.py:masked_text", "pad_buckets:8", **kw)
    graphed = run_configuration("tests/targets.py:masked_text", "pad_buckets:8,cuda_graph", **kw)
    rec = {r["name"]: r for r in graphed["speedups"]}
    assert rec["cuda_graph"]["status"] == "applied", rec
    shapes = graphed["extra"]["cuda_graph_shapes"]
    assert shapes["graphs"] >= 2 and shapes["graphs"] <= len(graphed["extra"]["pad_buckets"]["buckets"]), shapes
    assert "batch shapes captured" in rec["cuda_graph"]["detail"]
    worst = max(abs(a - b) / abs(a) for a, b in zip(eager["losses"], graphed["losses"]))
    assert worst <= 1e-4, worst


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore")
def test_the_plain_loop_also_keeps_one_graph_per_bucket():
    """FastLoop's capture (adapters/graph_step.py) keeps a graph per batch shape too,
    up to MAX_GRAPHS, and trains as the eager loop does."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from fastloop.loop import FastLoop

    def train(spec):
        module, loader = masked_text(batch_size=2)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
        return FastLoop(
            module, opt, loader, step_fn=lambda m, b: m.training_step(b, 0)["loss"], speedups=spec, device="cuda"
        ).train(steps=40, warmup=4)

    eager, graphed = train("pad_buckets:8"), train("pad_buckets:8,cuda_graph")
    shapes = graphed.extra["cuda_graph_shapes"]
    assert shapes["graphs"] >= 2, shapes
    worst = max(abs(a - b) / abs(a) for a, b in zip(eager.losses, graphed.losses))
    assert worst <= 1e-4, worst


def test_the_padding_applies_before_the_feed_wraps_the_loader():
    """On an H100, in the ladder's feed bundle, prefetch had wrapped the loader in a
    prefetcher before pad_buckets came to it, and the padding skipped itself there. It now
    applies before pin_memory and prefetch (and after workers, whose rebuilt loader it keeps)."""
    names = [s.name for s in resolve("prefetch,pin_memory,pad_buckets,workers")]
    assert names.index("pad_buckets") < names.index("pin_memory") < names.index("prefetch")


@pytest.mark.filterwarnings("ignore")
def test_workers_then_pad_buckets_keeps_the_workers_loader_and_its_batches():
    """A loader rebuilt by a later speedup keeps the class and options of the one it
    replaces: workers' PersistentWorkersLoader (its RNG parity) survives pad_buckets, with the same
    batches as pad_buckets alone and the workers it was given."""
    from fastloop.loop import FastLoop
    from fastloop.speedups.workers import PersistentWorkersLoader
    from tests.targets import masked_text

    def batches(spec):
        module, loader = masked_text(batch_size=4)
        loop = FastLoop(
            module,
            module.configure_optimizers()["optimizer"],
            loader,
            device="cpu",
            speedups=spec,
            step_fn=lambda m, b: m.training_step(b, 0)["loss"],
        )
        torch.manual_seed(3)
        out = [b for _, b in zip(range(8), loop.loader)]
        return loop.loader, out

    workers_loader, with_workers = batches("workers:2,pad_buckets")
    _, alone = batches("pad_buckets")
    assert type(workers_loader) is PersistentWorkersLoader and workers_loader.num_workers == 2
    assert workers_loader.persistent_workers and "PaddedCollate" in type(workers_loader.collate_fn).__name__
    assert len(with_workers) == len(alone) == 8
    for a, b in zip(with_workers, alone):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_check_compares_the_models_outputs_on_the_real_positions_and_says_so():
    """Where a forward takes the batch (its own keys of a dict batch), the outputs on the real
    positions are compared, not only the loss; where none does, the record says the outputs were
    not compared."""
    from fastloop.drivers.runner import run_configuration

    kw = dict(steps=2, warmup=1, device="cpu")
    masked = {r["name"]: r for r in run_configuration("tests/targets.py:masked_text", "pad_buckets", **kw)["speedups"]}
    assert "the model's outputs on the real positions (max difference" in masked["pad_buckets"]["detail"]
    lm = {r["name"]: r for r in run_configuration("tests/targets.py:padded_lm", "pad_buckets", **kw)["speedups"]}
    assert "its outputs were not compared" in lm["pad_buckets"]["detail"]


def test_the_real_positions_are_cut_at_the_padded_side():
    from fastloop.speedups.pad_buckets.check import _real_part

    like = torch.zeros(2, 3, 4)
    padded = torch.arange(2 * 5 * 4.0).reshape(2, 5, 4)
    assert torch.equal(_real_part(padded, like, "tail"), padded[:, :3])
    assert torch.equal(_real_part(padded, like, "head"), padded[:, 2:])
    assert _real_part(torch.zeros(2, 5, 6), like, "tail") is None  # lengthened in two dims: not lined up


def test_more_bucket_lengths_than_torchs_recompile_limit_are_said_in_the_record():
    from fastloop.drivers.runner import run_configuration

    kw = dict(steps=2, warmup=1, device="cpu")
    few = run_configuration("tests/targets.py:masked_text", "pad_buckets", **kw)
    many = run_configuration("tests/targets.py:masked_text", "pad_buckets:2", **kw)  # lengths 33-40: 20 buckets
    assert "recompile limit" not in few["speedups"][0]["detail"]
    assert len(many["extra"]["pad_buckets"]["buckets"]) > many["extra"]["pad_buckets"]["recompile_limit"]
    assert "more than torch's recompile limit of" in many["speedups"][0]["detail"]


def test_nothing_is_padded_past_the_longest_length_seen():
    """On the GPU, long-tailed rows whose sampled batches reached 200 tokens were padded on to
    280 (a multiple past every length seen) and a 256-position model crashed. A batch is padded at
    most to the longest length sampled; a longer one is left at its own length."""
    ids = [torch.arange(1, n + 1) for n in (20, 50, 130, 200)]
    batches = [{"ids": torch.nn.utils.rnn.pad_sequence([ids[0], r], batch_first=True)} for r in ids[1:]]
    plan = find_padding(batches)
    assert plan.top == 200 and plan.multiple == 56  # a quarter of 200, rounded up to 8
    assert plan.buckets() == [56, 112, 168, 200] and max(plan.buckets()) == 200
    assert plan.pad({"ids": torch.ones(2, 190, dtype=torch.long)})["ids"].shape[1] == 200  # not 224
    assert plan.bucket(250) is None and plan.pad({"ids": torch.ones(2, 250, dtype=torch.long)})["ids"].shape[1] == 250
    assert len(find_padding(batches, max_buckets=2).buckets()) <= 2  # the default multiple raised to fit


def _hf_batch(lens, position_ids=False):
    """A Hugging Face-style BERT batch: ids and mask padded with 0, token_type_ids all 0 (one
    sentence), optionally position_ids as an arange over the padded length."""
    g = torch.Generator().manual_seed(sum(lens))
    n = max(lens)
    ids, mask = torch.zeros(len(lens), n, dtype=torch.long), torch.zeros(len(lens), n, dtype=torch.long)
    for i, k in enumerate(lens):
        ids[i, :k], mask[i, :k] = torch.randint(5, 100, (k,), generator=g), 1
    b = {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
        "labels": torch.arange(len(lens)) % 2,
    }
    if position_ids:
        b["position_ids"] = torch.arange(n).expand(len(lens), n).clone()
    return b


def test_a_tensor_that_changes_length_with_a_padded_one_is_padded_with_it():
    """token_type_ids all 0 ends alike in every row (its own tail says nothing), yet it changes
    length with input_ids: padded with the value it holds where input_ids is padded, so the batch
    keeps one length (left alone, the model would get ids of 16 and token types of 12)."""
    plan = find_padding([_hf_batch([5, 9, 3]), _hf_batch([12, 4, 7]), _hf_batch([6, 6, 2])], multiple=8)
    assert {(p.name, p.value) for p in plan.pads} == {("input_ids", 0), ("attention_mask", 0), ("token_type_ids", 0)}
    assert plan.left_alone == {}
    out = plan.pad(_hf_batch([5, 9, 3]))
    assert out["token_type_ids"].shape == out["input_ids"].shape == (3, 12)
    assert out["labels"].shape == (3,)


def test_a_tensor_in_step_with_the_padding_whose_pad_cannot_be_read_is_left_alone_with_the_reason():
    """position_ids as an arange holds many values where input_ids is padded: left alone, said so
    (the equivalence check then runs the step on the padded batch, and refuses it if it breaks)."""
    plan = find_padding([_hf_batch([5, 9, 3], True), _hf_batch([12, 4, 7], True)])
    assert "position_ids" not in {p.name for p in plan.pads}
    assert "changes length with input_ids but holds more than one value" in plan.left_alone["position_ids"]


def test_ids_padded_with_the_eos_every_row_ends_with_get_it_from_the_mask_beside_them():
    """GPT-2 style: the pad id is the EOS that ends every row, so the ids' own tails all end alike;
    the mask beside them says where the padding is, and there the ids hold the EOS."""
    eos = 50256

    def batch(lens):
        ids, mask = torch.full((len(lens), max(lens)), eos), torch.zeros(len(lens), max(lens), dtype=torch.long)
        for i, n in enumerate(lens):
            ids[i, : n - 1], mask[i, :n] = torch.arange(5, 4 + n), 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    plan = find_padding([batch([5, 9, 3]), batch([12, 4, 7])])
    assert {(p.name, p.value) for p in plan.pads} == {("input_ids", eos), ("attention_mask", 0), ("labels", -100)}


def test_batches_longer_than_every_sampled_length_are_left_alone_and_counted_across_workers():
    import multiprocessing

    from fastloop.speedups.pad_buckets.pad_buckets import PaddedCollate

    rows = [{"input_ids": torch.arange(1, n + 1), "label": 0} for n in [4, 9, 6, 3] * 4 + [20, 3, 30, 2]]
    plan = find_padding([pad_collate(rows[i : i + 2]) for i in range(0, 16, 2)], multiple=4)
    assert plan.top == 9
    longer = multiprocessing.get_context().Value("i", 0)
    loader = DataLoader(rows, batch_size=2, num_workers=2, collate_fn=PaddedCollate(pad_collate, plan, longer))
    lengths = [b["input_ids"].shape[1] for b in loader]
    assert set(lengths[:8]) <= set(plan.buckets()) == {4, 8, 9}
    assert lengths[8:] == [20, 30]  # left alone: never padded past a length seen
    assert longer.value == 2


@pytest.mark.filterwarnings("ignore")
def test_the_run_reports_how_many_batches_were_longer_than_the_sample():
    doc = run_configuration(
        "tests/targets.py:masked_text",
        "pad_buckets",
        steps=6,
        warmup=1,
        device="cpu",
        steady_warmup=False,
        target_kwargs={"batch_size": 4},
    )
    assert doc["speedups"][0]["status"] == "applied"
    assert isinstance(doc["extra"]["pad_buckets_longer_batches"], int)  # reported, from the collate's counter
    assert "counted: pad_buckets_longer_batches" in doc["speedups"][0]["detail"]
