"""Argument checks of the numattn Python API, run before any call into the C++ extension.

The extension's signatures are typed (nanobind): an argument of the wrong kind would otherwise
get nanobind's "incompatible function arguments" without a word about which one. Every public
function and method passes its arguments through these checks first, so that a wrong one gets

- ``TypeError`` when its kind is wrong (a list where an array goes, bytes where text goes, an
  int where a bool goes, a dtype numattn cannot read, a non-native byte order);
- ``numattn.OptionError`` (a ``ValueError``, attribute ``option``) when its kind is right but its
  value is not (an int out of range, text that is not UTF-8, a read-only ``out=``);

each message starting ``<function>: <argument>:`` and saying what was expected and what was given.
Values the C++ library judges itself (shapes, specs, ranges that depend on a model) are passed on
and refused there, with the same ``OptionError`` naming the argument.
"""

import numbers
import operator
import os

import numpy as np

from ._numattn import OptionError

INT32 = (-(2 ** 31), 2 ** 31 - 1)
INT64 = (-(2 ** 63), 2 ** 63 - 1)

# dtypes an array argument may have, by role (the C++ side reads exactly these).
FLOAT = ("float32", "float64")
# q, k, v of attention: NumPy has float16 (bfloat16 arrives through DLPack, checked in C++).
QKV = ("float32", "float64", "float16")
OUT = ("float32",)
OUT_ANY = ("float32", "float16")
MASK = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
        "float64")


def _given(x):
    """What the caller passed, short: 'int 2', "str 'abc'", 'numpy.ndarray float64 (3, 4)'."""
    if isinstance(x, np.ndarray):
        return f"a numpy.ndarray of dtype {x.dtype.str!r} ({x.dtype}) and shape {x.shape}"
    if x is None:
        return "None"
    r = repr(x)
    if len(r) > 80:
        r = r[:60] + f"...[{len(r) - 72} characters]..." + r[-12:]
    t = type(x)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return f"{name} {r}" if isinstance(x, (numbers.Number, str, bytes, bytearray)) else f"{name} ({r})"


def type_error(fn, name, expected, x, hint=""):
    return TypeError(f"{fn}: {name}: expected {expected}, got {_given(x)}" + (f"; {hint}" if hint else ""))


def value_error(fn, name, detail):
    e = OptionError(f"{fn}: {name}: {detail}")
    e.option = name.split("[")[0]  # window[0] is an element of the option window
    return e


def boolean(fn, name, x):
    # numpy.bool_ is a bool to everyone but isinstance; 0 and 1 are ints, not flags.
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    raise type_error(fn, name, "True or False", x)


def integer(fn, name, x, lo=INT64[0], hi=INT64[1], none=False, what=None):
    if x is None and none:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Integral, np.integer)):
        hint = "convert it with int()" if isinstance(x, (numbers.Real, str)) and not isinstance(x, bool) else ""
        raise type_error(fn, name, "an int" + (" or None" if none else ""), x, hint)
    v = operator.index(x)
    if not lo <= v <= hi:
        raise value_error(fn, name, what or f"expected an int in [{lo}, {hi}], got {v}")
    return v


def threads(fn, x, name="threads"):
    return integer(fn, name, x, 0, INT32[1], none=True,
                   what=f"expected a thread count >= 0 (0 or None: all cores), got {x}")


def real(fn, name, x, none=False):
    if x is None and none:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Real, np.floating, np.integer)):
        raise type_error(fn, name, "a number" + (" or None" if none else ""), x)
    try:
        v = float(x)
    except OverflowError:
        raise value_error(fn, name, f"{x} is beyond the float64 range") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise value_error(fn, name, f"expected a finite number, got {v}")
    return v


def text(fn, name, x, none=False, nul=False):
    """A str that converts to UTF-8 (the C++ side's encoding). `nul`: whether NUL characters may
    appear (text yes; names, specs and paths, which C++ would cut at the NUL, no)."""
    if x is None and none:
        return None
    if isinstance(x, (bytes, bytearray, memoryview)):
        raise type_error(fn, name, "str" + (" or None" if none else ""), x, "decode the bytes first, e.g. .decode('utf-8')")
    if not isinstance(x, str):
        raise type_error(fn, name, "str" + (" or None" if none else ""), x)
    try:
        x.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = x[e.start:e.end]
        raise value_error(fn, name, f"character {bad!r} at index {e.start} cannot be encoded as UTF-8 "
                                    f"({e.reason}: a lone surrogate, e.g. from a file read with "
                                    f"errors='surrogateescape')") from None
    if not nul and "\0" in x:
        raise value_error(fn, name, f"contains a NUL character at index {x.index(chr(0))}")
    return str(x)


def path(fn, name, x):
    if isinstance(x, os.PathLike):
        x = os.fspath(x)
    if isinstance(x, bytes):
        raise type_error(fn, name, "a str or os.PathLike path", x, "decode it with os.fsdecode()")
    if not isinstance(x, str):
        raise type_error(fn, name, "a str or os.PathLike path", x)
    return text(fn, name, x)


def causal(fn, x):
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, str):
        return text(fn, "causal", x)
    raise type_error(fn, "causal", "True, False or one of 'none', 'top-left', 'bottom-right'", x)


def int_list(fn, name, x, lo=INT64[0], hi=INT64[1], none=False):
    """A list of ints from a list, tuple, range or 1-d integer array."""
    if x is None and none:
        return None
    if isinstance(x, np.ndarray):
        if x.ndim != 1 or x.dtype.kind not in "iu":
            raise type_error(fn, name, "a 1-d array of integers", x)
        x = x.tolist()
    if not isinstance(x, (list, tuple, range)):
        raise type_error(fn, name, "a list of ints" + (" or None" if none else ""), x)
    out = []
    for i, v in enumerate(x):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer)):
            raise type_error(fn, f"{name}[{i}]", "an int", v)
        v = operator.index(v)
        if not lo <= v <= hi:
            raise value_error(fn, name, f"element {i} is {v}, outside [{lo}, {hi}]")
        out.append(v)
    return out


def window(fn, x):
    if x is None:
        return None
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise type_error(fn, "window", "None or a pair (left, right) of ints", x)
    return tuple(integer(fn, f"window[{i}]", v) for i, v in enumerate(x))


def array(fn, name, x, dtypes=FLOAT, writable=False, none=False):
    """An array argument: a NumPy array (checked here), a DLPack producer (passed on: the C++
    side checks its dtype and device), or another buffer (read as a NumPy array, no copy)."""
    if x is None and none:
        return None
    if not isinstance(x, np.ndarray):
        if hasattr(x, "__dlpack__"):
            return x
        if hasattr(x, "__array_interface__") or hasattr(x, "__array_struct__") or _is_buffer(x):
            x = np.asarray(x)
        else:
            hint = f"pass numpy.asarray({name}, dtype=numpy.{dtypes[0]})" if isinstance(x, (list, tuple)) else ""
            raise type_error(fn, name, "a NumPy array or an array with __dlpack__" + (" or None" if none else ""), x, hint)
    dt = x.dtype
    if dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        raise type_error(fn, name, "an array of " + " or ".join(dtypes), x)
    if not dt.isnative:
        raise type_error(fn, name, f"native byte order ({np.dtype(dt.name).str!r})", x,
                         f"pass {name}.astype('{np.dtype(dt.name).str}')")
    if dt.name not in dtypes:
        raise type_error(fn, name, "an array of " + " or ".join(dtypes), x)
    if any(s % dt.itemsize for s in x.strides):
        raise value_error(fn, name, f"strides {x.strides} (bytes) are not multiples of the "
                                    f"{dt.itemsize}-byte element: pass numpy.ascontiguousarray({name})")
    if writable and not x.flags.writeable:
        raise value_error(fn, name, "the array is read-only (flags.writeable is False, e.g. a "
                                    "numpy.broadcast_to view): pass a writable array, e.g. numpy.empty")
    return x


def _is_buffer(x):
    if isinstance(x, (str, bytes, bytearray)):  # text is never an array
        return False
    try:
        memoryview(x)
    except TypeError:
        return False
    return True


def arrays(fn, name, x, dtypes=FLOAT):
    """One 2-d array or a list of them (BasisDecomposition's W and V)."""
    if isinstance(x, (list, tuple)):
        if not x:
            raise value_error(fn, name, "the list of matrices is empty")
        return [array(fn, f"{name}[{i}]", a, dtypes) for i, a in enumerate(x)]
    return array(fn, name, x, dtypes)


def tokens_or_text(fn, name, x):
    """A str, or token ids (a list or 1-d integer array)."""
    if isinstance(x, str):
        return text(fn, name, x, nul=True)
    if isinstance(x, (list, tuple, range, np.ndarray)):
        return int_list(fn, name, x, *INT32)
    raise type_error(fn, name, "a str or a list of token ids", x,
                     "decode bytes first, e.g. .decode('utf-8')" if isinstance(x, (bytes, bytearray)) else "")
