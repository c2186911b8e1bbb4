"""GPU tests: run on the device with `pytest -m gpu`. Each compares a speedup's loss trajectory
against eager fp32 on the same data and initial weights."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop.loop import FastLoop

pytestmark = pytest.mark.gpu


def _conv_setup(n: int = 256, bs: int = 32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    )
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    return model, DataLoader(ds, batch_size=bs)


def _losses(speedups: str, steps: int = 12) -> tuple[list[float], FastLoop]:
    model, loader = _conv_setup()
    model = model.cuda()
    loop = FastLoop(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-3),
        loader,
        loss_fn=torch.nn.functional.cross_entropy,
        speedups=speedups,
        device="cuda",
    )
    return loop.train(steps=steps).losses, loop


def _close(a, b, rtol):
    diff = max(abs(x - y) / max(abs(x), 1e-8) for x, y in zip(a, b))
    assert diff <= rtol, f"max relative loss difference {diff:.2e} > {rtol}"


@pytest.mark.parametrize(
    "speedups,rtol",
    [
        ("pin_memory", 0.0),
        ("prefetch", 0.0),
        ("pin_memory,prefetch", 0.0),
        ("gpu_resident", 0.0),  # math unchanged: exact
        ("tf32", 2e-2),
        ("bf16", 5e-2),
        ("fp16", 3e-2),
        ("channels_last", 1e-4),
        ("compile", 1e-4),
        ("cuda_graph", 1e-4),
        ("bf16,cuda_graph", 5e-2),
        ("fused_optimizer", 1e-4),
        ("cudnn_benchmark", 2e-2),
        ("bf16,channels_last,cudnn_benchmark", 5e-2),  # another conv algorithm: rounding
    ],
)
def test_equivalence_vs_eager_fp32(speedups, rtol):
    torch.backends.cudnn.deterministic = True
    base, _ = _losses("none")
    got, loop = _losses(speedups)
    assert all(r.status == "applied" for r in loop.records), loop.records
    _close(base, got, rtol)


def test_cuda_graph_falls_back_on_item():
    model, loader = _conv_setup()
    model = model.cuda()

    def step(m, batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(m(x), y)
        if loss.item() > 100:  # a host sync inside the step
            print("large loss")
        return loss

    loop = FastLoop(
        model, torch.optim.AdamW(model.parameters()), loader, step_fn=step, speedups="cuda_graph", device="cuda"
    )
    res = loop.train(steps=5)
    rec = res.records[0]
    # one tier down, as under Lightning (cuda_graph's policy): compile's graphs of forward and backward
    assert rec.status == "applied" and rec.detail.startswith("forward+backward graphed (whole step: "), rec
    assert "synchronizes with the host" in rec.detail and "prototype" not in rec.detail, rec
    base, _ = _losses("none", steps=5)
    _close(
        base, res.losses, 1e-4
    )  # the failed capture left the weights as they were (compiled fp32: 1e-4, as under Lightning)


def test_cuda_graph_short_last_batch():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2).cuda()
    ds = TensorDataset(torch.randn(70, 8), torch.randint(0, 2, (70,)))
    loop = FastLoop(
        model,
        torch.optim.AdamW(model.parameters()),
        DataLoader(ds, batch_size=32),
        loss_fn=torch.nn.functional.cross_entropy,
        speedups="cuda_graph",
        device="cuda",
    )
    res = loop.train(steps=9)  # 3 epochs of 32, 32, 6
    assert res.records[0].status == "applied"
    assert all(torch.isfinite(torch.tensor(res.losses)))


def test_fp16_overflow_steps_skipped_and_counted():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2).cuda()
    ds = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    sched_calls = []

    def step(m, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(m(x), y) * 6e4  # fp16 gradients overflow at scale 65536

    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (sched_calls.append(s), 1.0)[1])
    loop = FastLoop(
        model, opt, DataLoader(ds, batch_size=16), step_fn=step, speedups="fp16", device="cuda", scheduler=sched
    )
    res = loop.train(steps=20)
    skipped = res.extra["fp16_skipped_steps"]
    assert skipped >= 1
    assert len(sched_calls) - 1 == 20 - skipped  # LambdaLR calls once at construction


def test_h2d_prefetch_moves_nested_batches():
    from dataclasses import dataclass

    from fastloop.feed import BackgroundFeed

    @dataclass
    class B:
        x: torch.Tensor
        meta: dict

    batches = [B(torch.full((4,), float(i)).pin_memory(), {"y": (torch.tensor([i]),)}) for i in range(5)]  # y pageable
    feed = BackgroundFeed(batches, "cuda")
    out = list(feed)
    assert feed.mode == "background thread"
    assert [int(b.x[0].item()) for b in out] == list(range(5)) and [int(b.meta["y"][0]) for b in out] == list(range(5))
    assert all(b.x.is_cuda and b.meta["y"][0].is_cuda for b in out)


def test_lightning_runner_on_gpu_records_peak_memory_and_mfu():  # noqa: D103
    from fastloop.drivers.runner import run_configuration

    doc = run_configuration(
        "tests/targets.py:tiny_conv", "pin_memory,prefetch,bf16,channels_last", steps=10, warmup=3, device="cuda"
    )
    assert doc["peak_mem_bytes"] > 0
    assert all(s["status"] == "applied" for s in doc["speedups"]), doc["speedups"]
    assert doc["mfu"] is not None and 0 < doc["mfu"] < 1


def test_batch_size_search_real_oom_and_memory_restored():
    from fastloop._compat import LightningModule
    from fastloop.speedups.batch_size import search_batch_size

    class Wide(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 65536), torch.nn.GELU(), torch.nn.Linear(65536, 10))
            self.batch_size = 256

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(8 * 2**30 / total)  # an 8 GiB GPU
    try:
        m = Wide().cuda()
        ds = TensorDataset(torch.randn(40000, 64), torch.randint(0, 10, (40000,)))
        before = {k: v.cpu().clone() for k, v in m.state_dict().items()}  # host copies: not counted below
        m(torch.randn(4, 64, device="cuda")).sum().backward()  # cuBLAS allocates its one-time workspace here
        m.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        mem0 = torch.cuda.memory_allocated()
        doc = search_batch_size(m, DataLoader(ds, batch_size=256), device="cuda", max_size=32768)
        mem1 = torch.cuda.memory_allocated()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert any(not t["ok"] for t in doc["trials"]), "no trial ran out of memory"
    assert doc["restored"] and all(torch.equal(v, m.state_dict()[k].cpu()) for k, v in before.items())
    print("trials", [(t["batch_size"], t["ok"]) for t in doc["trials"]], "mem", mem0, mem1)
    assert abs(mem1 - mem0) <= 0.01 * mem0, (mem0, mem1)
    assert doc["batch_size"] <= 0.9 * doc["max_fitting"]


def test_cudnn_benchmark_restored_and_skipped_without_conv():
    from torch.utils.data import DataLoader, TensorDataset

    torch.backends.cudnn.benchmark = False
    _, loop = _losses("cudnn_benchmark", steps=3)
    assert loop.records[0].status == "applied" and torch.backends.cudnn.benchmark is False  # restored
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 4)).cuda()
    ds = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    loop = FastLoop(
        mlp,
        torch.optim.SGD(mlp.parameters(), lr=0.1),
        DataLoader(ds, batch_size=16),
        loss_fn=torch.nn.functional.cross_entropy,
        speedups="cudnn_benchmark",
        device="cuda",
    )
    assert loop.records[0].status == "skipped" and "no convolution" in loop.records[0].reason


def test_dali_gpu_pipeline_batches_on_the_device(tmp_path, monkeypatch):
    import warnings

    from fastloop.recipes.imagenet.data import DaliLoader, dali_available, scan_images
    from fastloop.recipes.imagenet.generate import generate

    if dali_available():
        pytest.skip(dali_available())
    root = generate(tmp_path / "img", classes=3, train=12, val=2, workers=4)
    files, labels, _ = scan_images(root / "train")
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")  # what the note reads (CUDA started long ago)
    with pytest.warns(UserWarning, match="CUDA_DEVICE_MAX_CONNECTIONS is '8'"):
        DaliLoader(files, labels, 8, device_id=0, crop=64)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        loader = DaliLoader(files, labels, 8, device_id=0, crop=64)
    x, y = next(iter(loader))
    assert x.is_cuda and y.is_cuda and x.shape == (8, 3, 64, 64) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and 0 <= int(y.min()) and int(y.max()) < 3
    x16, _ = next(
        iter(
            DaliLoader(
                files, labels, 8, device_id=0, crop=64, channels_last=True, dtype=torch.float16, hw_decoder_load=0.99
            )
        )
    )
    assert x16.shape == (8, 3, 64, 64) and x16.dtype == torch.float16
    assert x16.is_contiguous(memory_format=torch.channels_last)
    assert -3 < float(x16.float().mean()) < 3


def test_lightning_gpu_resident_same_losses_and_no_data_wait():
    from fastloop.drivers.runner import run_configuration

    base = run_configuration(
        "tests/targets.py:tiny_mlp", "none", steps=20, warmup=2, device="cuda", steady_warmup=False
    )
    res = run_configuration(
        "tests/targets.py:tiny_mlp", "gpu_resident", steps=20, warmup=2, device="cuda", steady_warmup=False
    )
    assert [(r["name"], r["status"], r["reason"]) for r in res["speedups"]] == [("gpu_resident", "applied", "")]
    assert res["losses"] == base["losses"]  # the same batches in the same order, math unchanged
    assert res["extra"]["gpu_resident_bytes"] > 0


@pytest.mark.parametrize("spec", ["cuda_graph", "bf16,cuda_graph", "compile:reduce-overhead"])
def test_lightning_demo_transformer_with_cuda_graphs_ends_cleanly(spec):
    """Lightning's own demo Transformer caches a tensor made in forward: each graph speedup is
    applied, or falls back with its cause, and the run completes."""
    from fastloop.drivers.runner import run_configuration

    doc = run_configuration("benchmarks/targets/lightning_demo.py:make", spec, steps=10, warmup=3, device="cuda")
    assert doc["steps"] == 10
    rec = {r["name"]: r for r in doc["speedups"]}
    graph = rec.get("cuda_graph") or rec["compile"]
    assert graph["status"] in ("applied", "fallback"), graph
    if graph["status"] == "fallback":  # cuda_graph is dropped; compile keeps its kernels without the graphs
        if spec.startswith("compile"):
            assert graph["reason"].endswith("the run was repeated as compile"), graph  # compile's default mode
        else:  # the runner repeated the run without it, or the whole-step graph stayed eager in the run
            assert "repeated without it" in graph["reason"] or "whole step not captured" in graph["reason"], graph


def _gpt_tiny_batches(n: int = 4):
    from fastloop.recipes.gpt.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny")).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    toks = torch.randint(0, model.cfg.vocab_size, (n, 8, model.cfg.block_size + 1), device="cuda", generator=g)
    return model, [(t[:, :-1], t[:, 1:]) for t in toks]


def test_fused_loss_equals_the_reference_cross_entropy():
    pytest.importorskip("liger_kernel")
    from fastloop.speedups.fused_loss import fused_linear_cross_entropy

    model, batches = _gpt_tiny_batches(1)
    x, y = batches[0]
    _, ref = model(x, y)
    ref.backward()
    ref_grad = model.lm_head.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    model.fused_loss = fused_linear_cross_entropy()
    logits, fused = model(x, y)
    fused.backward()
    assert logits is None
    assert abs(fused.item() - ref.item()) <= 1e-4 * abs(ref.item()), (fused.item(), ref.item())
    assert torch.allclose(model.lm_head.weight.grad, ref_grad, rtol=1e-3, atol=1e-5)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # under bf16 autocast: within bf16 rounding
        _, fused_bf16 = model(x, y)
    assert abs(fused_bf16.item() - ref.item()) <= 2e-2 * abs(ref.item())


def test_fp8_applies_on_hopper_and_tracks_bf16():
    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89+")
    from fastloop.drivers.runner import run_configuration

    common = dict(
        steps=30, warmup=2, device="cuda", steady_warmup=False, target_kwargs={"preset": "small", "batch_size": 8}
    )
    bf16 = run_configuration("gpt", "bf16,compile", **common)
    fp8 = run_configuration("gpt", "bf16,fp8,compile", **common)
    rec = {r["name"]: r for r in fp8["speedups"]}["fp8"]
    assert rec["status"] == "applied" and "Linear layers in fp8" in rec["detail"], rec
    diff = max(abs(a - b) / abs(b) for a, b in zip(fp8["losses"], bf16["losses"]))
    assert diff < 0.05, f"fp8 loss differs from bf16 by {diff:.3f} (> 5%)"


def test_gpu_profile_splits_the_step_and_counts_host_syncs():
    from fastloop.drivers.doctor import diagnose
    from fastloop.drivers.runner import run_configuration

    plain = run_configuration("tests/targets.py:tiny_mlp", "none", steps=20, warmup=5, device="cuda")
    prof = plain["gpu_profile"]
    assert prof and "error" not in prof, prof
    assert prof["profiled_steps"] == 3 and 0 < prof["gpu_busy_frac"] <= 1
    assert len(plain["losses"]) == plain["steps"] + plain["warmup_steps"]  # profiled steps left out
    # the host's clock too: its share of the step getting batches (a host-bound tiny MLP: > 0)
    assert 0 < plain["host_wait_frac"] < 1 and 0 <= plain["data_wait_frac"] < 1, plain["host_wait_frac"]
    synced = run_configuration("tests/targets.py:item_every_step", "none", steps=20, warmup=5, device="cuda")
    sp = synced["gpu_profile"]
    assert sp["host_syncs_per_step"] >= 1, sp  # loss.item() every step
    # a tiny MLP keeps the H200 busy for a sliver of each Lightning step: host-bound, syncs named
    d = diagnose(synced)
    assert d["bottleneck"] == "host-bound" and "waits for the GPU" in d["evidence"], d
    # and where: the .item() line of the user's training_step (CUDA's sync debug mode), read from
    # the source (a fixed line number goes stale when targets.py grows)
    import inspect

    from tests import targets

    lines, first = inspect.getsourcelines(targets.ItemEveryStep.training_step)
    site = f"targets.py:{first + next(i for i, ln in enumerate(lines) if '.item()' in ln)} in training_step"
    assert any(x["site"].startswith(site) and x["per_step"] >= 1 for x in sp["sync_sites"]), (site, sp["sync_sites"])
    assert f"synchronizes at {site}" in d["evidence"], d
