import numpy as np
import pytest
import torch

from fastloop import FastloopError
from fastloop._compat import Trainer
from fastloop.recipes.gpt.data import (
    TokenData,
    TokenWindows,
    default_corpus,
    open_tokens,
)
from fastloop.recipes.gpt.model import GPT, GPTConfig
from fastloop.recipes.gpt.module import GPTModule


def _trainer(steps, **kw):
    kw.setdefault("enable_checkpointing", False)
    return Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        gradient_clip_val=1.0,
        **kw,
    )


class Losses(__import__("fastloop._compat", fromlist=["Callback"]).Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.values.append(float(outputs["loss"]))


def test_gpt2_124m_shape_and_flops():
    cfg = GPTConfig.preset("gpt2")
    with torch.device("meta"):
        model = GPT(cfg)
    assert round(model.num_params() / 1e6, 1) == 123.6  # non-embedding convention as nanoGPT (tied wte counted)
    assert model.lm_head.weight is model.wte.weight
    assert model.flops_per_token() == 6 * model.num_params() + 12 * 12 * 768 * 1024


def test_default_corpus_is_real_text_and_cached():
    d = default_corpus()
    data = open_tokens(d / "train.bin", 256)
    assert len(data) > 1_000_000
    text = bytes(np.asarray(data[:2000], dtype=np.uint8)).decode("utf-8", "ignore")
    assert "def " in text or "import " in text


def test_tiny_loss_falls_within_a_few_hundred_steps():
    torch.manual_seed(0)
    module = GPTModule(preset="tiny", lr=3e-3, warmup_steps=20, max_steps=250)
    losses = Losses()
    _trainer(250, callbacks=[losses]).fit(module, datamodule=TokenData(block_size=64, batch_size=16))
    first, last = np.mean(losses.values[:10]), np.mean(losses.values[-10:])
    assert first > 5.0  # ~ln(256) = 5.5 at random init
    assert last < 0.6 * first, (first, last)


def test_checkpoint_resume_reproduces_next_losses(tmp_path):
    def make():
        torch.manual_seed(0)
        return GPTModule(preset="tiny", max_steps=40, warmup_steps=5), TokenData(block_size=32, batch_size=8)

    m, d = make()
    full = Losses()
    _trainer(20, callbacks=[full]).fit(m, datamodule=d)
    m, d = make()
    first = Losses()
    t = _trainer(10, callbacks=[first], default_root_dir=tmp_path, enable_checkpointing=False)
    t.fit(m, datamodule=d)
    t.save_checkpoint(tmp_path / "mid.ckpt")
    m, d = make()
    second = Losses()
    _trainer(20, callbacks=[second]).fit(m, datamodule=d, ckpt_path=str(tmp_path / "mid.ckpt"))
    assert first.values == full.values[:10]
    np.testing.assert_allclose(second.values, full.values[10:], rtol=1e-6)


def test_bad_token_files(tmp_path):
    with pytest.raises(FastloopError, match="token file not found"):
        open_tokens(tmp_path / "missing.bin", 256)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(FastloopError, match="not a whole number of uint16 tokens"):
        open_tokens(tmp_path / "odd.bin", 256)
    np.array([1, 2, 300], dtype=np.uint16).tofile(tmp_path / "big.bin")
    with pytest.raises(FastloopError, match="token id 300, outside the vocabulary"):
        open_tokens(tmp_path / "big.bin", 256)
    with pytest.raises(FastloopError, match="context length 64 is longer than the data"):
        TokenWindows(np.zeros(50, dtype=np.uint16), 64, 10)


def test_real_token_folder(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("train.bin", "val.bin"):
        rng.integers(0, 1000, 10_000).astype(np.uint16).tofile(tmp_path / name)
    d = TokenData(str(tmp_path), block_size=32, batch_size=4, vocab_size=1024)
    x, y = next(iter(d.train_dataloader()))
    assert x.shape == (4, 32) and x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])


def test_gpt_target_through_fastloop_run(tmp_path):
    from fastloop.cli import main

    out = tmp_path / "g.json"
    assert main(["run", "gpt", "--steps", "5", "--warmup", "1", "--device", "cpu", "--json", str(out), "--quiet"]) == 0
    doc = __import__("json").loads(out.read_text())
    assert doc["throughput"]["unit"] == "tokens/s" and doc["items_per_step"] == 16 * 64
    assert doc["mfu_detail"]["convention"].startswith("6N + 12*L*d*T")


def test_gpt_initialisation_sets_every_parameter_and_is_seeded():
    """The Linear/Embedding layers skip torch's default init (GPT._init draws their weights):
    every parameter must still be set, with GPT-2's statistics, and the same seed the same weights."""
    cfg = GPTConfig.preset("small", bias=True)
    torch.manual_seed(0)
    a = GPT(cfg)
    torch.manual_seed(0)
    b = GPT(cfg)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.isfinite(p).all(), name
        assert torch.equal(p, q), name
    resid = 0.02 / (2 * cfg.n_layer) ** 0.5
    for name, m in a.named_modules():
        if isinstance(m, torch.nn.Linear):
            want = resid if getattr(m, "residual_scale", False) else 0.02
            assert abs(m.weight.std().item() - want) < 0.1 * want, name
            if m.bias is not None:
                assert torch.count_nonzero(m.bias) == 0, name
        elif isinstance(m, torch.nn.Embedding):
            assert abs(m.weight.std().item() - 0.02) < 0.002, name
        elif isinstance(m, torch.nn.LayerNorm):
            assert torch.equal(m.weight, torch.ones_like(m.weight)), name
    assert a.wte.weight is a.lm_head.weight


def test_the_target_creates_its_weights_on_init_device():
    """``make(init_device=...)``: every parameter is created there (the skip-init layers too, which
    ignore torch's default-device context unless told), and the default without CUDA is the CPU."""
    from fastloop.recipes.gpt.target import make

    module, _ = make(preset="tiny", init_device="meta")
    assert {p.device.type for p in module.parameters()} == {"meta"}
    module, _ = make(preset="tiny")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert {p.device.type for p in module.parameters()} == {want}
    assert module.model.wte.weight is module.model.lm_head.weight
