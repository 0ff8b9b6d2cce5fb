"""The attention HTML page opened in a real headless Chromium (Debian's `chromium`, installed in CI
by .ci/deploy-tools.sh; skipped where it is absent): every panel's image decodes and the
screenshot is not blank."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from client import figures
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/deploy-tools.sh installs it)")
# Appended to a copy of the page: once loaded, count the images the browser decoded.
PROBE = (
    "<script>addEventListener('load', () => { document.body.dataset.decoded = [...document.images]"
    ".filter(i => i.complete && i.naturalWidth > 0).length; });</script>"
)


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=10000",
            *args,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_page_renders_every_panel(server, tmp_path):
    stub = pb_grpc.InspectionServiceStub(server.channel)
    response = await stub.Attention(pb.AttentionRequest(model="tiny-translate", text="The cat sat.", target="Le chat."))
    page = figures.html_page(response)
    (tmp_path / "page.html").write_text(page, encoding="utf-8")
    (tmp_path / "probe.html").write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = _chromium("--dump-dom", f"file://{tmp_path / 'probe.html'}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    panels = len(re.findall(r'<figure class="panel"', dom.stdout))
    assert panels == len(response.maps) == 3 * 2 * 4  # (self, causal, cross) x 2 layers x 4 heads
    assert re.search(r'data-decoded="(\d+)"', dom.stdout).group(1) == str(panels + 1)  # + the alignment
    shot = tmp_path / "shot.png"
    run = _chromium(f"--screenshot={shot}", "--window-size=1200,2400", f"file://{tmp_path / 'page.html'}")
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]  # (H, W, 3)
    assert pixels.std() > 0.05 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # not blank
