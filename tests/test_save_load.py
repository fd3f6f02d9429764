"""A trained model saved to a file and rebuilt, in this process or another: same config, same logits."""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import posenc as pe

STUDENT_MODULE = '''
import torch
import posenc as pe


class MLPBias(pe.PositionScheme):
    """FIRE-like: a bias per head from an MLP of log(1 + d)."""

    def __init__(self, n_heads, hidden=8):
        super().__init__()
        self.hidden = hidden
        self.mlp = torch.nn.Sequential(torch.nn.Linear(1, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, n_heads))

    def distance_bias(self, length, *, device, dtype):
        d = torch.log1p(torch.arange(length, device=device, dtype=dtype))[:, None]
        return self.mlp(d).T


class Slope(pe.PositionScheme):
    """A learned ALiBi-like slope per head, starting at ``start``."""

    def __init__(self, start, *, heads=2):
        super().__init__()
        self.start = start
        self.slope = torch.nn.Parameter(torch.full((heads,), float(start)))

    def distance_bias(self, length, *, device, dtype):
        return -self.slope[:, None] * torch.arange(length, device=device, dtype=dtype)
'''

KINDS = ["alibi", "rope", "learned", "student", "layers"]

SAVE = '''
import sys, torch, posenc as pe
import student_schemes
folder = sys.argv[1]
for kind in sys.argv[2:]:
    torch.manual_seed(0)
    if kind == "student":
        model = pe.TinyLM(16, 16, 2, 2, position=student_schemes.MLPBias(2, hidden=5))
    elif kind == "layers":
        model = pe.TinyLM(16, 16, 2, 2, position=[student_schemes.Slope(0.25), "rope"])
    else:
        model = pe.TinyLM(16, 16, 2, 2, position=kind, **({"max_len": 16} if kind == "learned" else {}))
    with torch.no_grad():  # trained: weights away from their initial values
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    model.eval()
    pe.save_model(model, f"{folder}/{kind}.pt")
    torch.save(model(torch.arange(12).remainder(16)[None]), f"{folder}/{kind}.logits")
'''

LOAD = '''
import sys, torch, posenc as pe
folder = sys.argv[1]
for kind in sys.argv[2:]:
    saved = torch.load(f"{folder}/{kind}.pt", weights_only=True)  # plain values and tensors only
    model = pe.load_model(f"{folder}/{kind}.pt")
    assert model.config == saved["config"], (kind, model.config, saved["config"])
    logits = model(torch.arange(12).remainder(16)[None])
    assert torch.equal(logits, torch.load(f"{folder}/{kind}.logits", weights_only=True)), f"{kind}: other logits"
    print(kind, "same logits")
'''


def _python(tmp_path, script, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "script.py").write_text(script)
    return subprocess.run([sys.executable, str(tmp_path / "script.py"), *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


@pytest.fixture
def student(tmp_path, monkeypatch):
    (tmp_path / "student_schemes.py").write_text(STUDENT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("student_schemes", None)


def test_a_model_saved_in_one_process_gives_the_same_logits_in_another(tmp_path, student):
    """Built-in schemes, a student's scheme class from a module, and one per layer (a student's and RoPE)."""
    folder = tmp_path / "models"
    folder.mkdir()
    saved = _python(tmp_path, SAVE, str(folder), *KINDS)
    assert saved.returncode == 0, saved.stderr
    loaded = _python(tmp_path, LOAD, str(folder), *KINDS)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split("\n")[:-1] == [f"{kind} same logits" for kind in KINDS]


def test_the_config_rebuilds_the_model():
    for kw in (dict(position="alibi"), dict(position="learned", max_len=16), dict(position="rope", base=500.0),
               dict(position=["rope", "none"]), dict(position="none", attention=["linear", "diag"], feature="relu",
                                                      diag_block=4)):
        model = pe.TinyLM(16, 16, 2, 2, **kw)
        assert pe.TinyLM(**model.config).config == model.config
        assert pe.TinyLM.from_config(model.config).config == model.config


def test_a_students_scheme_config_rebuilds_it(student):
    import student_schemes

    model = pe.TinyLM(16, 16, 2, 2, position=student_schemes.MLPBias(2, hidden=5))
    again = pe.TinyLM(**model.config)
    assert type(again.position) is student_schemes.MLPBias and again.position.hidden == 5
    assert again.config == model.config


def test_shared_and_separate_layer_schemes_keep_their_weights(tmp_path):
    a, b = pe.position_scheme("t5"), pe.position_scheme("t5")
    for position in (["t5", "t5"], [a, b]):
        model = pe.TinyLM(16, 16, 2, 2, position=position)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape))
        pe.save_model(model, tmp_path / "model.pt")
        again = pe.load_model(tmp_path / "model.pt")
        idx = torch.arange(10)[None]
        assert torch.equal(again(idx), model(idx))


def test_settings_dtype_and_mode_come_back(tmp_path):
    model = pe.TinyLM(16, 16, 2, 2, position="rope", train_len=8).to(torch.bfloat16)
    model.window, model.rope_scaling = 4, ("yarn", 2)
    model.eval()
    pe.save_model(model, tmp_path / "model.pt")
    again = pe.load_model(tmp_path / "model.pt")
    assert (again.window, again.train_len, again.training) == (4, 8, False)
    assert again.rope_scaling == model.rope_scaling and again.tok.weight.dtype == torch.bfloat16
    idx = torch.arange(12)[None]
    assert torch.equal(again(idx), model(idx))


def test_an_interrupted_save_leaves_the_earlier_file(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    pe.save_model(pe.TinyLM(16, 16, 1, 2, position="alibi"), path)
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", fail)
    with pytest.raises(KeyboardInterrupt):
        pe.save_model(pe.TinyLM(16, 16, 1, 2, position="rope"), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_a_class_from_main_of_another_process_is_named_with_what_to_do(tmp_path):
    script = textwrap.dedent('''
        import sys, torch, posenc as pe
        class Decay(pe.PositionScheme):
            def distance_bias(self, length, *, device, dtype):
                return -torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)
        pe.save_model(pe.TinyLM(16, 16, 1, 2, position=Decay()), sys.argv[1])
    ''')
    saved = _python(tmp_path, script, str(tmp_path / "model.pt"))
    assert saved.returncode == 0, saved.stderr
    assert "load_model(path, classes=[Decay])" in saved.stderr  # warned when saving
    with pytest.raises(ValueError, match=r"'__main__\.Decay'.*__main__.*classes=\[Decay\]"):
        pe.load_model(tmp_path / "model.pt")

    class Decay(pe.PositionScheme):
        def distance_bias(self, length, *, device, dtype):
            return -torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the source hash differs: a class of that name, defined here
        model = pe.load_model(tmp_path / "model.pt", classes=[Decay])
    assert type(model.position) is Decay


def test_a_missing_module_and_an_unknown_class_are_clear_errors(tmp_path, student):
    import student_schemes

    model = pe.TinyLM(16, 16, 1, 2, position=student_schemes.MLPBias(2))
    config = model.config
    with pytest.raises(ValueError, match="no module on sys.path defines it"):
        pe.TinyLM(**dict(config, position=dict(config["position"], scheme="not_a_module_anywhere.MLPBias")))
    with pytest.raises(ValueError, match="no module on sys.path defines it"):
        pe.TinyLM(**dict(config, position=dict(config["position"], scheme="student_schemes.NoSuchClass")))


def test_a_scheme_whose_argument_is_not_kept_is_refused_when_saving(tmp_path, student):
    class Forgetful(pe.PositionScheme):
        def __init__(self, start):
            super().__init__()
            self.slope = torch.nn.Parameter(torch.full((2,), start))

        def distance_bias(self, length, *, device, dtype):
            return -self.slope[:, None] * torch.arange(length, device=device, dtype=dtype)

    with pytest.raises(ValueError, match=r"takes \['start'\].*self\.start = start"):
        pe.save_model(pe.TinyLM(16, 16, 1, 2, position=Forgetful(0.5)), tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()


def test_bad_files_and_arguments_are_clear_errors(tmp_path):
    torch.save({"tok.weight": torch.zeros(2)}, tmp_path / "state.pt")
    with pytest.raises(ValueError, match="not a model written by posenc.save_model"):
        pe.load_model(tmp_path / "state.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a model written by posenc.save_model"):
        pe.load_model(tmp_path / "garbage.pt")
    with pytest.raises(FileNotFoundError):
        pe.load_model(tmp_path / "absent.pt")
    pe.save_model(pe.TinyLM(16, 16, 1, 2), tmp_path / "model.pt")
    for device in (["cuda"] if not torch.cuda.is_available() else []) + ["gpu", 0]:  # not "the file is damaged"
        with pytest.raises(ValueError, match="this machine has 'cpu'"):
            pe.load_model(tmp_path / "model.pt", device=device)
    with pytest.raises(ValueError, match="is a folder"):
        pe.save_model(pe.TinyLM(16, 16, 1, 2), tmp_path)
    with pytest.raises(ValueError, match="must be a posenc TinyLM"):
        pe.save_model(torch.nn.Linear(2, 2), tmp_path / "model.pt")
    with pytest.raises(ValueError, match="for a scheme given by name"):
        pe.TinyLM(16, 16, 1, 2, position={"scheme": "rope"}, base=10.0)
