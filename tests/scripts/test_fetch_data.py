#!/usr/bin/env python3
"""Tests of scripts/fetch_data.py's R lazy-load extractor on tiny hand-serialized R objects
(run by numattn_tests through tests/model/data_test.cpp, or directly: python3 this_file)."""

import gzip
import os
import struct
import sys
import unittest
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import fetch_data as fd  # noqa: E402


# ---- a minimal R XDR serializer (version 3), written from the format description ----------

def i32(v):
    return struct.pack(">i", v)


def flags(t, attr=False, tag=False, levels=0):
    return i32(t | (fd.HAS_ATTR if attr else 0) | (fd.HAS_TAG if tag else 0) | (levels << 12))


def charsxp(s):
    if s is None:
        return flags(fd.CHARSXP) + i32(-1)
    b = s.encode("utf-8")
    return flags(fd.CHARSXP, levels=8) + i32(len(b)) + b  # 8 = UTF8_MASK


class Ser:
    """Tracks symbols so that a repeated symbol is written as a REFSXP, as R does."""

    def __init__(self):
        self.syms = {}

    def symbol(self, name):
        if name in self.syms:
            return i32((self.syms[name] << 8) | fd.REFSXP)
        self.syms[name] = len(self.syms) + 1
        return flags(fd.SYMSXP) + charsxp(name)

    def attrs(self, pairs):
        out = b""
        for tag, value in pairs:
            out += flags(fd.LISTSXP, tag=True) + self.symbol(tag) + value
        return out + i32(fd.NILVALUE_SXP)

    def strsxp(self, items, names=None, extra_attrs=()):
        pairs = list(extra_attrs)
        if names is not None:
            pairs.append(("names", self.strsxp(names)))
        body = flags(fd.STRSXP, attr=bool(pairs)) + i32(len(items)) + b"".join(charsxp(s) for s in items)
        return body + (self.attrs(pairs) if pairs else b"")

    def intsxp(self, vals):
        return flags(fd.INTSXP) + i32(len(vals)) + b"".join(i32(v) for v in vals)

    def vecsxp(self, items, names=None):
        body = flags(fd.VECSXP, attr=names is not None) + i32(len(items)) + b"".join(items)
        return body + (self.attrs([("names", self.strsxp(names))]) if names is not None else b"")


def header():
    return b"X\n" + i32(3) + i32(0x040201) + i32(0x030500) + i32(5) + b"UTF-8"


def record(payload):
    return struct.pack(">I", len(payload)) + zlib.compress(payload)


def make_db(books):
    """An (rdb, rdx) pair holding `books` (name -> list of lines) like R's lazy-load data."""
    rdb = b""
    positions = {}
    for name, lines in books.items():
        s = Ser()
        rec = record(header() + s.strsxp(lines))
        positions[name] = (len(rdb), len(rec))
        rdb += rec
    s = Ser()
    variables = s.vecsxp([s.intsxp(list(positions[n])) for n in books], names=list(books))
    index = s.vecsxp([variables, s.vecsxp([]), flags(fd.LGLSXP) + i32(1) + i32(1)],
                     names=["variables", "references", "compressed"])
    return rdb, gzip.compress(header() + index)


class ExtractorTest(unittest.TestCase):
    def test_unserialize_character_vector_with_na_and_attributes(self):
        s = Ser()
        obj = fd.unserialize(header() + s.strsxp(["a", None, "é"], names=["x", "y", "z"],
                                                 extra_attrs=[("class", s.strsxp(["foo"]))]))
        self.assertEqual(obj.type, fd.STRSXP)
        self.assertEqual(obj.value, ["a", None, "é"])
        self.assertEqual(obj.attrs["names"].value, ["x", "y", "z"])
        self.assertEqual(obj.attrs["class"].value, ["foo"])
        self.assertEqual(fd.character_vector(obj, "v"), ["a", "", "é"])

    def test_extract_books_in_requested_order(self):
        books = {"emma": ["EMMA", "", "By Jane Austen"], "persuasion": ["PERSUASION", "line 2"]}
        rdb, rdx = make_db(books)
        index = fd.lazyload_index(rdx)
        self.assertEqual(sorted(index), ["emma", "persuasion"])
        text = fd.extract_books(rdb, rdx, books=["persuasion", "emma"])
        self.assertEqual(text, "PERSUASION\nline 2\nEMMA\n\nBy Jane Austen\n")

    def test_missing_book_and_corrupt_records_raise(self):
        rdb, rdx = make_db({"emma": ["a"]})
        with self.assertRaises(fd.RFormatError):
            fd.extract_books(rdb, rdx, books=["mansfieldpark"])
        with self.assertRaises(fd.RFormatError):
            fd.read_rdb_record(rdb, 0, len(rdb) + 1)
        # A declared vector length far beyond the data is refused before allocating.
        bad = header() + flags(fd.STRSXP) + i32(2_000_000_000)
        with self.assertRaises(fd.RFormatError):
            fd.unserialize(bad)
        with self.assertRaises(fd.RFormatError):
            fd.unserialize(header() + flags(fd.CHARSXP) + i32(100) + b"short")
        with self.assertRaises(fd.RFormatError):
            fd.unserialize(b"A\n" + header()[2:])
        with self.assertRaises(fd.RFormatError):
            fd.unserialize(header() + i32(fd.REFSXP | (7 << 8)))  # dangling reference

    def test_real_cached_text_when_present(self):
        cache = os.environ.get("NUMATTN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "numattn")
        path = os.path.join(cache, fd.TEXT_FILE)
        if not os.path.exists(path):
            self.skipTest(f"{path} not cached (run scripts/fetch_data.sh)")
        self.assertEqual(os.path.getsize(path), 4025029)
        self.assertEqual(fd.sha256_file(path), fd.TEXT_SHA256)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.assertTrue(text.startswith("SENSE AND SENSIBILITY\n"))
        order = [text.find(t) for t in ("PRIDE AND PREJUDICE", "MANSFIELD PARK", "EMMA",
                                        "NORTHANGER ABBEY", "\nPersuasion\n")]
        self.assertTrue(all(o > 0 for o in order), order)
        self.assertEqual(order, sorted(order))


if __name__ == "__main__":
    unittest.main()
