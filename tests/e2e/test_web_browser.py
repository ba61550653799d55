"""The web example in a real browser: Debian's headless Chromium, driven by Selenium through
Debian's chromedriver (no browser download), loads the page from uvicorn on loopback
(tests/servers/web_app.py: the example app on a model double that streams slowly), asks a question,
sees tokens arrive as several DOM updates, presses Stop (the stop route: the run outlives its
connection), and the server says its invocation was cancelled and the model's stream closed; once
over agentrt's own events, once over the Vercel AI SDK's UI message stream (the page's protocol
switch). A screenshot goes to the test's output directory.

A reload mid-answer: the page reads the run again from its start (agentrt's resume with
`Last-Event-ID`, Vercel's `GET /api/chat/{id}/stream`) and shows the whole answer once; the server
ran one invocation, and memory holds the turn as shown.

And a refund that needs a human's approval: the page shows the waiting call (tool and arguments) with
Allow and Deny; Allow resumes the turn and the refund runs once, Deny (with a reason) resumes it and
the refund never runs; the answer streams into the page either way, under both protocols.

The test is synchronous: the browser is the client, so there is no event loop to choose here.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


REFUND = "Refund order SO-7, 250 CHF please."


@pytest.mark.parametrize("protocol", ["agentrt", "vercel-ui"])
@pytest.mark.parametrize("decision", ["allow", "deny"])
def test_a_refund_waits_for_allow_or_deny_in_the_page_and_runs_only_when_allowed(
    site: str, browser: object, tmp_path: Path, protocol: str, decision: str
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver: Any = browser  # a Selenium WebDriver
    driver.get(f"{site}/")
    Select(driver.find_element(By.ID, "protocol")).select_by_value(protocol)
    driver.find_element(By.ID, "question").send_keys(REFUND)
    driver.find_element(By.ID, "send").click()

    wait = WebDriverWait(driver, 20)
    wait.until(lambda d: d.execute_script("return window.finished") is not None)
    assert driver.execute_script("return window.finished") == "approval"
    panel = driver.find_element(By.CLASS_NAME, "approval")
    calls = panel.find_elements(By.CLASS_NAME, "call")
    assert len(calls) == 1
    assert calls[0].find_element(By.CLASS_NAME, "call-name").text == "refund"
    shown = json.loads(calls[0].find_element(By.CLASS_NAME, "arguments").text)
    assert shown == {"order_id": "SO-7", "amount": 250}  # as the server validated them
    assert httpx.get(f"{site}/test/refunds", timeout=10).json() == []  # nothing ran while it waits
    driver.save_screenshot(str(tmp_path / f"web-approval-{protocol}-asked.png"))

    if decision == "allow":
        calls[0].find_element(By.CLASS_NAME, "allow").click()
    else:
        calls[0].find_element(By.CLASS_NAME, "reason").send_keys("over the limit")
        calls[0].find_element(By.CLASS_NAME, "deny").click()
    wait.until(lambda d: d.execute_script("return window.finished") not in (None, "approval"))
    driver.save_screenshot(str(tmp_path / f"web-approval-{protocol}-{decision}.png"))

    assert driver.execute_script("return window.finished") == "done"
    answers = [element.text for element in driver.find_elements(By.CLASS_NAME, "answer")]
    log = driver.find_element(By.ID, "log").text
    # The decision replaced the buttons; the resumed turn's answer streamed in below it.
    assert not panel.find_elements(By.TAG_NAME, "button")
    refunds = httpx.get(f"{site}/test/refunds", timeout=10).json()
    if decision == "allow":
        assert panel.find_element(By.CLASS_NAME, "decided").text == "allowed"
        assert answers[-1] == "Done: Refunded 250.00 on SO-7."
        assert "refund: success" in log
        assert refunds == [["SO-7", 250.0]]  # once
    else:
        assert panel.find_element(By.CLASS_NAME, "decided").text == "denied: over the limit"
        assert answers[-1] == "I did not refund SO-7 (your reason: over the limit)."
        assert "refund: denied" in log
        assert refunds == []
    assert "Error" not in log


WHOLE = "".join(f"word{index} " for index in range(200))  # the model double's answer


@pytest.mark.parametrize("protocol", ["agentrt", "vercel-ui"])
def test_a_reload_mid_answer_reads_the_run_again_and_shows_the_whole_answer_once(
    site: str, browser: object, tmp_path: Path, protocol: str
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver: Any = browser  # a Selenium WebDriver
    driver.get(f"{site}/")
    Select(driver.find_element(By.ID, "protocol")).select_by_value(protocol)
    driver.find_element(By.ID, "question").send_keys("Tell me about my order")
    driver.find_element(By.ID, "send").click()
    wait = WebDriverWait(driver, 40)
    wait.until(lambda d: len(d.execute_script("return window.updates")) >= 3)
    before = driver.find_element(By.CLASS_NAME, "answer").text
    assert before.startswith("word0 word1 word2") and before != WHOLE

    driver.refresh()  # the connection goes with the page; the run goes on (detach)
    wait.until(lambda d: d.execute_script("return window.finished") is not None)
    driver.save_screenshot(str(tmp_path / f"web-reload-{protocol}.png"))
    assert driver.execute_script("return window.finished") == "done"
    answers = [element.text for element in driver.find_elements(By.CLASS_NAME, "answer")]
    assert answers == [WHOLE]  # the whole answer, once
    log = driver.find_element(By.ID, "log").text
    assert log.count("You: Tell me about my order") == 1 and "Error" not in log
    assert driver.execute_script("return sessionStorage.getItem('agentrt-turn')") is None  # read to its end
    # The server's side: one invocation and one model request (the run was read again, not
    # started again), and memory holds the turn once, as shown.
    state = httpx.get(f"{site}/test/stored", timeout=10).json()
    assert state == {
        "messages": [["user", "Tell me about my order"], ["assistant", WHOLE]],
        "requests": 1,
        "invocations": 1,
    }
