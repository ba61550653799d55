"""The web example in a real browser: Debian's headless Chromium, driven by Selenium through
Debian's chromedriver (no browser download), loads the page from uvicorn on loopback
(tests/servers/web_app.py: the example app on a model double that streams slowly), asks a question,
sees tokens arrive as several DOM updates, presses Stop, and the server says its invocation was
cancelled and the model's stream closed; once over agentrt's own events, once over the Vercel AI
SDK's UI message stream (the page's protocol switch). A screenshot goes to the test's output directory.

The test is synchronous: the browser is the client, so there is no event loop to choose here.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for `served`
from served import serve  # noqa: E402

APP = Path(__file__).resolve().parents[1] / "servers" / "web_app.py"
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def site() -> Iterator[str]:
    for base in serve(APP):
        yield base.removesuffix("/v1")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
        pytest.fail("chromium and chromium-driver are needed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.parametrize("protocol", ["agentrt", "vercel-ui"])
def test_tokens_stream_into_the_page_and_stop_cancels_the_server_side_invocation(
    site: str, browser: object, tmp_path: Path, protocol: str
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver: object = browser
    driver.get(f"{site}/")  # type: ignore[attr-defined]
    Select(driver.find_element(By.ID, "protocol")).select_by_value(protocol)  # type: ignore[attr-defined]
    driver.find_element(By.ID, "question").send_keys("Tell me about my order")  # type: ignore[attr-defined]
    driver.find_element(By.ID, "send").click()  # type: ignore[attr-defined]

    wait = WebDriverWait(driver, 20)
    wait.until(lambda d: len(d.execute_script("return window.updates")) >= 3)
    updates = driver.execute_script("return window.updates")  # type: ignore[attr-defined]
    assert updates == sorted(updates) and len(set(updates)) == len(updates)  # the answer grew, token by token
    assert driver.execute_script("return window.finished") is None  # type: ignore[attr-defined]

    driver.find_element(By.ID, "stop").click()  # type: ignore[attr-defined]
    wait.until(lambda d: d.execute_script("return window.finished") == "stopped")
    driver.save_screenshot(str(tmp_path / f"web-chat-{protocol}.png"))  # type: ignore[attr-defined]

    answer = driver.find_element(By.CLASS_NAME, "answer").text  # type: ignore[attr-defined]
    assert answer.startswith("word0 word1 word2")
    assert "(stopped)" in driver.find_element(By.ID, "log").text  # type: ignore[attr-defined]
    # The server's side: the invocation was cancelled, and the model's stream closed before its end.
    state = httpx.get(f"{site}/test/cancelled", timeout=30).json()
    assert state == {"cancelled": True, "closed": True, "completed": False, "stored": 0}
    assert (tmp_path / f"web-chat-{protocol}.png").stat().st_size > 0
    if protocol == "vercel-ui":  # the page's conversation and its chat, never the chat id alone
        assert httpx.get(f"{site}/test/conversation", timeout=10).json()["memory_id"].count(":") == 1
