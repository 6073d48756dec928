"""A page opened in a real headless Chromium, driven through the DevTools protocol over
``--remote-debugging-pipe`` (JSON messages ended by NUL on fds 3 and 4: no websocket, no
library; by hand because that is all it takes). ``open_page`` loads a file and returns what
the page said (console errors, exceptions, log entries such as a blocked fetch), a screenshot
and the values of expressions evaluated in it.
"""

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",  # as root in a container
    "--disable-gpu",
    "--no-first-run",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


class Browser:
    """One Chromium process; ``call`` sends a command and returns its result, keeping the
    events that arrive meanwhile in ``events``."""

    def __init__(self, timeout_s: float = 60.0):
        self.profile = tempfile.TemporaryDirectory(prefix="tfgpu-chromium-")
        # fd 3: what Chromium reads (our stdin pipe), fd 4: what it writes (our stdout pipe).
        shell = 'exec "$@" 3<&0 4>&1 0</dev/null 1>/dev/null'
        argv = [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile.name}", "about:blank"]
        self.proc = subprocess.Popen(
            ["sh", "-c", shell, "sh", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.timeout_s, self.events, self._buffer, self._id = timeout_s, [], b"", 0

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.proc.stdin.write(json.dumps(message).encode() + b"\0")
        self.proc.stdin.flush()
        while True:
            reply = self._next()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        """The first event ``method`` (already received, or the next ones)."""
        while True:
            found = next((e for e in self.events if e.get("method") == method), None)
            if found:
                return found
            self.events.append(self._next())

    def drain(self, seconds: float) -> None:
        """Keeps the events that arrive within ``seconds``."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([self.proc.stdout], [], [], end - time.monotonic())[0]:
                self.events.append(self._next())

    def _next(self) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not chunk:
                raise ConnectionError(f"Chromium ended (exit {self.proc.wait()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (OSError, RuntimeError, TimeoutError, ConnectionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.profile.cleanup()


def open_page(path: str, expressions: dict, width: int = 1280, height: int = 900) -> dict:
    """Loads file ``path`` in a fresh headless Chromium; returns {"errors": [what the page
    reported as an error: console errors, uncaught exceptions, error log entries],
    "png": a screenshot of the first ``width`` x ``height`` pixels (bytes), name: the value of
    each of ``expressions`` ({name: JavaScript expression}) evaluated in the page}."""
    browser = Browser()
    try:
        target = browser.call("Target.createTarget", url="about:blank")["targetId"]
        session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable", session)
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        browser.call("Page.navigate", session, url=f"file://{os.path.abspath(path)}")
        browser.wait_for("Page.loadEventFired")
        browser.drain(0.5)  # what the page says just after it loaded
        shot = browser.call("Page.captureScreenshot", session, format="png")
        out = {"errors": _errors(browser.events), "png": base64.b64decode(shot["data"])}
        for name, expression in expressions.items():
            result = browser.call(
                "Runtime.evaluate", session, expression=expression, returnByValue=True
            )
            if "exceptionDetails" in result:
                raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
            out[name] = result["result"].get("value")
        return out
    finally:
        browser.close()


def _errors(events: list) -> list[str]:
    found = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append(f"console: {params.get('args')}")
        elif method == "Runtime.exceptionThrown":
            found.append(f"exception: {params.get('exceptionDetails')}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
    return found
