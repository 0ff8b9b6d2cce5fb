"""`python -m client attention` against a real server: JSON, the HTML page, the PNG grid;
and the serving path imports neither matplotlib nor torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.client.test_service_client import ROOT, cli

TEXT = "The cat sat on the mat."


async def test_json_prints_the_response(server):
    rc, out, _ = await cli(server.address, "attention", TEXT, "--json", "--layers", "1")
    response = json.loads(out)
    assert rc == 0 and response["model"] == "tiny-embed" and len(response["maps"]) == 4
    assert {m["layer"] for m in response["maps"]} == {1} and response["source_tokens"][0] == "[CLS]"


async def test_html_page_is_self_contained_with_every_panel(server, tmp_path):
    page = tmp_path / "attention.html"
    rc, _, err = await cli(
        server.address, "attention", TEXT, "--model", "tiny-translate", "--target", "Le chat.", "--out", str(page)
    )
    assert rc == 0, err
    text = page.read_text()
    assert len(re.findall(r'<figure class="panel"', text)) == 3 * 2 * 4  # (self, causal, cross) x layers x heads
    assert text.count('class="alignment"') == 1 and text.count("<tr>") == 1 + 24  # header + a row per map
    sources = re.findall(r'src="([^"]*)"', text)
    assert len(sources) == 25 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "Le chat." in text and "http" not in text


async def test_png_grid(server, tmp_path):
    out = tmp_path / "grid.png"
    rc, _, err = await cli(server.address, "attention", TEXT, "--model", "tiny-gpt", "--out", str(out))
    assert rc == 0, err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


async def test_errors_and_a_missing_output_are_reported(server, tmp_path):
    rc, _, err = await cli(server.address, "attention", TEXT, "--layers", "7", "--json")
    assert rc == 2 and "INVALID_ARGUMENT" in err and "layer 7 does not exist" in err
    rc, _, err = await cli(server.address, "attention", TEXT, "--out", str(tmp_path / "x.txt"))
    assert rc != 0 and "--out FILE.html" in err


def test_the_serving_path_imports_neither_matplotlib_nor_torch():
    code = (
        "import sys, service.server, service.grpc.inspection, client; "
        "print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
