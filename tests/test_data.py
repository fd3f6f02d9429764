"""Tests for posenc.data: synthetic tasks and character corpora."""

import hashlib
import http.server
import math
import platform
import threading
import time
import urllib.error

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe
from posenc import data as D
from posenc import corpora as C


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- Markov chain


def test_markov_same_seed_same_batches_and_different_seeds_differ():
    chain = D.MarkovChain(vocab_size=8, order=2, seed=0)
    a = chain.batch(4, 32, gen(1))
    b = chain.batch(4, 32, gen(1))
    c = chain.batch(4, 32, gen(2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    other = D.MarkovChain(vocab_size=8, order=2, seed=1)
    assert not torch.equal(chain.transitions, other.transitions)
    assert torch.equal(chain.transitions, D.MarkovChain(vocab_size=8, order=2, seed=0).transitions)


def test_markov_batch_layout():
    chain = D.MarkovChain(vocab_size=5, order=3, seed=0)
    x, y = chain.batch(3, 20, gen(0))
    assert x.shape == y.shape == (3, 20) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert int(x.min()) >= 0 and int(x.max()) < 5
    assert torch.allclose(chain.transitions.sum(-1), torch.ones(5 ** 3, dtype=torch.float64))


def test_markov_samples_are_prefixes_of_longer_samples():
    chain = D.MarkovChain(vocab_size=8, order=2, seed=0)
    short = chain.sample(4, 30, gen(5))
    long = chain.sample(4, 90, gen(5))
    assert torch.equal(short, long[:, :30])


def test_markov_follows_its_transitions():
    """Mean log-loss of a long sample under the true table -> entropy rate (ergodic theorem)."""
    chain = D.MarkovChain(vocab_size=6, order=2, alpha=0.3, seed=0)
    seq = chain.sample(64, 400, gen(0))  # 25,600 transitions
    ctx = seq[:, :-2] * 6 + seq[:, 1:-1]
    logp = chain.transitions[ctx, seq[:, 2:]].log()
    assert abs(-logp[:, 20:].mean().item() - chain.entropy_rate()) < 0.03



def _markov_step_by_step(chain, batch_size, length, generator):
    """Inverse-CDF sampling with torch.searchsorted, one position at a time (the same random draws)."""
    v, k = chain.vocab_size, chain.order
    out = torch.empty(batch_size, length + k, dtype=torch.int64)
    out[:, :k] = torch.randint(v, (batch_size, k), generator=generator)
    u = torch.rand(length, batch_size, 1, generator=generator)
    cdf = chain.transitions.cumsum(-1).float()
    cdf[:, -1] = 1.0 + 1e-6
    for t in range(k, length + k):
        ctx = sum(out[:, t - k + j] * v ** (k - 1 - j) for j in range(k))
        out[:, t] = torch.searchsorted(cdf[ctx], u[t - k], right=True)[:, 0].clamp(max=v - 1)
    return out[:, k:]


@settings(max_examples=40, deadline=None)
@given(vocab_size=st.integers(2, 9), order=st.integers(1, 3), alpha=st.sampled_from([0.05, 0.1, 1.0]),
       batch_size=st.integers(1, 4), length=st.integers(1, 30), seed=st.integers(0, 2 ** 16))
def test_markov_sample_equals_searchsorted_step_by_step(vocab_size, order, alpha, batch_size, length, seed):
    chain = D.MarkovChain(vocab_size=vocab_size, order=order, alpha=alpha, seed=seed % 7)
    fast = chain.sample(batch_size, length, gen(seed))
    assert torch.equal(fast, _markov_step_by_step(chain, batch_size, length, gen(seed)))


def test_markov_entropy_rate_limits():
    # nearly uniform transitions: entropy rate close to log V
    assert abs(D.MarkovChain(vocab_size=8, order=1, alpha=1e4, seed=0).entropy_rate() - math.log(8)) < 1e-3
    sharp = D.MarkovChain(vocab_size=8, order=2, alpha=0.1, seed=0).entropy_rate()
    assert 0 < sharp < math.log(8)


@pytest.mark.parametrize("kwargs", [dict(vocab_size=1), dict(order=0), dict(alpha=0), dict(alpha=-1.0),
                                    dict(seed=-1), dict(vocab_size=64, order=4)])
def test_markov_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        D.MarkovChain(**kwargs)


# --------------------------------------------------------------------------- retrieval


@pytest.mark.parametrize("distinct", [True, False])
def test_retrieval_layout(distinct):
    task = D.FirstTokenRetrieval(n_keys=4, n_filler=10, mark_prob=0.2, distinct_keys=distinct)
    x, y = task.batch(16, 50, gen(0))
    assert x.shape == y.shape == (16, 50)
    assert task.vocab_size == (10 + 4 + 1 if distinct else 10 + 1)
    keys = x[:, 0]
    assert bool(((keys >= task.key_offset) & (keys < task.key_offset + 4)).all())
    marks = x == task.marker
    assert marks[:, -1].all() and not marks[:, 0].any()
    assert torch.equal(y[marks], keys[:, None].expand(-1, 50)[marks])  # target at a marker = key
    assert bool((y[~marks] == D.IGNORE_INDEX).all())
    if distinct:  # the key never appears again
        assert not bool((x[:, 1:] == keys[:, None]).any())
    assert int(x.max()) < task.vocab_size


def test_retrieval_is_deterministic_and_min_distance():
    task = D.FirstTokenRetrieval(mark_prob=0.5, min_distance=8)
    a, b = task.batch(4, 40, gen(3)), task.batch(4, 40, gen(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], task.batch(4, 40, gen(4))[0])
    assert not bool((a[0][:, :8] == task.marker).any())
    assert bool((task.batch(4, 9, gen(3))[0][:, 8] == task.marker).all())   # the last position, 8, is far enough


@pytest.mark.parametrize("mark_last", [True, False])
def test_retrieval_refuses_sequences_shorter_than_min_distance(mark_last):
    # a marker at the last position would sit nearer than min_distance (or there would be none at all)
    task = D.FirstTokenRetrieval(mark_prob=0.5, min_distance=8, mark_last=mark_last)
    with pytest.raises(ValueError, match="min_distance"):
        task.batch(2, 8, gen(0))


@pytest.mark.parametrize("kwargs", [dict(n_keys=1), dict(mark_prob=1.5), dict(mark_prob=0.0, mark_last=False),
                                    dict(n_keys=20, n_filler=4, distinct_keys=False), dict(distinct_keys=1)])
def test_retrieval_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        D.FirstTokenRetrieval(**kwargs)


def test_batch_bad_arguments():
    task = D.FirstTokenRetrieval()
    with pytest.raises(ValueError):
        task.batch(0, 10)
    with pytest.raises(ValueError):
        task.batch(2, 1)  # needs a key and a marker
    with pytest.raises(ValueError):
        task.batch(2, 10, split="test")
    with pytest.raises(ValueError):
        D.MarkovChain().batch(2, 10, generator=0)


# --------------------------------------------------------------------------- character corpora


@pytest.fixture(scope="module")
def docs():
    return C.python_docs()


def test_python_docs_corpus(docs):
    assert docs.vocab_size == len(C.CHARS) == 96
    train, val = docs.splits["train"], docs.splits["validation"]
    assert len(train) > 100_000 and len(val) > 10_000
    assert abs(len(val) / (len(train) + len(val)) - 0.1) < 1e-3
    assert docs.config == C.python_docs().config  # deterministic
    release = platform.python_version()            # patch releases ship other text: the name tells them apart
    assert docs.name == f"python-{release}-docs" or not release.replace(".", "").isdigit()
    assert "assert" in docs.text


def test_char_batches(docs):
    x, y = docs.batch(4, 64, gen(0), split="validation")
    assert x.shape == y.shape == (4, 64)
    assert torch.equal(x[:, 1:], y[:, :-1])
    val_text = docs.decode(docs.splits["validation"])
    for row in x:  # every window lies inside the validation split
        assert docs.decode(row) in val_text
    a = docs.batch(4, 64, gen(0))
    assert torch.equal(a[0], docs.batch(4, 64, gen(0))[0])
    assert not torch.equal(a[0], docs.batch(4, 64, gen(1))[0])


def test_encode_decode_roundtrip(docs):
    text = 'def f(x):\n    return "ok" + str(x)  # 100%'
    assert docs.decode(docs.encode(text)) == text
    assert docs.decode(docs.encode("\u201ccaf\u00e9\u201d \u2014 done")) == '"cafe" - done'


def test_char_corpus_bad_arguments():
    with pytest.raises(ValueError):
        C.CharCorpus("short")
    with pytest.raises(ValueError):
        C.CharCorpus("x" * 1000, val_fraction=1.0)
    small = C.CharCorpus("abc " * 100)
    with pytest.raises(ValueError):
        small.batch(2, 100, split="validation")  # the split is too short


# --------------------------------------------------------------------------- downloads


BODY = b"First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40
BODY_SHA = hashlib.sha256(BODY).hexdigest()


@pytest.fixture
def server():
    """A loopback HTTP server (127.0.0.1 only): ``routes[path](handler)`` answers, ``hits`` counts requests."""
    routes, hits = {}, []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            hits.append(self.path)
            try:
                routes[self.path](self)
            except OSError:  # the client gave up (deadline, test over): nothing to do
                pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", routes, hits
    srv.shutdown()
    srv.server_close()


def reply(body=BODY, status=200, length=None, pause=0.0, ctype="text/plain"):
    """A route sending ``body`` with ``Content-Length: length`` (default: the true length)."""
    def route(handler):
        handler.send_response(status)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(body) if length is None else length))
        handler.end_headers()
        handler.wfile.write(body[: len(body) // 2])
        handler.wfile.flush()
        time.sleep(pause)
        handler.wfile.write(body[len(body) // 2:])
    return route


def test_download_offline_fails_clearly(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(C.urllib.request, "urlopen", offline)
    with pytest.raises(RuntimeError, match=r"internet(.|\n)*pe\.python_docs\(\)"):
        C.tiny_shakespeare(root=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_download_correct_file_is_cached_and_not_fetched_again(tmp_path, server):
    base, routes, hits = server
    routes["/ok.txt"] = reply()
    path = C._fetch(base + "/ok.txt", "ok.txt", BODY_SHA.upper(), tmp_path, timeout=5)
    assert path == tmp_path / "ok.txt" and path.read_bytes() == BODY
    assert C._fetch(base + "/ok.txt", "ok.txt", BODY_SHA, tmp_path, timeout=5) == path
    assert hits == ["/ok.txt"]  # the second call used the cache
    assert [p.name for p in tmp_path.iterdir()] == ["ok.txt"]


def test_download_truncated_or_failed_response_leaves_nothing(tmp_path, server):
    base, routes, hits = server
    routes["/short.txt"] = reply(length=len(BODY) + 1000)  # the connection closes early
    with pytest.raises(RuntimeError, match=f"ended after {len(BODY)} of its {len(BODY) + 1000} bytes"):
        C._fetch(base + "/short.txt", "short.txt", BODY_SHA, tmp_path, timeout=5)
    assert not list(tmp_path.iterdir())
    routes["/missing.txt"] = reply(b"not found", status=404)
    with pytest.raises(RuntimeError, match="404"):
        C._fetch(base + "/missing.txt", "missing.txt", BODY_SHA, tmp_path, timeout=5)
    assert not list(tmp_path.iterdir())


def test_download_html_page_is_rejected_not_cached(tmp_path, server, monkeypatch):
    base, routes, hits = server
    routes["/input.txt"] = reply(b"<!DOCTYPE html><html><body>Sign in to the Wi-Fi</body></html>" * 20,
                                 ctype="text/html")
    monkeypatch.setattr(C, "_SHAKESPEARE_URL", base + "/input.txt")  # the pinned hash stays
    for _ in range(2):  # nothing was cached, so the second call downloads (and rejects) again
        with pytest.raises(RuntimeError, match=r"SHA-256(.|\n)*HTML(.|\n)*deleted"):
            C.tiny_shakespeare(root=tmp_path, timeout=5)
        assert not list(tmp_path.iterdir())
    assert hits == ["/input.txt"] * 2


def test_download_cached_file_with_wrong_hash_is_downloaded_again(tmp_path, server, monkeypatch):
    base, routes, hits = server
    routes["/input.txt"] = reply()
    monkeypatch.setattr(C, "_SHAKESPEARE_URL", base + "/input.txt")
    monkeypatch.setitem(C._SHA256, "tinyshakespeare.txt", BODY_SHA)
    (tmp_path / "tinyshakespeare.txt").write_text("tampered " * 50)
    corpus = C.tiny_shakespeare(root=tmp_path, timeout=5)
    assert corpus.text.startswith("First Citizen:") and hits == ["/input.txt"]
    assert (tmp_path / "tinyshakespeare.txt").read_bytes() == BODY
    C.tiny_shakespeare(root=tmp_path, timeout=5)
    assert hits == ["/input.txt"]  # now it is good, and cached


def test_download_trickling_server_hits_the_deadline(tmp_path, server):
    base, routes, hits = server

    def trickle(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        for _ in range(30):  # at most ~9 s, whatever the client does
            handler.wfile.write(b"x")
            handler.wfile.flush()
            time.sleep(0.3)

    routes["/slow.txt"] = trickle
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"timeout=1 s(.|\n)*partial download was deleted"):
        C._fetch(base + "/slow.txt", "slow.txt", "0" * 64, tmp_path, timeout=1.0)
    assert time.monotonic() - start < 3
    assert not list(tmp_path.iterdir())


def test_download_concurrently_both_succeed(tmp_path, server):
    base, routes, hits = server
    routes["/both.txt"] = reply(pause=0.3)  # slow enough that the two downloads overlap
    barrier, results = threading.Barrier(2), []

    def work():
        barrier.wait()
        results.append(C._fetch(base + "/both.txt", "both.txt", BODY_SHA, tmp_path, timeout=5))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [tmp_path / "both.txt"] * 2 and len(hits) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["both.txt"]  # no temporary files left
    assert (tmp_path / "both.txt").read_bytes() == BODY


def test_download_checksums_and_arguments(tmp_path, monkeypatch):
    monkeypatch.setattr(C.urllib.request, "urlopen", lambda *a, **k: pytest.fail("must not download"))
    assert set(C._SHA256) == {"tinyshakespeare.txt", "wikitext-2-raw-v1.zip", "wikitext-103-raw-v1.zip"}
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in C._SHA256.values())
    (tmp_path / "tinyshakespeare.txt").write_bytes(BODY)  # placed by hand, accepted with its explicit hash
    assert C.tiny_shakespeare(root=tmp_path, sha256=BODY_SHA).text.startswith("First Citizen:")
    for bad in ("not-a-hash", "0" * 63, 123):
        with pytest.raises(ValueError, match="64 hexadecimal"):
            C.tiny_shakespeare(root=tmp_path, sha256=bad)
    for bad in (0, -1.0, "300"):
        with pytest.raises(ValueError, match="timeout"):
            C.tiny_shakespeare(root=tmp_path, sha256=BODY_SHA, timeout=bad)
    with pytest.raises(ValueError, match="'2' or '103'"):
        C.wikitext("42", root=tmp_path)
    assert (tmp_path / "tinyshakespeare.txt").read_bytes() == BODY  # bad arguments touch nothing


def test_cache_dir_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    assert pe.cache_dir("data") == tmp_path / "data"
    monkeypatch.delenv("POSENC_CACHE")
    assert pe.cache_dir().name == "posenc"


def test_exported():
    assert pe.MarkovChain is D.MarkovChain and pe.python_docs is C.python_docs


def test_markov_optimal_nll():
    chain = D.MarkovChain(vocab_size=3, order=2, alpha=0.5, seed=2)
    x, y = chain.batch(5, 12, gen(0))
    nll = chain.optimal_nll(x, y)
    assert nll.shape == (5, 12)
    p = chain.transitions
    # positions with a fully observed context: -log P(x_{t+1} | x_{t-1}, x_t)
    assert torch.allclose(nll[:, 1:], -p[x[:, :-1] * 3 + x[:, 1:], y[:, 1:]].log())
    # the first prediction, by brute force over the hidden start (c0, c1), uniform prior
    for b in range(5):
        x0, x1 = int(x[b, 0]), int(y[b, 0])
        num = sum(p[c0 * 3 + c1, x0] * p[c1 * 3 + x0, x1] for c0 in range(3) for c1 in range(3))
        den = sum(p[c0 * 3 + c1, x0] for c0 in range(3) for c1 in range(3))
        assert math.isclose(nll[b, 0].item(), -math.log(num / den), rel_tol=1e-9)
    # the mean over a long sample approaches the entropy rate
    long = chain.batch(64, 300, gen(1))
    assert abs(chain.optimal_nll(*long)[:, 20:].mean().item() - chain.entropy_rate()) < 0.03
    with pytest.raises(ValueError):
        chain.optimal_nll(x, x)  # not shifted


def test_lagged_copy_statistics_targets_and_optimal_loss():
    task = pe.LaggedCopy(vocab_size=10, lag=3, p_copy=0.6)
    x = task.sample(200, 200, torch.Generator().manual_seed(0))
    assert x.shape == (200, 200) and x.dtype == torch.int64 and 0 <= x.min() and x.max() < 10
    same = (x[:, 3:] == x[:, :-3]).double().mean().item()
    assert abs(same - (0.6 + 0.4 / 10)) < 0.01  # copied, or redrawn and equal by chance
    inputs, targets = task.batch(4, 12, torch.Generator().manual_seed(1))
    assert (targets[:, :2] == pe.IGNORE_INDEX).all()  # x_1, x_2: nothing to copy yet
    assert torch.equal(targets[:, 2:-1], inputs[:, 3:])  # targets are the next tokens
    # the optimal loss is the cross-entropy of the true next-token distribution, measured on samples
    seq = task.sample(400, 64, torch.Generator().manual_seed(2))
    prev, nxt = seq[:, :-3], seq[:, 3:]
    p = torch.where(nxt == prev, 0.6 + 0.4 / 10, 0.4 / 10)
    assert abs(-p.log().mean().item() - task.optimal_loss()) < 0.02
    assert pe.LaggedCopy(5, p_copy=1.0).optimal_loss() == 0.0
    assert task.config == dict(kind="lagged_copy", vocab_size=10, lag=3, p_copy=0.6)



def _lagged_copy_step_by_step(task, batch_size, length, generator):
    """The definition, one position at a time (the same random draws as LaggedCopy.sample)."""
    x = torch.randint(task.vocab_size, (batch_size, length), generator=generator)
    copy = torch.rand(batch_size, length, generator=generator) < task.p_copy
    for t in range(task.lag, length):
        x[:, t] = torch.where(copy[:, t], x[:, t - task.lag], x[:, t])
    return x


@settings(max_examples=60, deadline=None)
@given(lag=st.integers(1, 6), p_copy=st.sampled_from([0.0, 0.3, 0.8, 1.0]), batch_size=st.integers(1, 5),
       length=st.integers(1, 40), seed=st.integers(0, 2 ** 16))
def test_lagged_copy_sample_equals_the_step_by_step_definition(lag, p_copy, batch_size, length, seed):
    task = pe.LaggedCopy(vocab_size=7, lag=lag, p_copy=p_copy)
    fast = task.sample(batch_size, length, gen(seed))
    assert torch.equal(fast, _lagged_copy_step_by_step(task, batch_size, length, gen(seed)))


@pytest.mark.parametrize("kwargs", [dict(vocab_size=1), dict(lag=0), dict(p_copy=1.5), dict(p_copy=True)])
def test_lagged_copy_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        pe.LaggedCopy(**kwargs)


def test_relative_cache_folder_is_resolved_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POSENC_CACHE", "rel-cache-test")
    first = pe.cache_dir("runs")
    assert first.is_absolute() and first == tmp_path / "rel-cache-test" / "runs"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert pe.cache_dir("runs") == first  # a later chdir does not move the cache


@pytest.mark.parametrize("alpha", [1e-4, 1e-8, 1e-30])
def test_markov_chain_with_tiny_alpha_has_valid_rows(alpha):
    chain = D.MarkovChain(vocab_size=6, order=2, alpha=alpha, seed=0)
    p = chain.transitions
    assert torch.isfinite(p).all() and (p >= 0).all() and torch.allclose(p.sum(-1), torch.ones(36, dtype=torch.float64))
    x, y = chain.batch(3, 40, torch.Generator().manual_seed(0))
    nll = chain.optimal_nll(x, y)
    assert torch.isfinite(nll).all() and math.isfinite(chain.entropy_rate())


def test_log_space_dirichlet_has_the_dirichlet_moments():
    """E p_i = 1/V and Var p_i = (1/V)(1 - 1/V) / (V alpha + 1) for a symmetric Dirichlet."""
    import numpy as np

    v, alpha = 5, 0.3
    p = D._dirichlet_log_space(np.random.RandomState(0), alpha, 40000, v)
    assert np.allclose(p.sum(1), 1.0)
    assert np.allclose(p.mean(0), 1 / v, atol=0.005)
    assert np.allclose(p.var(0), (1 / v) * (1 - 1 / v) / (v * alpha + 1), rtol=0.05)
