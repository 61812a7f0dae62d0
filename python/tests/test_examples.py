"""The examples run (small)."""

import os
import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_attention_tour_runs():
    env = dict(os.environ, NUMATTN_EXAMPLE_QUICK="1")
    p = subprocess.run([sys.executable, str(EXAMPLES / "attention_tour.py")], capture_output=True,
                       text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert "rel_fro_error" in p.stdout and "BasisDecomposition(" in p.stdout


def test_type_stubs_sit_beside_the_extension():
    import numattn

    stub = pathlib.Path(numattn.__file__).with_name("_numattn.pyi")
    text = stub.read_text()
    for name in ("def attention(", "def reference(", "def error(", "class BasisDecomposition",
                 "class Model", "def methods("):
        assert name in text, name
    assert pathlib.Path(numattn.__file__).with_name("py.typed").exists()
