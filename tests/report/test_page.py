"""report/page.py: the page of a real tiny quickstart, opened from the file system in a real headless Chromium
(Debian's package, which `.ci/run` installs), driven through the Chrome DevTools protocol: every picture loads,
the console stays clean, nothing is fetched from the network; a screenshot is kept with the test output."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from memdpc.common.errors import UserError
from memdpc.preprocess.archive import archive_path, write_archive
from memdpc.report.page import PAGE, find, write_report
from memdpc.report.tables import cell_text, metric_text

from ..conftest import run_memdpc, tars_opened

ARTIFACTS_ENV = "MEMDPC_TEST_ARTIFACTS"  # a folder where tests keep what a person may want to look at

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# headless, and nothing that reaches out to the network on its own (this machine has none)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
WIDTH = 1280


class Browser:
    """Chromium with the DevTools protocol on a pipe (``--remote-debugging-pipe``: commands on its fd 3, replies
    and events on its fd 4, JSON messages ending in NUL), one page attached."""

    def __init__(self, profile: Path) -> None:
        to_browser, self._commands = os.pipe()
        self._replies, from_browser = os.pipe()

        def fds() -> None:  # in the child: the pipe ends where Chromium expects them
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
            pass_fds=(3, 4),
            preexec_fn=fds,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._id, self.events = b"", 0, []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=self.session)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._replies], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "Chromium did not answer in time"
            chunk = os.read(self._replies, 1 << 20)
            assert chunk, "Chromium closed the pipe"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _until(self, done, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            message = self._message(deadline)
            if done(message):
                return message
            self.events.append(message)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        message = {
            "id": self._id,
            "method": method,
            "params": params or {},
            **({"sessionId": session} if session else {}),
        }
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        reply = self._until(lambda m: m.get("id") == self._id)
        assert "error" not in reply, reply
        return reply["result"]

    def open(self, url: str) -> None:
        """Load ``url`` in the page, until its load event (every picture loaded or failed)."""
        self.events.clear()
        self.call("Page.navigate", {"url": url}, session=self.session)
        self._until(lambda m: m.get("method") == "Page.loadEventFired")

    def evaluate(self, expression: str):
        return self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=self.session
        )["result"]["value"]

    def errors(self) -> list[str]:
        """The console's errors and the page's exceptions and failed loads since :meth:`open`."""
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(f"console.{params['type']}: {params['args']}")
            elif method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"{params['entry']['text']} ({params['entry'].get('url')})")
        return found

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def screenshot(self, path: Path) -> Path:
        """The whole page, ``WIDTH`` wide, as PNG."""
        height = self.call("Page.getLayoutMetrics", session=self.session)["cssContentSize"]["height"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": int(min(height, 16000)), "deviceScaleFactor": 1, "mobile": False},
            session=self.session,
        )
        data = self.call("Page.captureScreenshot", {"format": "png"}, session=self.session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.close(self._commands)
            os.close(self._replies)


@pytest.fixture
def browser(tmp_path):
    if CHROMIUM is None:
        pytest.skip(
            "no chromium on PATH: .ci/run installs Debian's chromium package (apt-get install chromium); "
            "without it, this test cannot open the page in a real browser"
        )
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


def _sha(path: Path) -> str:
    """The first 12 hex digits of the SHA-256 of ``path``, as the page shows a recorded digest."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


IMAGES = "JSON.stringify(Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth]))"


def check_page(browser: Browser, page: Path) -> list[list]:
    """Open ``page`` from the file system; every picture loaded, no console error, nothing but local files read.
    Returns the pictures as [src, complete, naturalWidth]."""
    browser.open(page.resolve().as_uri())
    images = json.loads(browser.evaluate(IMAGES))
    assert images and all(complete and width > 0 for _, complete, width in images), images
    assert browser.errors() == []
    assert all(url.startswith(("file://", "data:")) for url in browser.requests()), browser.requests()
    return images


@pytest.mark.slow
def test_the_quickstart_page_opens_from_the_file_system_with_every_picture(
    tiny_quickstart, browser, tmp_path
):
    page = tiny_quickstart / "report" / PAGE  # written by the quickstart itself
    images = check_page(browser, page)
    on_disk = {
        p.relative_to(page.parent).as_posix() for p in page.parent.rglob("*") if p.suffix in (".png", ".gif")
    }
    assert {src for src, _, _ in images} == on_disk  # every picture drawn is on the page, once
    headings = browser.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
    assert headings == [
        "Results",
        "Provenance",
        "Training",
        "Sample clips",
        "Retrieval",
        "Confusion matrices",
    ]
    chains = browser.evaluate("Array.from(document.querySelectorAll('h3')).map(h => h.textContent)")
    for stream in ("rgb", "flow"):  # each checkpoint's chain, from its index to its results
        assert (
            f"runs/{stream}/checkpoints/best.pt" in chains
            and f"runs/random-{stream}/checkpoints/init.pt" in chains
        )
    text = browser.evaluate("document.body.innerText")
    best = tiny_quickstart / "runs" / "rgb" / "checkpoints" / "best.pt"
    chain = browser.evaluate(  # the table under the heading of the rgb run's checkpoint
        "Array.from(document.querySelectorAll('h3')).find(h => h.textContent == 'runs/rgb/checkpoints/best.pt')"
        ".nextElementSibling.innerText"
    )
    for line in (
        f"index\tindex.jsonl\t15 videos: 6 train, 3 val, 6 test\t{_sha(tiny_quickstart / 'index.jsonl')}\tas recorded",
        "shards\tshards/rgb/manifest-val.json\tvalidated on: rgb/val, 3 videos",
        "run\truns/rgb\tmemdpc_r18, rgb stream",
        "checkpoint\truns/rgb/checkpoints/best.pt\ttrained: step",
        "result\teval/memdpc-rgb/retrieval-rgb.json\tretrieval, rgb, on test, R@1",
    ):
        assert line in chain, (line, chain)
    assert _sha(best) in chain
    for row in json.loads((tiny_quickstart / "quickstart.json").read_text()):  # the quickstart's table
        assert "\t".join(cell_text(v) for k, v in row.items() if k != "note") in text
    for row in json.loads((tiny_quickstart / "quickstart-pretext.json").read_text()):  # its pretext table
        assert "\t".join(str(v) for v in row.values()) in text
    compared = json.loads(
        (tiny_quickstart / "quickstart-compare.json").read_text()
    )  # MemDPC against each baseline
    for row in compared["comparisons"]:
        assert "\t".join(cell_text(v) for v in row.values()) in text
    assert compared["summary"] in text
    # every results file with its test videos and intervals; top-5 of the 3 classes is no number
    flow_probe = json.loads((tiny_quickstart / "eval" / "memdpc-flow" / "probe-linear-flow.json").read_text())
    cells = [
        str(flow_probe["counts"]["videos"]),
        "",
        "",
        "",
        *(metric_text(flow_probe, m) for m in ("top1", "top5")),
    ]
    assert "\t".join(cells) in text and cells[-1] == "n/a"
    assert flow_probe["small_test_set"] in text
    assert "test videos" in text and "| " not in text  # the note under the table, and no Markdown left raw
    assert any(src.endswith(".gif") for src, _, _ in images) and any(
        "strips-flow" in src for src, _, _ in images
    )
    kept = Path(os.environ.get(ARTIFACTS_ENV) or tmp_path)  # CI keeps it with the test output (.ci/run)
    kept.mkdir(parents=True, exist_ok=True)
    shot = browser.screenshot(kept / "report-page.png")
    print(f"screenshot of {page}: {shot}")
    picture = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert picture.shape[1] == WIDTH and picture.shape[0] > 2000
    assert (
        (picture.max(axis=-1) - picture.min(axis=-1)) > 100
    ).mean() > 0.01  # drawn pictures, flow in colour
    moved = tmp_path / "copied" / "report"  # the folder alone, elsewhere: its links are relative
    shutil.copytree(page.parent, moved)
    assert len(check_page(browser, moved / PAGE)) == len(images)


@pytest.mark.slow
def test_a_folder_of_results_only_and_a_folder_of_nothing(tiny_quickstart, browser, tmp_path):
    page = write_report(tiny_quickstart / "eval" / "memdpc-flow", tmp_path / "page")
    images = check_page(browser, page)
    assert [Path(src).name for src, _, _ in images] == [  # the flow strips, the legend after them, the matrix
        "retrieval-flow-strips-flow.png",
        "flow-colours.png",
        "probe-linear-flow-confusion.png",
    ]
    with pytest.raises(UserError, match="holds no runs, eval results, shards or frame archives"):
        write_report(tiny_quickstart / "data", tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_the_command_names_the_page_and_how_to_open_it(tmp_path):
    res = run_memdpc("report", tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith(
        f"Error: {tmp_path}: holds no runs"
    )
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("stream: rgb\nshards: s\n")
    (tmp_path / "run" / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"kind": "train", "epoch": 0, "step": s, "loss": 2.0 / s, "top1": 0.1 * s, "lr": 1e-3})
            + "\n"
            for s in (1, 2, 3)
        )
    )
    res = run_memdpc("report", tmp_path, "--out", tmp_path / "page")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"wrote {tmp_path / 'page' / PAGE} and its pictures in {tmp_path / 'page'}"
    assert f"open {(tmp_path / 'page' / PAGE).resolve().as_uri()}" in res.stderr
    assert (tmp_path / "page" / "run-curves.png").is_file()


def test_a_folder_of_archives_is_found_by_opening_one_of_them(tmp_path):
    for i in range(40):
        write_archive(
            archive_path(tmp_path / "a" / "frames", "rgb", f"v{i:03d}"), [b"jpeg"], {"stream": "rgb"}
        )
    found, opened = tars_opened(lambda: find(tmp_path))
    assert found.archives == [tmp_path / "a" / "frames"] and len(opened) == 1
