"""The monitor page at `/`, in headless Chromium (Debian's, driven by Playwright; no browser
download) against a real server on the CPU backend: the numbers and the device card come from
the live server, and update while it works."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers.serve_process import API_KEY, MODEL_NAME

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def page():
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        pg = browser.new_page(viewport={"width": 1200, "height": 800})
        yield pg
        browser.close()


def test_monitor_page_shows_the_live_server(server, page, tmp_path):
    with httpx.Client(base_url=server.url, headers={"x-api-key": API_KEY}, timeout=60) as c:
        c.post("/v1/chat/completions", json={"model": MODEL_NAME, "max_tokens": 3,
                                             "messages": [{"role": "user", "content": "hi"}]})
        page.goto(f"{server.url}/#key={API_KEY}")
        page.wait_for_selector("body[data-ready='1']", timeout=15000)
        assert page.text_content("#model") == MODEL_NAME
        assert page.text_content("#context") == "1,024"
        assert page.text_content("#slots") == "4"
        assert int(page.text_content("#requests")) >= 1
        assert int(page.text_content("#tokens-out").replace(",", "")) >= 1
        cards = page.query_selector_all(".device-card")
        assert [card.get_attribute("data-device") for card in cards] == ["cpu"]
        regions = page.eval_on_selector_all(".device-card .region",
                                            "rows => rows.map(r => r.dataset.region)")
        assert regions == ["weights (mapped)", "kv (4 slots)"]
        kv_text = page.text_content("[data-region='kv (4 slots)'] td.num")
        assert kv_text == "32.0 MiB"  # 4 slots x 4 layers x 1,024 positions x 2 x 256 x f32
        assert page.is_hidden("#banner")

        # load shows up live: decode tok/s rises above zero while requests run
        def busy(_):
            c.post("/v1/chat/completions", json={"model": MODEL_NAME, "max_tokens": 200,
                                                 "messages": [{"role": "user", "content": "go"}]})
        with ThreadPoolExecutor(2) as pool:
            running = pool.map(busy, range(2))
            page.wait_for_function(
                "parseFloat(document.getElementById('decode-rate').textContent) > 0",
                timeout=20000)
            list(running)
        page.screenshot(path=str(tmp_path / "monitor.png"), full_page=True)
        assert (tmp_path / "monitor.png").stat().st_size > 10_000


def test_monitor_page_asks_for_a_key(server, page):
    page.goto(f"{server.url}/")
    page.evaluate("localStorage.clear()")
    page.reload()
    page.wait_for_selector("#key-form:not([hidden])", timeout=15000)
    assert "API key" in page.text_content("#banner-text")
    page.fill("#key", API_KEY)
    page.click("#key-form button")
    page.wait_for_selector("body[data-ready='1']", timeout=15000)
    assert page.text_content("#model") == MODEL_NAME


def test_gpu_cards_draw_the_plan_and_nvml(server, page, tmp_models):
    """The page draws a GPU card from the data a GPU server sends: regions from a real plan
    of the tiny model, NVML readings, the expert cache's slots and hit rate."""
    import dataclasses
    import json

    from helpers.serve_process import tiny_model
    from strata.gguf import open_model
    from strata.plan import DeviceInfo, PlanOptions, plan
    from strata.serve.devices import plan_reports

    p = plan(open_model(tiny_model(tmp_models)).shape,
             [DeviceInfo(index=0, name="NVIDIA H200", free_bytes=8 << 30, total_bytes=16 << 30)],
             PlanOptions())
    cards = plan_reports(p, nvml=lambda i: (16 << 30, 3 << 30, 13 << 30), hit_rates={0: 0.875})
    live = httpx.get(f"{server.url}/monitor.json", headers={"x-api-key": API_KEY}).json()
    live["devices"] = [dataclasses.asdict(c) for c in cards]
    page.route("**/monitor.json", lambda route: route.fulfill(
        status=200, content_type="application/json", body=json.dumps(live)))
    try:
        page.goto(f"{server.url}/#key={API_KEY}")
        page.wait_for_selector(".device-card[data-device='cuda:0']", timeout=15000)
        card = ".device-card[data-device='cuda:0']"
        assert "NVIDIA H200" in page.text_content(f"{card} h3")
        assert page.text_content(f"{card} .meta") == "layers 0–3"
        assert page.text_content(f"{card} [data-vram='free'] td.num") == "13.0 GiB"
        assert page.text_content(f"{card} [data-vram='used'] td.num") == "3.0 GiB"
        assert page.text_content(f"{card} [data-expert='slots'] td.num") == str(
            p.devices[0].cache.n_slots)
        assert page.text_content(f"{card} [data-expert='hit-rate'] td.num") == "87.5%"
        names = page.eval_on_selector_all(f"{card} .region",
                                          "rows => rows.map(r => r.dataset.region)")
        assert names == [n for n, b in p.devices[0].regions.items() if b]
        assert page.query_selector(f"{card} .bar .used-engine") is not None
    finally:
        page.unroute("**/monitor.json")
