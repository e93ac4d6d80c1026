"""The page at `/` in a real browser: headless Chromium (Debian's chromium and chromium-driver packages),
driven over the WebDriver protocol with urllib, types sentences, clicks translate, and reads the result.
Skipped where either is missing; `make test-browser` runs it alone."""

import json
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.serve.test_signals import post, start_server, wait_ready

pytest.importorskip("uvicorn")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not (CHROMIUM and CHROMEDRIVER),
        reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)",
    ),
]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C WebDriver key of an element reference


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """A WebDriver session of headless Chromium, spoken to as JSON over loopback HTTP."""

    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"
        options = {
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        }
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}}
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data, {"Content-Type": "application/json"}, method=method)
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())["value"]

    def do(self, method, path, body=None):
        return self.call(method, f"/session/{self.session}{path}", body)

    def find_all(self, css):
        return [e[ELEMENT] for e in self.do("POST", "/elements", {"using": "css selector", "value": css})]

    def text(self, element):
        return self.do("GET", f"/element/{element}/text")

    def wait_for(self, css, what, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.find_all(css)
            if found and what([self.text(e) for e in found]):
                return [self.text(e) for e in found]
            time.sleep(0.1)
        pytest.fail(f"no {css} as expected on the page")


@pytest.fixture
def browser():
    port = free_port()
    driver = subprocess.Popen([CHROMEDRIVER, f"--port={port}", "--allowed-ips=127.0.0.1"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "chromedriver did not start"
                time.sleep(0.05)
        b = Browser(port)
        yield b
        b.call("DELETE", f"/session/{b.session}")
    finally:
        driver.terminate()
        driver.wait(10)


def test_a_person_types_sentences_clicks_translate_and_reads_them(trained_copy_checkpoint, browser):
    proc, port, _ = start_server(trained_copy_checkpoint)
    try:
        wait_ready(port)
        expected = post(port, {"texts": ["1 2 3", "4 5 6 7"]})[1]["translations"]
        browser.do("POST", "/url", {"url": f"http://127.0.0.1:{port}/"})
        assert browser.wait_for("#pair", lambda t: t[0] != "") == ["src \u2192 tgt"]
        [source] = browser.find_all("#source")
        browser.do("POST", f"/element/{source}/value", {"text": "1 2 3\n4 5 6 7"})
        [button] = browser.find_all("#translate")
        browser.do("POST", f"/element/{button}/click", {})
        shown = browser.wait_for(".translation .text", lambda t: len(t) == 2)
        assert shown == [t["text"] for t in expected]
        assert browser.wait_for("#time", lambda t: "ms" in t[0])[0].startswith("2 sentence(s) in ")
        # n-best on demand
        [nbest] = browser.find_all("#nbest")
        browser.do("POST", f"/element/{nbest}/clear", {})
        browser.do("POST", f"/element/{nbest}/value", {"text": "3"})
        browser.do("POST", f"/element/{button}/click", {})
        items = browser.wait_for("ol.nbest li", lambda t: len(t) == 6)
        assert items[0].startswith(expected[0]["text"] + " (")
    finally:
        proc.terminate()
        proc.wait(30)


def test_with_an_api_key_the_page_asks_for_it_and_then_translates(trained_copy_checkpoint, browser):
    proc, port, _ = start_server(trained_copy_checkpoint, "--api-key", "page-key-1")
    try:
        wait_ready(port)
        browser.do("POST", "/url", {"url": f"http://127.0.0.1:{port}/"})
        assert "API key" in browser.wait_for("#error", lambda t: t[0] != "")[0]  # /info answered 401
        [key] = browser.find_all("#key")
        browser.do("POST", f"/element/{key}/value", {"text": "page-key-1"})
        [source] = browser.find_all("#source")
        browser.do("POST", f"/element/{source}/value", {"text": "1 2 3"})
        [button] = browser.find_all("#translate")
        browser.do("POST", f"/element/{button}/click", {})
        assert browser.wait_for(".translation .text", lambda t: len(t) == 1) != [""]
        assert browser.wait_for("#pair", lambda t: t[0] != "") == ["src \u2192 tgt"]
    finally:
        proc.terminate()
        proc.wait(30)


def test_with_several_models_the_page_offers_them_and_translates_with_the_one_chosen(
    trained_copy_checkpoint, tiny_checkpoint, browser, tmp_path
):
    from tests.serve.serving import relabeled

    de_en = relabeled(tiny_checkpoint, tmp_path / "de_en.pt", "de", "en")
    proc, port, _ = start_server(trained_copy_checkpoint, "--path", str(de_en))
    try:
        wait_ready(port)
        expected = post(port, {"texts": ["1 2 3", "4 5 6 7"], "model": "de-en"})[1]["translations"]
        assert post(port, {"texts": ["1 2 3", "4 5 6 7"]})[1]["translations"] != expected  # the models differ
        browser.do("POST", "/url", {"url": f"http://127.0.0.1:{port}/"})
        assert browser.wait_for("#pair", lambda t: t[0] != "") == ["src \u2192 tgt"]
        assert browser.wait_for("#model option", lambda t: len(t) == 2) == [
            "src-tgt (src \u2192 tgt)",
            "de-en (de \u2192 en)",
        ]
        [choice] = browser.find_all("#model option:nth-child(2)")
        browser.do("POST", f"/element/{choice}/click", {})
        assert browser.wait_for("#pair", lambda t: t[0] == "de \u2192 en") == ["de \u2192 en"]
        [source] = browser.find_all("#source")
        browser.do("POST", f"/element/{source}/value", {"text": "1 2 3\n4 5 6 7"})
        [button] = browser.find_all("#translate")
        browser.do("POST", f"/element/{button}/click", {})
        shown = browser.wait_for(".translation .text", lambda t: len(t) == 2)
        assert shown == [t["text"] for t in expected]
    finally:
        proc.terminate()
        proc.wait(30)
