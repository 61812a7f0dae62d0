"""numattn.Model against the CLI on the default model (skipped when it is not cached)."""

import numpy as np
import pytest

import numattn


def test_hparams_and_tokenizer(model):
    hp = model.hparams
    assert hp["n_layer"] == 30 and hp["n_head"] == 9 and hp["n_head_kv"] == 3 and hp["head_dim"] == 64
    ids = model.tokenize("Pride and Prejudice")
    assert model.detokenize(ids) == "Pride and Prejudice"
    assert "Model(" in repr(model)


def test_ppl_equals_cli(model, short_text, run_cli):
    text, path = short_text
    got = model.ppl(text, ctx=64, chunks=2, threads=2)
    row = run_cli("ppl", "--model", "default", "--text", path, "--ctx", 64, "--chunks", 2,
                  "--threads", 2, "--no-progress", "--format", "json")
    row = row[0] if isinstance(row, list) else row
    # Same computation, up to float32 rounding: OpenBLAS picks its kernels per CPU at run time,
    # and on some CPUs (AMD Zen 4) a GEMM's rounding depends on where its buffers lie.
    assert got["ppl"] == pytest.approx(row["ppl"], rel=1e-5)
    assert got["tokens_scored"] == row["tokens_scored"] == 2 * 31
    assert got["nll"].shape == (62,) and np.isclose(np.exp(got["nll"].mean()), got["ppl"])
    # with a baseline: KL of a method against itself is zero, top-1 agreement one
    kl = model.ppl(model.tokenize(text), ctx=64, chunks=1, attn="exact.naive", baseline="exact.flash",
                   threads=2)
    assert kl["kld"] < 1e-6 and kl["top1_agreement"] == 1.0


def test_capture_equals_cli_and_feeds_attention(model, short_text, run_cli, tmp_path):
    text, path = short_text
    cap = model.capture(text, tokens=24, layers=[2, 0], threads=2)
    assert sorted(cap) == [0, 2]
    q, k, v = cap[2]
    assert q.shape == (9, 24, 64) and k.shape == v.shape == (3, 24, 64)
    run_cli("capture", "--model", "default", "--text", path, "--tokens", 24, "--layers", "0,2",
            "--out", tmp_path, "--threads", 2, "--no-progress")
    for layer in (0, 2):
        for t, arr in zip("qkv", cap[layer]):
            np.testing.assert_array_equal(arr, np.load(tmp_path / f"layer{layer}_{t}.npy"))
    out = numattn.attention(q, k, v, causal=True)
    ref = numattn.reference(q, k, v, causal=True)
    assert numattn.error(out, ref)["rel_fro_error"] < 1e-5


def test_generate_equals_cli(model, run_cli):
    ids = model.generate("The capital of France is", max_tokens=6, return_ids=True, threads=2)
    row = run_cli("generate", "--model", "default", "--prompt", "The capital of France is",
                  "--max-tokens", 6, "--threads", 2, "--format", "json")
    row = row[0] if isinstance(row, list) else row
    assert ids == row["ids"]
    assert model.generate("The capital of France is", max_tokens=6, threads=2) == row["text"]
    # another attention method for one call; the model's own is restored
    assert model.generate("The capital of France is", max_tokens=6, attn="exact.naive",
                          return_ids=True, threads=2) == ids


def test_model_errors(model):
    with pytest.raises(numattn.Error, match="twice") as e:
        model.ppl("too short", ctx=64)
    assert isinstance(e.value, ValueError)
    with pytest.raises(numattn.OptionError, match="ctx"):
        model.ppl("too short", ctx=2)
    with pytest.raises(numattn.OptionError, match="layers") as e:
        model.capture("some text here", tokens=2, layers=[30])
    with pytest.raises(numattn.OptionError, match="max_tokens"):
        model.generate("hi", max_tokens=0)
    with pytest.raises(numattn.OptionError, match="attn"):
        model.generate("hi", max_tokens=2, attn="exact.nope")
    with pytest.raises(numattn.Error, match="No such file|cannot open|not found|open"):
        numattn.Model.load("/nonexistent/model.gguf")


def test_transform_equals_cli(model, short_text, run_cli):
    """Model.load(transform=...) takes the CLI's --transform string: the same pipeline, the same
    canonical form, the same perplexity as `numattn ppl --weights f32 --transform` (float32
    weights, as Model.load)."""
    text, path = short_text
    spec = "mla(rank=64,rope_heads=1,calib_tokens=512)|bda(pairs=vo,coef=f32)"
    m = numattn.Model.load("default", threads=2, transform=spec)
    assert m.transform == ("mla(rank=64,rope_heads=1,rope_dims=0,freqfold=1,balance=0,budget=0,calib=default,calib_tokens=512,"
                           "calib_mode=two_pass,exec=absorbed,weights=f32)|"
                           "bda(pairs=vo,coef=f32)")
    assert model.transform == ""
    got = m.ppl(text, ctx=64, chunks=2, threads=2)
    row = run_cli("ppl", "--model", "default", "--text", path, "--ctx", 64, "--chunks", 2, "--weights", "f32",
                  "--transform", spec, "--threads", 2, "--no-progress", "--format", "json")
    row = row[0] if isinstance(row, list) else row
    assert row["transform"] == m.transform
    assert got["ppl"] == pytest.approx(row["ppl"], rel=1e-5)
    # refused before the file is read, by the one parser, with its message
    for bad, says in [("mla(rank=64)||bda(pairs=vo)", "empty item"), ("mla(rank=-3)", "out of range"),
                      ("foo(x=1)", "unknown transform"), ("mla(rank=64", "never closed")]:
        with pytest.raises(numattn.Error, match=says):
            numattn.Model.load("/nonexistent/model.gguf", transform=bad)


def test_ppl_is_interruptible(model, short_text):
    import _thread
    import threading

    text, _ = short_text
    long_text = text * 6  # ~200 chunks of 64 tokens
    before = model.ppl(text, ctx=64, chunks=2, threads=2)["ppl"]
    timer = threading.Timer(0.05, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.ppl(long_text, ctx=64, threads=2)
    finally:
        timer.cancel()
    assert model.ppl(text, ctx=64, chunks=2, threads=2)["ppl"] == before  # the model is intact


def _interrupted_after(seconds, call):
    """Runs call() with Ctrl-C (KeyboardInterrupt) sent to the main thread after `seconds`; returns
    the seconds it ran before the KeyboardInterrupt came out of it."""
    import _thread
    import threading
    import time

    timer = threading.Timer(seconds, _thread.interrupt_main)
    t0 = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
    return time.perf_counter() - t0


def test_capture_and_generate_are_interruptible(model, short_text):
    import time

    text, _ = short_text
    t0 = time.perf_counter()
    full = model.capture(text, tokens=1024, layers=[0], threads=2)
    capture_s = time.perf_counter() - t0
    # The forward pass stops after the layer it is in (the library's cancellation check), well
    # before the whole pass.
    s = _interrupted_after(0.02, lambda: model.capture(text, tokens=1024, layers="all", threads=2))
    assert s < max(capture_s, 0.5) * 2
    again = model.capture(text, tokens=1024, layers=[0], threads=2)
    assert all((a == b).all() for a, b in zip(full[0], again[0]))  # the model is intact
    ids = model.generate("Once upon a time", max_tokens=8, return_ids=True)
    _interrupted_after(0.05, lambda: model.generate("Once upon a time", max_tokens=400, threads=2))
    assert model.generate("Once upon a time", max_tokens=8, return_ids=True) == ids
