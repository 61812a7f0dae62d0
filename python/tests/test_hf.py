"""numattn as a Hugging Face transformers attention backend (skipped without torch, transformers,
gguf and accelerate, or without the default model): transformers loads the default GGUF
(dequantized to float32) and, with numattn.hf.register, gives the perplexity of `numattn ppl`
(the same chunks and protocol) and the greedy text of `numattn generate`."""

import math
import os
import sys

import pytest

import numattn

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")
nhf = pytest.importorskip("numattn.hf")

sys.path.insert(0, os.path.join(os.environ.get("NUMATTN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                                "examples"))
import hf_approximate_attention as ex  # noqa: E402

CTX, CHUNKS = 512, 2
WINDOW = "sparse.window(left=64,right=0,sinks=4)"


@pytest.fixture(scope="module")
def hf(model):
    torch.set_num_threads(2)
    return ex.load_hf(model.path)


@pytest.fixture(scope="module")
def chunks(model):
    tokens = model.tokenize(numattn.default_text()[:20000], add_bos=model.add_bos, parse_special=False)
    return tokens, ex.ppl_chunks(model, tokens, CTX, CHUNKS)


def test_tokens_are_numattn_ppl_s(model, chunks):
    # A prefix of the text tokenizes as the start of the whole (the chunks numattn ppl reads).
    tokens, _ = chunks
    whole = model.tokenize(numattn.default_text()[:40000], add_bos=model.add_bos, parse_special=False)
    assert tokens[:CTX * CHUNKS] == whole[:CTX * CHUNKS]


def test_ppl_equals_numattn_ppl(model, hf, chunks):
    tokens, ch = chunks
    backend = nhf.register("numattn_test", method="exact.flash", threads=2)
    hf.set_attn_implementation("numattn_test")
    p_hf = ex.hf_ppl(hf, ch, CTX)
    ref = model.ppl(tokens, ctx=CTX, chunks=CHUNKS, threads=2)["ppl"]
    assert abs(p_hf - ref) / ref < 1e-6, (p_hf, ref)
    layers = model.hparams["n_layer"]
    assert sorted(backend.calls) == list(range(layers)) and all(c == CHUNKS for c in backend.calls.values())
    assert backend.last[0]["n_q"] == CTX and backend.last[0]["method"] == numattn.canonical_spec("exact.flash")
    hf.set_attn_implementation("sdpa")
    p_sdpa = ex.hf_ppl(hf, ch, CTX)
    assert abs(p_hf - p_sdpa) / p_sdpa < 1e-6, (p_hf, p_sdpa)


def test_window_ppl_equals_numattn_ppl_and_is_estimated(model, hf, chunks):
    tokens, ch = chunks
    backend = nhf.register("numattn_test", method=WINDOW, threads=2, estimate_rows=0)
    hf.set_attn_implementation("numattn_test")
    p_hf = ex.hf_ppl(hf, ch, CTX)
    ref = model.ppl(tokens, ctx=CTX, chunks=CHUNKS, attn=WINDOW, threads=2)["ppl"]
    assert abs(p_hf - ref) / ref < 1e-6, (p_hf, ref)
    exact = model.ppl(tokens, ctx=CTX, chunks=CHUNKS, threads=2)["ppl"]
    assert p_hf > exact  # a 64-key window loses something on 512-token chunks
    for info in backend.last.values():
        assert info["method"] == numattn.canonical_spec(WINDOW)
        assert 0 < info["est_rel_error"] <= info["est_rel_error_hi"] < math.inf


def test_per_layer_specs(model, hf, chunks):
    _, ch = chunks
    backend = nhf.register("numattn_test", method="exact.flash", layers={3: WINDOW}, threads=2)
    hf.set_attn_implementation("numattn_test")
    ex.hf_ppl(hf, ch[:1], CTX)
    assert backend.last[3]["method"] == numattn.canonical_spec(WINDOW)
    assert backend.last[4]["method"] == numattn.canonical_spec("exact.flash")
    with pytest.raises(numattn.Error):
        nhf.register("numattn_test", method="no.such_method")


def test_grad_mode_is_refused_unless_allowed(hf):
    nhf.register("numattn_test", threads=2)
    hf.set_attn_implementation("numattn_test")
    x = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(RuntimeError, match="allow_no_grad=True"):
        hf(x)
    nhf.register("numattn_test", threads=2, allow_no_grad=True)
    with torch.no_grad():
        want = hf(x).logits
    assert torch.equal(hf(x).logits.detach(), want)  # the same forward pass, in grad mode


@pytest.mark.parametrize("spec", ["exact.flash", WINDOW])
def test_greedy_generation_equals_numattn_generate(model, hf, spec):
    prompt, n = "It is a truth universally acknowledged", 24
    want = model.generate(prompt, n, attn=spec, return_ids=True, threads=2)
    backend = nhf.register("numattn_test", method=spec, threads=2, record=True)
    hf.set_attn_implementation("numattn_test")
    ids = torch.tensor([model.tokenize(prompt, add_bos=model.add_bos, parse_special=True)])
    with torch.no_grad():
        got = hf.generate(ids, max_new_tokens=len(want), do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert got == list(want), (model.detokenize(got), model.detokenize(list(want)))
    # Prefill, then one decode call per token with Nq = 1 against the cache.
    l0 = [r for r in backend.records if r["layer"] == 0]
    assert l0[0]["n_q"] == ids.shape[1] and all(r["n_q"] == 1 for r in l0[1:])
    assert [r["n_kv"] for r in l0[1:]] == list(range(ids.shape[1] + 1, ids.shape[1] + len(l0)))
