import pytest
import torch

import posenc as pe


def test_running_mode_reads_environment(monkeypatch):
    monkeypatch.setenv("POSENC_SIZE", "small")
    assert pe.running_mode() == "small"
    monkeypatch.setenv("POSENC_SIZE", "FULL")
    assert pe.running_mode() == "full"
    monkeypatch.delenv("POSENC_SIZE")
    assert pe.running_mode() == ("full" if torch.cuda.is_available() else "small")


def test_running_mode_rejects_unknown(monkeypatch):
    monkeypatch.setenv("POSENC_SIZE", "huge")
    with pytest.raises(ValueError, match="POSENC_SIZE"):
        pe.running_mode()


def test_pick_device_is_usable():
    device = pe.pick_device()
    assert torch.zeros(1, device=device).device.type == device.type


def test_seed_everything_is_deterministic():
    pe.seed_everything(3)
    a = torch.randn(4)
    g = pe.seed_everything(3)
    assert torch.equal(a, torch.randn(4))
    assert torch.equal(torch.randn(4, generator=g), torch.randn(4, generator=torch.Generator().manual_seed(3)))
