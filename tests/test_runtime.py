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


# --- the measurements shipped with the library --------------------------------------------------------------

COLUMNS = {"scheme", "n", "forward_ratio", "forward_backward_ratio", "forward_mib", "machine", "dtype", "torch", "rounds",
           "forward_ratio_min", "forward_ratio_max", "forward_backward_ratio_min", "forward_backward_ratio_max"}


def test_measured_costs_are_package_data_read_from_any_folder(tmp_path, monkeypatch):
    """A chapter downloaded on its own finds the book's measurements wherever posenc is installed."""
    monkeypatch.chdir(tmp_path)
    runs = pe.measured_costs()
    assert list(runs) == ["posenc/measured/attention-cpu.csv"] == list(pe.measured_costs(own=False))
    rows = runs["posenc/measured/attention-cpu.csv"]
    assert COLUMNS <= set(rows[0]) and {r["scheme"] for r in rows} >= {"causal SDPA", "RoPE", "ALiBi", "window 512"}
    assert all(r["forward_ratio"] == "1.0" for r in rows if r["scheme"] == "causal SDPA")
    for r in rows:  # the median of the rounds lies within their range
        for column in ("forward_ratio", "forward_backward_ratio"):
            assert float(r[column + "_min"]) <= float(r[column]) <= float(r[column + "_max"]), r


def test_measured_costs_put_a_readers_own_first(tmp_path, monkeypatch):
    """CSV files in benchmarks/measured/ of the working folder, or of the nearest folder above with one, come first."""
    own = tmp_path / "benchmarks" / "measured"
    own.mkdir(parents=True)
    (own / "attention.csv").write_text("scheme,n,forward_ratio,machine\ncausal SDPA,512,1.0,my laptop\n")
    (own / "attention-empty.csv").write_text("scheme,n,forward_ratio,machine\n")   # no rows: left out
    (own / "train_throughput.csv").write_text("scheme,n\nRoPE,64\n")                 # another benchmark
    (own / "attentionx.csv").write_text("scheme,n\nRoPE,64\n")                       # not <kind>.csv or <kind>-*.csv
    (tmp_path / "chapters").mkdir()
    monkeypatch.chdir(tmp_path / "chapters")
    runs = pe.measured_costs("attention")
    assert list(runs) == [str(own / "attention.csv"), "posenc/measured/attention-cpu.csv"]
    assert runs[str(own / "attention.csv")] == [{"scheme": "causal SDPA", "n": "512", "forward_ratio": "1.0",
                                                  "machine": "my laptop"}]
    assert list(pe.measured_costs(own=False)) == ["posenc/measured/attention-cpu.csv"]
    assert list(pe.measured_costs("train_throughput")) == [str(own / "train_throughput.csv")]
    with pytest.raises(ValueError, match="train_throughput"):
        pe.measured_costs("train_throughput", own=False)


@pytest.mark.parametrize("kind", ["nope", "", "../attention", "attention-cpu", 3, None])
def test_measured_costs_reject_unknown_kinds(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="kind"):
        pe.measured_costs(kind)
