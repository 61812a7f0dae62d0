#!/usr/bin/python3
"""Opens a `numattn report` index.html in headless Chromium and checks that it rendered.

    browser_check.py --numattn build/bin/numattn --work DIR [--screenshot PNG]   # builds a tiny report first
    browser_check.py --report DIR [--screenshot PNG]                             # checks an existing one

Talks to Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe: fd 3 carries our
commands, fd 4 its answers and events, each message JSON ended by a NUL byte). Checks:
  - the page loads and every <img class="plot"> decodes, with natural size > 0;
  - their number equals the page's <meta name="numattn-plots">, the PNGs in DIR/plots/ and the
    plots expected from the steps that succeeded (DIR/data/steps.json);
  - each plot's area of a full-page screenshot is not blank (at least 1% of its pixels are not
    the background colour);
  - no console error, uncaught exception or failed load was logged.
Exits 0 when all hold, 1 when one does not, 77 (ctest SKIP_RETURN_CODE) when Chromium,
matplotlib or the default model is missing.
"""
import argparse
import io
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def fail(why):
    print(f"FAIL: {why}")
    sys.exit(1)


class DevTools:
    """A Chromium process driven over --remote-debugging-pipe."""

    def __init__(self, chromium, profile_dir, timeout):
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()

        def child_fds():  # the browser reads fd 3 and writes fd 4
            # Through fresh copies: a pipe end may itself be fd 3 or 4 (dup2 onto itself would
            # keep its close-on-exec flag, and the first dup2 could overwrite the second source).
            r, w = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        args = [chromium, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--remote-debugging-pipe", f"--user-data-dir={profile_dir}", "--hide-scrollbars",
                "--window-size=1280,1000"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        args.append("about:blank")
        self.proc = subprocess.Popen(args, preexec_fn=child_fds, close_fds=False, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(profile_dir, "chromium.log"), "wb"))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.timeout = timeout
        self.next_id = 0
        self.buf = b""
        self.events = []

    def _read_message(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                fail("Chromium did not answer in time")
            ready, _, _ = select.select([self.from_browser], [], [], left)
            if ready:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    fail("Chromium closed the DevTools pipe (see chromium.log in the work directory)")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    fail(f"DevTools {method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method, session):
        deadline = time.monotonic() + self.timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method and e.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            m = self._read_message(deadline)
            if m.get("method") == method and m.get("sessionId") == session:
                return m
            self.events.append(m)

    def drain(self, seconds):
        """Collects events for a while (late console messages)."""
        deadline = time.monotonic() + seconds
        while True:
            ready, _, _ = select.select([self.from_browser], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                break
            self.buf += chunk
            while b"\0" in self.buf:
                msg, self.buf = self.buf.split(b"\0", 1)
                self.events.append(json.loads(msg))

    def close(self):
        try:
            self.call("Browser.close")
        except SystemExit:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def console_errors(events):
    errs = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errs.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description", "")))
                                                              for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            errs.append("exception: " + d.get("text", "") + " " + str(d.get("exception", {}).get("description", "")))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errs.append("log: " + p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
    return errs


def expected_plots(report_dir):
    """The plots report_plots.py draws for the steps that succeeded: two per input kind of the
    benchmark (time, memory), one for the perplexity table, two for analyze (spectra, panels), two
    for the long-context section."""
    with open(os.path.join(report_dir, "data", "steps.json"), encoding="utf-8") as f:
        steps = json.load(f)["steps"]
    ok = {s["id"] for s in steps if s["status"] == "ok"}
    n = 0
    n += 2 * ("bench_gaussian" in ok) + 2 * ("bench_spiky" in ok)
    n += 2 * any(i.startswith("bench_captured_") for i in ok)
    n += any(i.startswith("ppl_") and i != "ppl_exact.flash" for i in ok)
    n += 2 * ("analyze" in ok)
    # Long context: time and error against N, and KL against throughput in the model.
    n += any(i.startswith("long_bench_") for i in ok)
    n += any((i.startswith("long_ppl_") and i != "long_ppl_exact.flash") or i.startswith("long_auto_") for i in ok)
    return n


def build_tiny_report(numattn, work):
    """The smallest report that has every section: tiny shapes, one layer, one short chunk."""
    out = os.path.join(work, "report")
    quick = os.environ.get("NUMATTN_TEST_QUICK") == "1"  # the sanitizer pass: fewer methods
    ppl = "sparse.window" if quick else "exact.naive,sparse.window"
    cmd = [numattn, "report", "--model", "default", "--text", "default", "--out", out, "--no-progress",
           "--threads", "2", "--n", "64,128", "--heads", "2", "--d", "16", "--tokens", "64", "--layers", "0",
           "--reps", "1", "--check-rows", "16", "--gemm-size", "128", "--ctx", "64", "--chunks", "1",
           "--ppl-methods", ppl, "--bd-setups", "mha768", "--bd-seeds", "1",
           "--bd-tokens", "16", "--mla-ranks", "32", "--analyze-tokens", "48", "--analyze-layers", "0",
           "--long-n", "64,128", "--long-ctx", "128",
           "--long-methods", "sparse.window(left=32,sinks=4),sparse.topk(k=32,select=block)"]
    if quick:
        cmd += ["--bench-methods", "exact.flash,exact.naive,lowrank.nystrom,kernel.performer,sparse.window"]
    print("building the report:", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    print(r.stderr[-3000:])
    if r.returncode != 0:
        fail(f"numattn report exited {r.returncode}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--numattn", help="the numattn executable (builds a tiny report in --work)")
    ap.add_argument("--work", help="scratch directory for the tiny report and the browser profile")
    ap.add_argument("--report", help="check this report directory instead of building one")
    ap.add_argument("--screenshot", help="where to write the full-page screenshot (PNG)")
    ap.add_argument("--timeout", type=float, default=60, help="seconds for each DevTools answer")
    args = ap.parse_args()

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        skip("no chromium on PATH (Debian's chromium package; scripts/setup.sh installs it)")
    try:
        import matplotlib.image  # also what reads the screenshot back
        import numpy as np
    except ImportError as e:
        skip(f"matplotlib is missing ({e}; Debian's python3-matplotlib)")

    work = args.work or tempfile.mkdtemp(prefix="numattn-browser-")
    os.makedirs(work, exist_ok=True)
    if args.report:
        report = args.report
    else:
        if not args.numattn:
            fail("give --numattn (build a tiny report) or --report DIR")
        cache = os.environ.get("NUMATTN_CACHE", os.path.expanduser("~/.cache/numattn"))
        if not os.path.isfile(os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf")):
            skip(f"default model not cached in {cache} (scripts/fetch_data.sh)")
        report = build_tiny_report(args.numattn, work)
    index = os.path.abspath(os.path.join(report, "index.html"))
    if not os.path.isfile(index):
        fail(f"{index} does not exist")
    want = expected_plots(report)
    pngs = sorted(f for f in os.listdir(os.path.join(report, "plots")) if f.endswith(".png"))

    profile = tempfile.mkdtemp(prefix="profile-", dir=work)
    dt = DevTools(chromium, profile, args.timeout)
    try:
        target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for m in ("Runtime.enable", "Log.enable", "Page.enable"):
            dt.call(m, session=session)
        dt.call("Emulation.setDeviceMetricsOverride",
                {"width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session=session)
        dt.call("Page.navigate", {"url": "file://" + index}, session=session)
        dt.wait_event("Page.loadEventFired", session)
        js = """(async () => {
          const imgs = [...document.querySelectorAll('img.plot')];
          const decoded = await Promise.all(imgs.map(i => i.decode().then(() => true, () => false)));
          const meta = document.querySelector('meta[name="numattn-plots"]');
          return {meta: meta ? Number(meta.content) : -1, title: document.title,
                  imgs: imgs.map((i, k) => { const r = i.getBoundingClientRect();
                    return {name: i.dataset.plot, decoded: decoded[k], w: i.naturalWidth, h: i.naturalHeight,
                            x: r.left + window.scrollX, y: r.top + window.scrollY, cw: r.width, ch: r.height}; })};
        })()"""
        res = dt.call("Runtime.evaluate", {"expression": js, "awaitPromise": True, "returnByValue": True},
                      session=session)
        if "exceptionDetails" in res:
            fail(f"page script failed: {res['exceptionDetails']}")
        page = res["result"]["value"]
        size = dt.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        width, height = int(size["width"]), int(size["height"])
        shot = dt.call("Page.captureScreenshot",
                       {"format": "png", "captureBeyondViewport": True,
                        "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}}, session=session)
        dt.drain(0.5)
        errors = console_errors(dt.events)
    finally:
        dt.close()

    import base64
    png = base64.b64decode(shot["data"])
    if args.screenshot:
        os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
        with open(args.screenshot, "wb") as f:
            f.write(png)
    img = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]
    print(f"page '{page['title']}': {width}x{height} px, {len(page['imgs'])} plots "
          f"(meta {page['meta']}, {len(pngs)} PNG files, {want} expected from the steps)")
    problems = []
    if not (len(page["imgs"]) == page["meta"] == len(pngs) == want) or want == 0:
        problems.append(f"plot count: page {len(page['imgs'])}, meta {page['meta']}, files {len(pngs)}, "
                        f"expected {want}")
    for p in page["imgs"]:
        x0, y0 = max(0, int(p["x"])), max(0, int(p["y"]))
        x1, y1 = min(img.shape[1], int(p["x"] + p["cw"])), min(img.shape[0], int(p["y"] + p["ch"]))
        crop = img[y0:y1, x0:x1]
        if not p["decoded"] or p["w"] == 0 or p["h"] == 0 or crop.size == 0:
            problems.append(f"{p['name']}: not rendered (decoded {p['decoded']}, {p['w']}x{p['h']})")
            continue
        # Inside the image's CSS border. Background: its most common colour; ink: pixels away from it.
        crop = crop[2:-2, 2:-2] if min(crop.shape[:2]) > 8 else crop
        colours, counts = np.unique((crop * 255).round().reshape(-1, 3), axis=0, return_counts=True)
        bg = colours[counts.argmax()] / 255.0
        ink = float(np.mean(np.abs(crop - bg).max(axis=2) > 0.1))
        print(f"  {p['name']}: {p['w']}x{p['h']} px, shown {int(p['cw'])}x{int(p['ch'])}, ink {ink:.1%}")
        if ink < 0.01:
            problems.append(f"{p['name']}: blank ({ink:.2%} of its pixels differ from the background)")
    print(f"console errors: {len(errors)}")
    for e in errors:
        print("  " + e)
        problems.append(e)
    if problems:
        fail("; ".join(problems))
    print("OK: every plot rendered, no console error" + (f"; screenshot {args.screenshot}" if args.screenshot else ""))


if __name__ == "__main__":
    main()
