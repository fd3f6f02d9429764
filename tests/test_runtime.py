import pytest
import torch

import posenc as pe


def test_running_mode_reads_environment(monkeypatch):
    monkeypatch.setenv("POSENC_SIZE", "small")
    assert pe.running_mode() == "small"
    monkeypatch.setenv("POSENC_SIZE", "FULL")
    assert pe.running_mode() == "full"
    monkeypatch.delenv("POSENC_SIZE")
    assert pe.running_mode() == "small"


@pytest.mark.parametrize("cuda", [True, False])
def test_running_mode_is_small_by_default_on_a_gpu_too(monkeypatch, cuda):
    """A Colab reader with a GPU gets the website's configuration unless asking for ``full``."""
    monkeypatch.delenv("POSENC_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    if cuda:
        assert pe.pick_device().type == "cuda"
    assert pe.running_mode() == "small"
    assert pe.training_preset() == pe.training_preset("small")
    monkeypatch.setenv("POSENC_SIZE", "full")
    assert pe.running_mode() == "full"
    assert pe.training_preset() == pe.training_preset("full")


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

SHIPPED = ["posenc/measured/attention-cpu.csv", "posenc/measured/attention-h200.csv"]
COLUMNS = {"scheme", "n", "forward_ratio", "forward_backward_ratio", "forward_mib", "machine", "dtype", "torch", "rounds",
           "forward_ratio_min", "forward_ratio_max", "forward_backward_ratio_min", "forward_backward_ratio_max"}


def test_measured_costs_are_package_data_read_from_any_folder(tmp_path, monkeypatch):
    """A chapter downloaded on its own finds the book's measurements wherever posenc is installed."""
    monkeypatch.chdir(tmp_path)
    runs = pe.measured_costs()
    assert list(runs) == SHIPPED == list(pe.measured_costs(own=False))
    for source, rows in runs.items():
        device = rows[0]["device"]
        assert device == ("cpu" if source.endswith("-cpu.csv") else "cuda") and all(r["device"] == device for r in rows)
        columns = COLUMNS if device == "cpu" else COLUMNS - {"forward_mib"}   # the GPU run measured no memory
        assert columns <= set(rows[0]) and {r["scheme"] for r in rows} >= {"causal SDPA", "RoPE", "ALiBi", "window 512"}
        assert all(r["forward_ratio"] == "1.0" for r in rows if r["scheme"] == "causal SDPA")
        lengths = {int(r["n"]) for r in rows}
        assert all(("causal SDPA", n) in {(r["scheme"], int(r["n"])) for r in rows} for n in lengths)  # a base per n
        for r in rows:  # the median of the rounds lies within their range
            for column in ("forward_ratio", "forward_backward_ratio"):
                assert float(r[column + "_min"]) <= float(r[column]) <= float(r[column + "_max"]), r
    (train,) = pe.measured_costs("train_throughput", own=False).values()
    # every scheme but CoPE, registered after the H200 run (benchmarks/train_throughput.py on a GPU would add it)
    assert {r["scheme"] for r in train} == set(pe.POSITION_SCHEMES) - {"cope"}
    assert all(r["relative_to_nope"] == "1.0" for r in train if r["scheme"] == "none")


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
    assert list(runs) == [str(own / "attention.csv"), *SHIPPED]
    assert runs[str(own / "attention.csv")] == [{"scheme": "causal SDPA", "n": "512", "forward_ratio": "1.0",
                                                  "machine": "my laptop"}]
    assert list(pe.measured_costs(own=False)) == SHIPPED
    assert list(pe.measured_costs("train_throughput")) == [str(own / "train_throughput.csv"),
                                                           "posenc/measured/train_throughput-h200.csv"]
    with pytest.raises(ValueError, match="peak_rss"):  # a benchmark that has neither own nor shipped files
        pe.measured_costs("peak_rss")


@pytest.mark.parametrize("kind", ["nope", "", "../attention", "attention-cpu", 3, None])
def test_measured_costs_reject_unknown_kinds(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="kind"):
        pe.measured_costs(kind)
