"""A headless Chromium driven over the Chrome DevTools Protocol on a pipe, for the report tests.

``--remote-debugging-pipe`` makes Chromium read CDP commands from file descriptor 3 and write
replies and events to descriptor 4, each message JSON ending in a NUL byte: no websocket, no
driver binary, no port. ``load_page`` opens a file, waits for its load event and for a
condition to hold, and returns the page's console errors and uncaught exceptions together with
whatever a JavaScript expression evaluates to.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: Environment variable that names the Chromium binary (default: ``chromium`` on PATH).
CHROMIUM_ENV = "BATCHSIM_CHROMIUM"


def find_chromium() -> str | None:
    """The Chromium executable, or ``None`` when it is not installed."""
    return os.environ.get(CHROMIUM_ENV) or shutil.which("chromium") or shutil.which(
        "chromium-browser")


class Browser:
    """One headless Chromium process and its CDP pipe."""

    def __init__(self, exe: str) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        self._dir = tempfile.mkdtemp(prefix="batchsim-chromium-")

        def wire() -> None:  # in the child: the pipe ends Chromium expects as fds 3 and 4
            # through fresh copies: dup2 onto itself (a pipe end already numbered 3) would keep
            # its close-on-exec flag
            read_end, write_end = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
             "--disable-extensions", "--disable-background-networking", "--mute-audio",
             "--remote-debugging-pipe", f"--user-data-dir={self._dir}",
             "--window-size=1300,900", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log(),
            preexec_fn=wire, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _log(self) -> Any:
        """Chromium's stderr, kept for the error message when it dies."""
        self._stderr = open(Path(self._dir) / "stderr.log", "wb")
        return self._stderr

    def _died(self) -> str:
        self._stderr.flush()
        tail = (Path(self._dir) / "stderr.log").read_bytes()[-1500:].decode(errors="replace")
        return f"chromium exited with code {self.proc.poll()}: {tail}"

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        q = self._replies.setdefault(msg["id"], queue.Queue())
                    q.put(msg)
                else:
                    self.events.put(msg)

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
        """Send one CDP command and wait for its result (raises on a CDP error)."""
        with self._lock:
            self._next_id += 1
            mid = self._next_id
            q = self._replies.setdefault(mid, queue.Queue())
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
            reply = q.get(timeout=timeout_s)
        except (OSError, queue.Empty):
            if self.proc.poll() is not None:
                raise RuntimeError(self._died()) from None
            raise RuntimeError(f"CDP {method}: no reply within {timeout_s:g} s") from None
        if "error" in reply:
            raise RuntimeError(f"CDP {method}: {reply['error']}")
        return dict(reply.get("result", {}))

    def close(self) -> None:
        """Close the browser (politely, then by force) and remove its profile folder."""
        try:
            self.send("Browser.close", timeout_s=5)
        except Exception:  # noqa: BLE001 - already gone or hung: killed below
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        self._stderr.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _problems(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, failed asserts, uncaught exceptions and error log entries."""
    out = []
    for ev in events:
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("exception: " + str(d.get("exception", {}).get("description")
                                           or d.get("text")))
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console.error: " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log: " + str(p["entry"].get("text")))
    return out


def load_page(path: Path, expression: str, ready: str = "true", timeout_s: float = 60.0,
              ready_timeout_s: float = 3.0) -> tuple[list[str], Any]:
    """Open ``path`` in headless Chromium; once loaded (within ``timeout_s``) and ``ready`` (a
    JS expression) is true — or ``ready_timeout_s`` after the load event, for a page that
    never gets ready — evaluate ``expression`` (JSON-serializable result). Returns (console
    errors and uncaught exceptions, the value)."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("chromium not found")
    browser = Browser(exe)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget",
                               {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        loaded = False
        while not loaded:
            try:
                ev = browser.events.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{path}: no load event within {timeout_s:g} s") from None
            events.append(ev)
            loaded = ev.get("method") == "Page.loadEventFired"

        def evaluate(expr: str) -> Any:
            res = browser.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                                    "awaitPromise": True}, session=session)
            if "exceptionDetails" in res:
                raise RuntimeError(f"evaluating {expr[:60]}: {res['exceptionDetails']}")
            return res["result"].get("value")

        settle = time.monotonic() + ready_timeout_s
        while not evaluate(ready) and time.monotonic() < settle:
            time.sleep(0.1)
        value = evaluate(expression)
        time.sleep(0.2)  # let late console messages arrive
        while not browser.events.empty():
            events.append(browser.events.get())
        return _problems(events), value
    finally:
        browser.close()
