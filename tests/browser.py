"""Drive a real headless Chromium over the DevTools protocol (aiohttp WebSocket).

`Chromium` starts the browser with a fresh profile and `--remote-debugging-port=0`,
reads the port it picked from `DevToolsActivePort`, attaches to its page and
collects what a person would see go wrong: uncaught exceptions, console errors,
dialogs (`alert`) and every URL the page requested.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from .waiting import START_S, real_clock_env

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
)


def find_chromium() -> str | None:
    """$CHROMIUM, else the first Chromium or Chrome on PATH."""
    if path := os.environ.get("CHROMIUM"):
        return path
    names = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    return next((found for name in names if (found := shutil.which(name))), None)


class Chromium:
    """`async with Chromium(binary) as page:` a page ready for `open`, `evaluate`, `screenshot`."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000, flags: tuple[str, ...] = ()) -> None:
        self.binary, self.width, self.height, self.flags = binary, width, height, flags
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.requested: list[str] = []
        self.paused: asyncio.Queue[str] = asyncio.Queue()  # requests `hold` stopped (Fetch.requestPaused)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._loaded = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._reader: asyncio.Task | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    async def __aenter__(self) -> Chromium:
        self._profile = tempfile.mkdtemp(prefix="llmtap-chromium-")
        self._process = await asyncio.create_subprocess_exec(
            self.binary, *FLAGS, *self.flags, f"--user-data-dir={self._profile}",
            f"--window-size={self.width},{self.height}", "about:blank",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True, env=real_clock_env(),
        )  # fmt: skip
        self._session = aiohttp.ClientSession()
        try:
            await self._connect(await self._port())
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._reader:
            self._reader.cancel()
        if self._ws:
            await self._ws.close()
        await self._session.close()
        await self._stop_process()

    async def _port(self) -> int:
        """The port Chromium chose, from the file it writes once it listens."""
        port_file = Path(self._profile) / "DevToolsActivePort"
        for _ in range(int(START_S / 0.05)):
            if port_file.exists() and (text := port_file.read_text().split()):
                return int(text[0])
            if self._process.returncode is not None:
                raise RuntimeError(f"chromium exited with {self._process.returncode}")
            await asyncio.sleep(0.05)
        raise TimeoutError(f"chromium did not open its DevTools port within {START_S:g} s")

    async def _connect(self, port: int) -> None:
        for _ in range(100):
            async with self._session.get(f"http://127.0.0.1:{port}/json/list") as response:
                pages = [t for t in await response.json() if t["type"] == "page"]
            if pages:
                break
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError("chromium opened no page within 5 s")
        self._ws = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log", "Network"):
            await self.send(f"{domain}.enable")

    async def _stop_process(self) -> None:
        if self._process.returncode is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._process.wait(), 5)
            except TimeoutError:
                os.killpg(self._process.pid, signal.SIGKILL)
                await self._process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        future = self._pending[message_id] = asyncio.get_running_loop().create_future()
        await self._ws.send_json({"id": message_id, "method": method, "params": params})
        reply = await asyncio.wait_for(future, 15)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def _read(self) -> None:
        async for message in self._ws:
            data = message.json()
            if "id" in data and data["id"] in self._pending:
                self._pending.pop(data["id"]).set_result(data)
            else:
                await self._on_event(data.get("method", ""), data.get("params", {}))

    async def _on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self._loaded.set()
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])
        elif method == "Fetch.requestPaused":
            self.paused.put_nowait(params["requestId"])
        elif method == "Network.requestWillBeSent":
            self.requested.append(params["request"]["url"])
        elif method == "Page.javascriptDialogOpening":
            self.dialogs.append(params["message"])
            task = asyncio.create_task(self.send("Page.handleJavaScriptDialog", accept=True))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def open(self, url: str) -> None:
        self._loaded.clear()
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(self._loaded.wait(), 15)

    async def hold(self, pattern: str) -> None:
        """From now on requests whose URL matches `pattern` (CDP's wildcards) wait until `release`d."""
        await self.send("Fetch.enable", patterns=[{"urlPattern": pattern}])

    async def held(self, timeout: float = 10) -> str:
        """The id of the next request `hold` stopped."""
        return await asyncio.wait_for(self.paused.get(), timeout)

    async def release(self, request_id: str) -> None:
        """Let a held request go on, and stop holding new ones."""
        await self.send("Fetch.continueRequest", requestId=request_id)
        await self.send("Fetch.disable")

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluate failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 10) -> Any:
        """Poll until `expression` is truthy; return its value."""
        async with asyncio.timeout(timeout):
            while not (value := await self.evaluate(expression)):
                await asyncio.sleep(0.05)
        return value

    async def resize(self, width: int, height: int) -> None:
        """Emulate a window of this size (fires the page's resize event)."""
        await self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                        deviceScaleFactor=1, mobile=False)

    async def press(self, key: str, code: int, shift: bool = False) -> None:
        """A key pressed and released, as the keyboard sends it (Tab: "Tab", 9; Enter: "Enter", 13)."""
        params = {"key": key, "code": key, "windowsVirtualKeyCode": code, "modifiers": 8 if shift else 0}
        text = {"Enter": "\r", " ": " "}.get(key)
        await self.send("Input.dispatchKeyEvent", type="keyDown" if text else "rawKeyDown",
                        **({"text": text} if text else {}), **params)
        await self.send("Input.dispatchKeyEvent", type="keyUp", **params)

    async def mouse_move(self, x: float, y: float) -> None:
        await self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    async def screenshot(self, path: Path, full_page: bool = True) -> None:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            size = await self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
        result = await self.send("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(result["data"]))
