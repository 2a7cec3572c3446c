"""A real headless Chromium, driven over the DevTools protocol on a pipe (stdlib only): load a page, read what it shows.

Chromium is started the way a CI machine can run it (--headless --no-sandbox ...) with
--remote-debugging-pipe: the protocol's JSON messages, NUL-terminated, on fds 3 (to Chromium) and 4
(from it). Everything the page logs — console errors, uncaught exceptions, a blocked load, a
Content-Security-Policy violation — arrives as an event and is kept in `errors`.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


class Browser:
    """One Chromium process; close() ends it (by its PID)."""

    def __init__(self, binary: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="dd-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire() -> None:  # in the child: the protocol's fds where Chromium expects them
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
                                      "about:blank"], preexec_fn=wire, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        try:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_chrome], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise ConnectionError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._receive(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str, session: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
            self.events.append(self._receive(deadline))

    def open(self, path: Path) -> "Page":
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.events.clear()
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        self.wait_for("Page.loadEventFired", session, self.timeout)
        return Page(self, session)


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def evaluate(self, expression: str) -> Any:
        result = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                   session=self.session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"the page's script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Everything the page reported as an error: console errors, exceptions, log entries at error level."""
        self.evaluate("1")  # a round trip: events that came before it are in
        out = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            params = event.get("params") or {}
            if event.get("method") == "Runtime.exceptionThrown":
                out.append(f"exception: {params.get('exceptionDetails')}")
            elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(f"console.{params.get('type')}: {params.get('args')}")
            elif event.get("method") == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
                out.append(f"log: {params['entry'].get('text')} ({params['entry'].get('url', '')})")
        return out

    def screenshot(self, path: Path, width: int, height: int) -> None:
        import base64

        self.browser.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                                 "deviceScaleFactor": 1, "mobile": False},
                          session=self.session)
        data = self.browser.call("Page.captureScreenshot", {"format": "png"}, session=self.session)["data"]
        path.write_bytes(base64.b64decode(data))


# Chrome's own reader of the Trace Event Format: the trace engine of DevTools' Performance panel,
# shipped inside Chromium (devtools://devtools/bundled/models/trace/trace.js). Loading a trace.json
# with it is what "Load profile" in the Performance panel does; Perfetto UI needs the network.
_MODEL_JS = """(async () => {
  const Trace = await import("./models/trace/trace.js");
  const doc = JSON.parse(%s);
  const model = Trace.TraceModel.Model.createWithAllHandlers();
  await model.parse(doc.traceEvents, {metadata: {}, isFreshRecording: false});
  const data = model.parsedTrace(0).data;
  const threads = [];
  for (const [pid, proc] of data.Renderer.processes) {
    for (const [tid, thread] of proc.threads) {
      threads.push({pid, tid, name: thread.name, entries: (thread.entries || []).map(e => [e.name, e.ts, e.dur || 0])});
    }
  }
  return JSON.stringify({
    processes: [...data.Meta.processNames.entries()].map(([pid, e]) => [pid, e.args.name]),
    threads,
    flows: data.Flows.flows.map(flow => flow.map(e => [e.pid, e.tid, e.name])),
    bounds: data.Meta.traceBounds,
  });
})()"""


def devtools_model(browser: Browser, trace_text: str) -> dict[str, Any]:
    """What Chrome's DevTools trace engine reads from a trace: processes, threads with their entries, flows."""
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    browser.call("Page.enable", session=session)
    browser.call("Runtime.enable", session=session)
    browser.events.clear()
    browser.call("Page.navigate", {"url": "devtools://devtools/bundled/trace_app.html"}, session=session)
    browser.wait_for("Page.loadEventFired", session, browser.timeout)
    result = browser.call("Runtime.evaluate", {"expression": _MODEL_JS % json.dumps(trace_text), "awaitPromise": True,
                                               "returnByValue": True}, session=session)
    if "exceptionDetails" in result:
        raise RuntimeError(f"DevTools' trace engine failed on the trace: {result['exceptionDetails']}")
    return json.loads(result["result"]["value"])
