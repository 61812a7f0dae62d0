"""Hostile input on the Python API: every entry point refuses a bad argument by name before it
reaches C++, outputs may not overlap themselves or the inputs, and sizes that do not fit in
memory (a broadcast view holds any shape in a few bytes) are refused with the operation and the
bytes, never a bare std::bad_alloc."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numattn

F32 = np.zeros((1, 2, 8, 4), np.float32)
MAT = np.arange(12.0).reshape(4, 3)
GIB = 2 ** 30


def names_argument(msg, name):
    """The message is ours (not nanobind's signature dump) and starts its complaint with the
    argument: '<function>: <name>: ...' (or '<name>[i]: ...' for an element)."""
    return "incompatible function arguments" not in msg and re.search(
        rf"(^|: ){re.escape(name)}(\[\d+\])?: ", msg) is not None


def refused(call, name, exc=(TypeError, ValueError)):
    with pytest.raises(exc) as e:
        call()
    msg = str(e.value)
    assert names_argument(msg, name), msg
    if isinstance(e.value, numattn.OptionError):
        assert e.value.option == name
    return e.value


# --- the sweep: every entry point × a set of bad values for each of its arguments -------------

ARRAY_BAD = [[[1.0]], (1.0, 2.0), "q", 3, None, b"\0\0\0\0",
             F32.astype(">f4"), F32.astype(np.longdouble), F32.astype(object),
             F32.astype(np.complex64), F32.astype(np.float16), F32.astype(np.int32),
             np.zeros(2, dtype=[("a", "f4")])]
MATRIX_BAD = [[[1.0]], "W", 3, None, MAT.astype(">f8"), MAT.astype(np.longdouble), MAT.astype(object),
              MAT.astype(np.float16)]
BOOL_BAD = [2, 0, None, "yes", 1.0, b"1"]
INT_BAD = [1.5, "2", None, True, 2 ** 63, 2 ** 64, -(2 ** 63) - 1, b"2", [1]]
OPT_INT_BAD = [1.5, "2", True, 2 ** 63, 2 ** 64, b"2"]
THREADS_BAD = [1.5, "2", True, 2 ** 31, 2 ** 63, -1, b"2", [2]]
STR_BAD = [b"exact.flash", 3, None, "\udcff", "bad\udcffsurrogate", "a\0b", ["x"]]
OPT_STR_BAD = [b"x", 3, "\udcff", "a\0b"]
TEXT_BAD = [b"text", 3, None, "lone \udcff surrogate", 1.5]  # text may contain NUL
REAL_BAD = ["1", b"1", True, float("nan"), float("inf"), 10 ** 400, [1.0]]
IDS_BAD = [[1.5], ["1"], [True], [2 ** 31], [-(2 ** 31) - 1], "ids", b"\1", np.zeros(2), 3]
CAUSAL_BAD = [2, 0, None, 1.5, b"none", "\udcff", ["none"]]
WINDOW_BAD = [3, (1,), (1, 2, 3), ("1", 2), (1.5, 0), (True, 0), (2 ** 63, 0), "12"]
LAYERS_BAD = [[1.5], ["0"], [True], 3, b"all", "\udcff", [2 ** 63]]
PATH_BAD = [b"/tmp/m.gguf", 3, None, "a\0b", "\udcff"]


def bare(cls):
    """An instance whose C++ half was never built: any call that reached C++ would fail there
    (nanobind: 'uninitialized instance'), so a refusal proves the check came first."""
    return cls.__new__(cls)


q, k, v = F32, F32, F32


def att(**kw):
    return lambda: numattn.attention(**{"q": q, "k": k, "v": v, **kw})


def ref(**kw):
    return lambda: numattn.reference(**{"q": q, "k": k, "v": v, **kw})


def err(**kw):
    return lambda: numattn.error(**{"approx": F32, "exact": F32.astype(np.float64), **kw})


def bd(**kw):
    return lambda: numattn.BasisDecomposition(**{"W": MAT, "rank": 2, **kw})


def bdm(method, **kw):
    return lambda: getattr(bare(numattn.BasisDecomposition), method)(**kw)


def model(method, **kw):
    return lambda: getattr(bare(numattn.Model), method)(**kw)


CASES = []


def case(entry, name, bads, make):
    for i, bad in enumerate(bads):
        CASES.append(pytest.param(make(bad), name, id=f"{entry}-{name}-{i}"))


def _is(x, dtype):
    return isinstance(x, np.ndarray) and x.dtype == dtype


for fn, mk in (("attention", att), ("reference", ref)):
    # attention reads float16 q, k, v, masks and out (reference: float32/float64 only).
    half_ok = (lambda x: _is(x, np.float16)) if fn == "attention" else (lambda x: False)
    for a in "qkv":
        case(fn, a, [x for x in ARRAY_BAD if not half_ok(x)], lambda b, a=a, mk=mk: mk(**{a: b}))
    case(fn, "causal", CAUSAL_BAD, lambda b, mk=mk: mk(causal=b))
    case(fn, "mask", [x for x in ARRAY_BAD if x is not None and not _is(x, np.int32) and not half_ok(x)],
         lambda b, mk=mk: mk(mask=b))
    case(fn, "scale", REAL_BAD, lambda b, mk=mk: mk(scale=b))
    case(fn, "window", WINDOW_BAD, lambda b, mk=mk: mk(window=b))
    case(fn, "layout", STR_BAD, lambda b, mk=mk: mk(layout=b))
    case(fn, "return_lse", BOOL_BAD, lambda b, mk=mk: mk(return_lse=b))
    case(fn, "threads", THREADS_BAD, lambda b, mk=mk: mk(threads=b))
case("attention", "method", STR_BAD, lambda b: att(method=b))
case("attention", "out_layout", OPT_STR_BAD + ["nhd"], lambda b: att(out_layout=b))
case("attention", "return_info", BOOL_BAD, lambda b: att(return_info=b))
case("attention", "estimate_rows", OPT_INT_BAD + [-1], lambda b: att(estimate_rows=b))
OUT_BAD = [x for x in ARRAY_BAD if x is not None and not _is(x, np.float16)] + [
    np.zeros((1, 2, 8, 4), np.float64), np.broadcast_to(np.zeros(4, np.float32), (1, 2, 8, 4))]
case("attention", "out", OUT_BAD, lambda b: att(out=b))
case("error", "approx", ARRAY_BAD + [F32.astype(np.float64)], lambda b: err(approx=b))
case("error", "exact", ARRAY_BAD, lambda b: err(exact=b))
for a in ("approx_lse", "exact_lse"):
    case("error", a, [x for x in ARRAY_BAD if x is not None], lambda b, a=a: err(**{a: b}))
case("canonical_spec", "spec", STR_BAD, lambda b: lambda: numattn.canonical_spec(b))
case("BasisDecomposition", "W", MATRIX_BAD + [[MAT, "x"], []], lambda b: bd(W=b))
case("BasisDecomposition", "rank", OPT_INT_BAD, lambda b: bd(rank=b))
case("BasisDecomposition", "strategy", STR_BAD, lambda b: bd(strategy=b))
case("BasisDecomposition", "form", STR_BAD, lambda b: bd(form=b))
case("BasisDecomposition", "tolerance", REAL_BAD, lambda b: bd(tolerance=b))
case("BasisDecomposition", "basis", IDS_BAD[:4] + [[2 ** 63], 3, "01"], lambda b: bd(basis=b))
case("BasisDecomposition", "V", [x for x in MATRIX_BAD if x is not None], lambda b: bd(V=b))
for m in ("basis_block_of", "coefficients_of", "reconstruct"):
    case(f"BasisDecomposition.{m}", "k", INT_BAD, lambda b, m=m: bdm(m, k=b))
case("BasisDecomposition.apply", "x", MATRIX_BAD, lambda b: bdm("apply", x=b))
case("BasisDecomposition.apply", "k", INT_BAD, lambda b: bdm("apply", x=MAT, k=b))
case("Model.load", "path", PATH_BAD, lambda b: lambda: numattn.Model.load(b))
case("Model.load", "threads", THREADS_BAD, lambda b: lambda: numattn.Model.load("/nonexistent", threads=b))
case("Model", "path", PATH_BAD, lambda b: lambda: numattn.Model(b))
case("Model.tokenize", "text", TEXT_BAD, lambda b: model("tokenize", text=b))
case("Model.tokenize", "add_bos", BOOL_BAD, lambda b: model("tokenize", text="x", add_bos=b))
case("Model.tokenize", "parse_special", BOOL_BAD, lambda b: model("tokenize", text="x", parse_special=b))
case("Model.detokenize", "ids", IDS_BAD, lambda b: model("detokenize", ids=b))
case("Model.detokenize", "render_special", BOOL_BAD, lambda b: model("detokenize", ids=[1], render_special=b))
PPL = dict(text="some text")
case("Model.ppl", "text", TEXT_BAD + IDS_BAD[:5], lambda b: model("ppl", text=b))
for a in ("ctx", "chunks"):
    case("Model.ppl", a, INT_BAD, lambda b, a=a: model("ppl", **PPL, **{a: b}))
case("Model.ppl", "attn", STR_BAD, lambda b: model("ppl", **PPL, attn=b))
case("Model.ppl", "baseline", OPT_STR_BAD, lambda b: model("ppl", **PPL, baseline=b))
case("Model.ppl", "bos", STR_BAD, lambda b: model("ppl", **PPL, bos=b))
case("Model.ppl", "allow_long_ctx", BOOL_BAD, lambda b: model("ppl", **PPL, allow_long_ctx=b))
case("Model.ppl", "threads", THREADS_BAD, lambda b: model("ppl", **PPL, threads=b))
case("Model.capture", "text", TEXT_BAD + IDS_BAD[:5], lambda b: model("capture", text=b))
for a in ("tokens", "offset"):
    case("Model.capture", a, INT_BAD, lambda b, a=a: model("capture", **PPL, **{a: b}))
case("Model.capture", "layers", LAYERS_BAD, lambda b: model("capture", **PPL, layers=b))
case("Model.capture", "pre_rope", BOOL_BAD, lambda b: model("capture", **PPL, pre_rope=b))
case("Model.capture", "bos", STR_BAD, lambda b: model("capture", **PPL, bos=b))
case("Model.capture", "threads", THREADS_BAD, lambda b: model("capture", **PPL, threads=b))
case("Model.generate", "prompt", TEXT_BAD, lambda b: model("generate", prompt=b))
case("Model.generate", "max_tokens", INT_BAD, lambda b: model("generate", prompt="hi", max_tokens=b))
case("Model.generate", "attn", OPT_STR_BAD, lambda b: model("generate", prompt="hi", attn=b))
for a in ("chat", "return_ids"):
    case("Model.generate", a, BOOL_BAD, lambda b, a=a: model("generate", prompt="hi", **{a: b}))
case("Model.generate", "threads", THREADS_BAD, lambda b: model("generate", prompt="hi", threads=b))


@pytest.mark.parametrize("call,name", CASES)
def test_every_entry_point_refuses_bad_arguments_by_name(call, name):
    refused(call, name)


def test_the_sweep_covers_every_entry_point():
    """Every function and method the extension exports that takes arguments is in the sweep
    above (a new one must be added there, with its checks)."""
    covered = {p.id.split("-")[0] for p in CASES}
    exported = set()
    ext = numattn._numattn
    for n in dir(ext):
        obj = getattr(ext, n)
        if callable(obj) and not isinstance(obj, type) and "()" not in str(getattr(obj, "__doc__", "")).split("\n")[0]:
            exported.add(n)
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            exported.add(n)
            for m, f in vars(obj).items():
                if not m.startswith("_") and (callable(f) or isinstance(f, staticmethod)):
                    exported.add(f"{n}.{m}")
    assert exported - covered == set(), exported - covered


def test_no_argument_functions_are_python_functions():
    for f in (numattn.methods, numattn.blas_info, numattn.default_model_path, numattn.default_text_path):
        with pytest.raises(TypeError, match="positional argument"):
            f(1)


def test_valid_values_of_every_kind_are_still_accepted():
    out = numattn.attention(q, k, v, method="exact.flash", causal=np.bool_(True), scale=np.float32(0.5),
                            window=(np.int64(2), 0), layout="BHND", return_lse=np.True_, threads=np.int32(1))
    assert out[0].shape == (1, 2, 8, 4)
    numattn.attention(q, k, v, causal="bottom-right", mask=np.ones((8, 8), np.uint8), scale=1)
    numattn.attention(memoryview(q), k, v)  # a buffer is read as an array
    w = numattn.BasisDecomposition([MAT, MAT * 2], np.int64(2), basis=np.array([0, 1]))
    assert w.basis.tolist() == [0, 1] and w.apply(np.ones((1, 4)), k=np.int64(1)).shape == (1, 3)
    assert isinstance(w, numattn._numattn.BasisDecomposition)
    assert numattn.canonical_spec("exact.flash").startswith("exact.flash(")


# --- outputs that overlap ---------------------------------------------------------------------

def test_out_that_overlaps_itself_is_refused():
    buf = np.zeros((8, 4), np.float32)
    zero = np.lib.stride_tricks.as_strided(buf, (1, 2, 8, 4), (0, 0, 16, 4))  # heads share memory
    assert zero.flags.writeable
    e = refused(lambda: numattn.attention(q, k, v, out=zero), "out", numattn.OptionError)
    assert "overlap one another" in str(e)
    inter = np.lib.stride_tricks.as_strided(np.zeros(64, np.float32), (1, 2, 8, 4), (0, 4, 8, 4))
    refused(lambda: numattn.attention(q, k, v, out=inter), "out", numattn.OptionError)


def test_out_that_overlaps_an_input_is_refused_whatever_its_strides():
    base = np.zeros((2, 2, 8, 4), np.float32)
    qq = base[:1]
    for o in (base[1:], base[::-1][:1], base[:1, :, ::-1]):  # after q, reversed onto q, q reversed
        if np.may_share_memory(o, qq):
            refused(lambda o=o: numattn.attention(qq, k, v, out=o), "out", numattn.OptionError)
        else:
            numattn.attention(qq, k, v, out=o)
    mask = np.zeros((8, 8), np.float32)
    # 64 floats laid backwards over the mask's 64, from its element 60 down to 0
    m_out = np.lib.stride_tricks.as_strided(mask.ravel()[60:], (1, 2, 8, 4), (0, -128, -16, 4))
    assert np.shares_memory(m_out, mask)
    e = refused(lambda: numattn.attention(q, k, v, mask=mask, out=m_out), "out", numattn.OptionError)
    assert "mask" in str(e)
    v2 = np.zeros((1, 2, 8, 4), np.float32)
    refused(lambda: numattn.attention(q, k, v2, out=v2[:, ::-1]), "out", numattn.OptionError)


def test_read_only_and_big_endian_out_are_refused_by_name():
    ro = np.zeros((1, 2, 8, 4), np.float32)
    ro.flags.writeable = False
    e = refused(lambda: numattn.attention(q, k, v, out=ro), "out", numattn.OptionError)
    assert "read-only" in str(e)
    e = refused(lambda: numattn.attention(q, k, v, out=np.zeros((1, 2, 8, 4), ">f4")), "out", TypeError)
    assert "byte order" in str(e) and "'<f4'" in str(e)


def test_messages_say_what_was_expected_and_given():
    e = refused(lambda: numattn.attention(q, k, v, causal=2), "causal", TypeError)
    assert "'top-left'" in str(e) and "int 2" in str(e)
    e = refused(lambda: numattn.attention(q, k, v, threads=2 ** 63), "threads", numattn.OptionError)
    assert str(2 ** 63) in str(e)
    e = refused(lambda: numattn.attention(q, k, v, method=b"exact.flash"), "method", TypeError)
    assert "str" in str(e) and "bytes" in str(e) and "decode" in str(e)
    e = refused(lambda: numattn.attention(q.astype(np.longdouble), k, v), "q", TypeError)
    assert "float32" in str(e) and str(np.dtype(np.longdouble)) in str(e)
    e = refused(lambda: numattn.attention([[1.0]], k, v), "q", TypeError)
    assert "list" in str(e) and "numpy.asarray" in str(e)
    e = refused(lambda: numattn.canonical_spec("exact\udcff"), "spec", numattn.OptionError)
    assert "index 5" in str(e) and "UTF-8" in str(e)
    for kw in (dict(method="x" * 100000), dict(layout="y" * 100000), dict(causal="z" * 100000)):
        e = refused(lambda: numattn.attention(q, k, v, **kw), next(iter(kw)), numattn.OptionError)
        assert len(str(e)) < 1000 and "characters]" in str(e)  # the quoted value is shortened
    e = refused(lambda: numattn.attention(q, k, v, threads="2" * 1000), "threads", TypeError)
    assert len(str(e)) < 400  # what was given is shortened


# --- memory: sizes that do not fit are refused with the operation and the bytes -----------------

@pytest.fixture
def one_gib(monkeypatch):
    """A machine with 1 GiB available (core/memory.h's override), whatever this one has."""
    monkeypatch.setenv("NUMATTN_MEMORY_AVAILABLE", str(GIB))


def oom(call):
    with pytest.raises(numattn.OutOfMemoryError) as e:
        call()
    assert isinstance(e.value, MemoryError) and isinstance(e.value, numattn.Error)
    msg = str(e.value)
    assert "bad_alloc" not in msg and f"{GIB} bytes" in msg, msg
    return msg


def test_broadcast_problem_too_big_for_memory(one_gib):
    big_q = np.broadcast_to(np.zeros((1, 1, 1, 64), np.float32), (1, 1, 2 * 10 ** 9, 64))
    kk = np.zeros((1, 1, 4, 64), np.float32)
    msg = oom(lambda: numattn.attention(big_q, kk, kk))
    assert msg.startswith("numattn.attention: the output [1, 1, 2000000000, 64]") and "512000000000 bytes" in msg
    msg = oom(lambda: numattn.reference(big_q, kk, kk))
    assert msg.startswith("numattn.reference: the float64 output") and "1024000000000 bytes" in msg
    # 2^31 heads reading one kv head
    heads = np.broadcast_to(np.zeros((1, 1, 1, 8), np.float32), (1, 2 ** 31, 1, 8))
    msg = oom(lambda: numattn.attention(heads, kk[..., :8], kk[..., :8], return_lse=True))
    assert "[1, 2147483648, 1, 8]" in msg
    # a float64 input is converted to float32 first: that copy is what is refused
    q64 = np.broadcast_to(np.zeros((1, 1, 1, 64)), (1, 1, 10 ** 8, 64))
    msg = oom(lambda: numattn.attention(q64, kk, kk))
    assert "q converted to float32 [1, 1, 100000000, 64]" in msg
    # a broadcast integer mask is converted to bool
    n = 10 ** 5
    qn = np.broadcast_to(np.zeros((1, 1, 1, 8), np.float32), (1, 1, n, 8))
    mask = np.broadcast_to(np.ones((1, 1), np.int64), (n, n))
    assert "the mask as bool [100000, 100000]" in oom(lambda: numattn.attention(qn, qn, qn, mask=mask))
    e = np.broadcast_to(np.zeros((1, 10 ** 5), np.float32), (10 ** 6, 10 ** 5))
    assert "numattn.error: exact [1000000, 100000] as float64" in oom(lambda: numattn.error(e, e))


def test_sizes_that_overflow_int64_are_refused_by_name():
    # B·H·Nq from q, Dv from v: the output's element count is 2^60 · 16 · 4 bytes > 2^63.
    qq = np.broadcast_to(np.zeros((1, 1, 1, 1), np.float32), (2 ** 20, 2 ** 20, 2 ** 20, 1))
    kk = np.broadcast_to(np.zeros((1, 1, 1, 1), np.float32), (2 ** 20, 1, 1, 1))
    vv = np.broadcast_to(np.zeros((1, 1, 1, 16), np.float32), (2 ** 20, 1, 1, 16))
    with pytest.raises(numattn.Error, match="overflows 64 bits") as e:
        numattn.attention(qq, kk, vv)
    assert "numattn.attention: the output [1048576, 1048576, 1048576, 16]" in str(e.value)


def test_basis_decomposition_of_a_broadcast_matrix(one_gib):
    w = np.broadcast_to(np.ones((1, 1)), (10 ** 5, 10 ** 5))
    msg = oom(lambda: numattn.BasisDecomposition(w, 2))
    assert msg.startswith("numattn.BasisDecomposition: W as float64 and its working copy [100000, 100000]")
    assert "160000000000 bytes" in msg
    small = numattn.BasisDecomposition(MAT, 2)
    x = np.broadcast_to(np.ones((1, 4)), (10 ** 9, 4))
    assert "BasisDecomposition.apply: x as float64 [1000000000, 4]" in oom(lambda: small.apply(x))


PROBE = textwrap.dedent("""
    import resource, sys
    import numpy as np, numattn
    vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
    q = np.broadcast_to(np.zeros((1, 1, 1, 64), np.float32), (1, 1, 10 ** 8, 64))
    k = np.zeros((1, 1, 4, 64), np.float32)
    try:
        numattn.attention(q, k, k, threads=1)
    except MemoryError as e:
        print(type(e).__name__, e)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space limit: Linux")
def test_an_allocation_that_fails_anyway_names_the_operation_and_size():
    """The guard believes the memory is there (the override says 1 PiB); the address-space
    limit makes malloc fail: the std::bad_alloc becomes an error naming what was being done."""
    env = dict(os.environ, NUMATTN_MEMORY_AVAILABLE=str(2 ** 50), NUMATTN_KEEP_BLAS_CORE="1")
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    out = p.stdout.strip()
    assert out.startswith("OutOfMemoryError numattn.attention: out of memory (std::bad_alloc) while "
                          "preparing exact.flash("), out
    assert "on q [1, 1, 100000000, 64], k [1, 1, 4, 64]" in out, out


def test_cli_names_the_command_when_an_allocation_fails(cli):
    env = dict(os.environ, NUMATTN_MEMORY_AVAILABLE=str(2 ** 50), NUMATTN_KEEP_BLAS_CORE="1")
    args = [cli, "run", "--method", "exact.flash", "--n", "100000000", "--d", "64", "--heads", "1",
            "--threads", "1", "--check-rows", "0"]
    p = subprocess.run(["bash", "-c", 'ulimit -v 4000000 && exec "$@"', "bash", *args],
                       capture_output=True, text=True, env=env)
    assert p.returncode != 0
    assert p.stderr.startswith("error: out of memory (std::bad_alloc) while running `numattn run "
                               "--method exact.flash --n 100000000"), p.stderr
