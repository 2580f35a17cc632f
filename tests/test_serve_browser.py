"""The chat page of ``lmforge serve`` in a real headless browser (Debian's chromium, driven by selenium): a
question typed into the page streams its answer token by token, and the answer is the API's greedy one.

Skipped with the reason when the serve extra, selenium or chromium is missing, unless
``LMFORGE_REQUIRE_BROWSER=1`` (CI), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

REQUIRED = os.environ.get("LMFORGE_REQUIRE_BROWSER") == "1"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"LMFORGE_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


try:
    import fastapi  # noqa: F401
    import openai
    from selenium import webdriver  # noqa: F401  (the availability check)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
except ImportError as err:
    _missing(f"{err.name} is not installed (pip install -e '.[dev,serve]')")
if not (CHROMIUM and CHROMEDRIVER):
    _missing("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")

from conftest import headless_chromium  # noqa: E402
from serve_helpers import chat_model, live_server  # noqa: E402

# Records every text the answer bubble shows, as it changes (a MutationObserver on the conversation). The page's
# stream reaches it one server-sent event a read, 20 ms apart: a fast engine's events otherwise arrive in one or two
# network reads, which the page rightly shows at once, and "it grew" would measure the engine's speed, not the page.
WATCH = """
const realFetch = window.fetch;
window.fetch = async (url, options) => {
  const response = await realFetch(url, options);
  if (!String(url).endsWith('/v1/chat/completions') || !response.ok) return response;
  const reader = response.body.getReader(), decoder = new TextDecoder(), encoder = new TextEncoder();
  let pending = '';
  const events = new ReadableStream({async pull(controller) {
    while (!pending.includes('\\n\\n')) {
      const {value, done} = await reader.read();
      if (done) { if (pending) controller.enqueue(encoder.encode(pending)); controller.close(); return; }
      pending += decoder.decode(value, {stream: true});
    }
    const end = pending.indexOf('\\n\\n') + 2;
    controller.enqueue(encoder.encode(pending.slice(0, end)));
    pending = pending.slice(end);
    await new Promise(resolve => setTimeout(resolve, 20));
  }});
  return new Response(events, {status: response.status, headers: response.headers});
};
window.seen = [];
new MutationObserver(() => {
  const bubbles = document.querySelectorAll('#messages .message.assistant');
  if (bubbles.length) window.seen.push(bubbles[bubbles.length - 1].textContent);
}).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, single_thread):
    with live_server(chat_model(tmp_path_factory.mktemp("browser") / "chat-model")) as (url, _service):
        yield url


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium(CHROMIUM, CHROMEDRIVER)


def ask(browser, question: str, tokens: int = 24) -> str:
    """Type a question into a fresh page (after the caller's settings) and wait for the answer's end; its status."""
    limit = browser.find_element(By.ID, "max_tokens")
    limit.clear()
    limit.send_keys(str(tokens))
    browser.find_element(By.ID, "prompt").send_keys(question, Keys.ENTER)
    deadline = time.monotonic() + 60
    while browser.find_element(By.ID, "status").text not in ("done", "error") and time.monotonic() < deadline:
        time.sleep(0.05)
    return browser.find_element(By.ID, "status").text


def test_a_question_typed_in_the_page_streams_the_apis_greedy_answer(server, browser):
    question, tokens = "what is the capital of france?", 24
    api = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=60)
    expected = api.chat.completions.create(model="chat-model", messages=[{"role": "user", "content": question}],
                                           temperature=0, max_tokens=tokens).choices[0].message.content
    browser.get(server + "/")
    assert "chat-model" in browser.find_element(By.ID, "model").text  # the model's name (and context) shown
    browser.execute_script(WATCH)
    assert ask(browser, question, tokens) == "done"
    answer = browser.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")[-1].text
    assert answer == expected.strip() and expected.strip()
    partial = [t for t in dict.fromkeys(browser.execute_script("return window.seen")) if t]
    assert len(partial) >= 3 and all(expected.startswith(t) for t in partial)  # it grew, token by token
    assert browser.find_element(By.ID, "attention").is_enabled()  # the last answer can be inspected


def test_top_log_probabilities_show_when_hovering_over_the_answer(server, browser):
    """With the box ticked the page asks for 5 top log-probabilities: each streamed piece of the answer is a span
    whose title (the hover) lists its token's probability and the alternatives; the text is the same answer."""
    question = "name a colour"
    api = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=60)
    expected = api.chat.completions.create(model="chat-model", messages=[{"role": "user", "content": question}],
                                           temperature=0, max_tokens=24).choices[0].message.content
    browser.get(server + "/")
    browser.find_element(By.ID, "logprobs").click()
    assert ask(browser, question) == "done"
    answer = browser.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")[-1]
    pieces = answer.find_elements(By.CSS_SELECTOR, ".token")
    assert len(pieces) >= 3 and browser.execute_script("return arguments[0].textContent", answer) == expected
    titles = [p.get_attribute("title") for p in pieces]
    assert all("%" in t and t.count("\n") >= 5 for t in titles), titles[:2]  # the token, then 5 alternatives


def test_the_schema_box_makes_the_answer_follow_it(server, browser):
    """A JSON schema typed into the box goes out as response_format: the answer is JSON that follows it; a box
    that is not JSON is one error line, and nothing is sent."""
    import json

    browser.get(server + "/")
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    browser.find_element(By.ID, "schema").send_keys(json.dumps(schema))
    assert ask(browser, "is the sea blue?", tokens=40) == "done"
    answer = browser.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")[-1].text
    assert json.loads(answer)["answer"] in ("yes", "no")
    browser.find_element(By.ID, "schema").send_keys("{oops")
    assert ask(browser, "again?") == "error"
    assert "JSON schema" in browser.find_elements(By.CSS_SELECTOR, "#messages .message.error")[-1].text
