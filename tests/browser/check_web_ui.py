"""The playground and the dashboard in a real browser: headless Chromium (Debian's package)
driven by Selenium through chromedriver, against a Pagoda server started with --api-key, a
Qwen3-style chat template and --reasoning-parser qwen3 (crates/server/tests/e2e/web_ui.rs).

Checks, in order:
- the page loads only from the server itself (no CDN, no other origin);
- it asks for the API key, sends it, and the API still refuses a request without it;
- a streamed answer appears token by token, with its model, TTFT and tok/s;
- reasoning renders folded apart from the answer; a tool call renders as a call; the JSON-schema
  mode shows the structured answer;
- the stop button ends the stream and the server's running gauge returns to 0 (an aborted
  request is counted);
- regenerate and edit, and conversations surviving a reload;
- the dashboard's numbers equal what /metrics says after a short load, and its charts plotted it.
Screenshots of the chat and the dashboard go to --artifacts.
"""

import argparse
import concurrent.futures
import json
import math
import os
import re
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ARGS = None
CHECKS = []


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    CHECKS.append(what)


def http(path, body=None, key=True, timeout=120):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {ARGS.api_key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(ARGS.base_url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# ---- /metrics, read independently of the server's own /stats ------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$')


def metrics():
    """{(name, labels-without-model_name): value} from the Prometheus text format."""
    _, text = http("/metrics", key=False)
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        labels.pop("model_name", None)
        out[(m.group(1), tuple(sorted(labels.items())))] = float(m.group(3))
    return out


def value(ms, name, **labels):
    return ms[(f"pagoda:{name}", tuple(sorted(labels.items())))]


def histogram_quantile(ms, name, q):
    """Prometheus's histogram_quantile over the cumulative buckets of one histogram."""
    buckets = sorted(
        (float("inf") if dict(lbl)["le"] == "+Inf" else float(dict(lbl)["le"]), v)
        for (n, lbl), v in ms.items() if n == f"pagoda:{name}_bucket")
    total = buckets[-1][1]
    if total == 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


# ---- the page -------------------------------------------------------------------------------------

def driver():
    options = webdriver.ChromeOptions()
    options.binary_location = ARGS.chromium
    for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1000", "--disable-background-networking", "--no-first-run"]:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=ARGS.chromedriver))


def wait(d, what, condition, timeout=60):
    return WebDriverWait(d, timeout, poll_frequency=0.05).until(lambda _: condition(), message=what)


def last_assistant(d):
    found = d.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")
    return found[-1] if found else None


def streaming(d):
    return bool(d.find_elements(By.CSS_SELECTOR, "#messages .message.streaming"))


def set_field(d, field_id, text):
    el = d.find_element(By.ID, field_id)
    d.execute_script(
        "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('change'));", el, text)


def ask(d, text, timeout=120):
    """Sends a message and waits for the answer to finish; returns the answer's element."""
    before = len(d.find_elements(By.CSS_SELECTOR, "#messages .message.assistant"))
    box = d.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(text)
    d.find_element(By.ID, "send").click()
    wait(d, "the answer starts", lambda: len(d.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")) > before)
    wait(d, "the answer ends", lambda: not streaming(d), timeout)
    return last_assistant(d)


def check_origin_only(d, page):
    urls = d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    foreign = [u for u in urls if not u.startswith(ARGS.base_url)]
    check(not foreign, f"{page} loads nothing from another origin (loaded {len(urls)} resources)")


def chat_checks(d):
    d.get(ARGS.base_url + "/")
    check_origin_only(d, "/")
    # The key: asked for, then sent.
    wait(d, "the key dialog opens", lambda: d.find_element(By.ID, "key-dialog").get_attribute("open") is not None)
    check(d.find_element(By.ID, "model-name").text in ("…", ""), "no model is shown before the key is given")
    d.find_element(By.ID, "api-key-input").send_keys(ARGS.api_key)
    d.find_element(By.ID, "api-key-save").click()
    wait(d, "the model name shows", lambda: d.find_element(By.ID, "model-name").text == ARGS.model)
    check(True, "the page asked for the API key and listed the model with it")
    status = d.execute_script("return fetch('/v1/models').then(r => r.status)")
    check(status == 401, f"the API still refuses the page's request without the key ({status})")

    # Markdown and code, rendered safely (the page's own renderer, as answers use it).
    html = d.execute_script("return Markdown.render(arguments[0])",
                            "# Title\n\nSome **bold** and `code`.\n\n```python\nprint('<b>')\n```\n\n- one\n- two\n\n<script>x()</script>")
    check("<h1>Title</h1>" in html and "<strong>bold</strong>" in html and "<code>code</code>" in html,
          "markdown renders headings, emphasis and inline code")
    check('<pre class="code"><span class="code-lang">python</span><code class="language-python">print(\'&lt;b&gt;\')</code></pre>' in html,
          "a fenced code block renders as code, its language named and its text escaped")
    check("<ul><li>one</li><li>two</li></ul>" in html and "<script>" not in html, "lists render; raw HTML is escaped")
    html = d.execute_script("return Markdown.render(arguments[0])",
                            "see [the *a* page](https://example.com/*a*/_b_/x~~y~~z) and *b*")
    check('<a href="https://example.com/*a*/_b_/x~~y~~z" target="_blank" rel="noopener noreferrer">the <em>a</em> page</a>' in html
          and html.endswith("and <em>b</em></p>"),
          f"emphasis marks inside a link's href stay as written; its label and the text around still render ({html})")

    d.find_element(By.ID, "settings-button").click()
    set_field(d, "temperature", "0")
    set_field(d, "max-tokens", "40")
    set_field(d, "extra-body", '{"chat_template_kwargs": {"enable_thinking": false}}')

    # Token by token: the answer's text is watched while it streams.
    box = d.find_element(By.ID, "prompt")
    box.send_keys("Write two sentences about the sea.")
    d.find_element(By.ID, "send").click()
    wait(d, "the answer starts", lambda: last_assistant(d) is not None and streaming(d))
    lengths = []
    while streaming(d):
        text = d.execute_script(
            "const m = [...document.querySelectorAll('#messages .message.assistant')].pop();"
            "return m ? m.querySelector('.body').textContent : ''")
        if text and (not lengths or lengths[-1] != len(text)):
            lengths.append(len(text))
        time.sleep(0.01)
    answer = last_assistant(d)
    chunks = int(answer.get_attribute("data-chunks"))
    check(chunks >= 10, f"the answer arrived in {chunks} streamed chunks")
    check(len(lengths) >= 5 and lengths == sorted(lengths),
          f"the text grew in {len(lengths)} visible steps while streaming ({lengths[:8]}...)")
    stats = answer.find_element(By.CLASS_NAME, "stats").text
    check(ARGS.model in stats and "TTFT" in stats and "tok/s" in stats, f"the answer shows its model, TTFT and tok/s: {stats!r}")
    content = answer.find_element(By.CSS_SELECTOR, ".content").text
    check(len(content) > 10, "the answer is rendered as markdown content")

    # Regenerate replaces the last answer; the conversation keeps one answer per question.
    d.find_element(By.CSS_SELECTOR, "#messages .message.assistant .regenerate").click()
    wait(d, "the regenerated answer ends", lambda: not streaming(d) and last_assistant(d) is not None
         and last_assistant(d).find_elements(By.CLASS_NAME, "content"), 120)
    check(len(d.find_elements(By.CSS_SELECTOR, "#messages .message")) == 2, "regenerate replaced the answer")

    # Reasoning: with thinking on, the template opens <think> and the parser splits it out.
    set_field(d, "extra-body", "")
    set_field(d, "max-tokens", "24")
    answer = ask(d, "Is the sky blue? Think first.")
    details = answer.find_elements(By.CSS_SELECTOR, "details.reasoning")
    check(len(details) == 1, "the reasoning renders as its own block")
    check(details[0].get_attribute("open") is None, "the reasoning block is folded")
    text = d.execute_script("return arguments[0].querySelector('.reasoning-text').textContent", details[0])
    check(len(text.strip()) > 0, f"the folded block holds the reasoning ({len(text)} characters)")

    # A tool call, forced with tool_choice=required.
    set_field(d, "extra-body", '{"chat_template_kwargs": {"enable_thinking": false}}')
    set_field(d, "max-tokens", "96")
    set_field(d, "tools", json.dumps([{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}}]))
    set_field(d, "tool-choice", "required")
    answer = ask(d, "What is the weather in Paris?")
    calls = answer.find_elements(By.CSS_SELECTOR, ".tool-call")
    check(len(calls) >= 1, "the tool call renders as a call")
    check(calls[0].find_element(By.CLASS_NAME, "tool-name").text == "get_weather", "the call names get_weather")
    args = json.loads(calls[0].find_element(By.CLASS_NAME, "tool-args").text)
    check(isinstance(args, dict) and "city" in args, f"the call's arguments are the schema's object: {args}")
    set_field(d, "tools", "")

    # JSON-schema mode.
    set_field(d, "json-schema", json.dumps({"type": "object", "properties": {"answer": {"type": "string", "maxLength": 30}},
                                            "required": ["answer"], "additionalProperties": False}))
    d.execute_script("const c = document.getElementById('json-mode'); c.checked = true; c.dispatchEvent(new Event('change'));")
    answer = ask(d, "Answer in JSON: what colour is grass?")
    structured = json.loads(answer.find_element(By.CLASS_NAME, "structured-json").text)
    check(isinstance(structured.get("answer"), str), f"the JSON-schema mode shows the structured answer: {structured}")
    d.execute_script("const c = document.getElementById('json-mode'); c.checked = false; c.dispatchEvent(new Event('change'));")

    d.save_screenshot(os.path.join(ARGS.artifacts, "chat.png"))

    # Stop: a long answer is aborted from the page; the engine lets the sequence go.
    aborted_before = metrics().get(("pagoda:request_success_total", (("finished_reason", "abort"),)), 0.0)
    set_field(d, "max-tokens", "700")
    set_field(d, "extra-body", '{"chat_template_kwargs": {"enable_thinking": false}, "ignore_eos": true}')
    box = d.find_element(By.ID, "prompt")
    box.send_keys("Count from one to one thousand.")
    d.find_element(By.ID, "send").click()
    wait(d, "the long answer streams", lambda: last_assistant(d) is not None and streaming(d)
         and int(last_assistant(d).get_attribute("data-chunks") or 0) >= 5)
    running = value(metrics(), "num_requests_running")
    check(running == 1, f"the server runs the request while it streams (running = {running})")
    d.find_element(By.ID, "stop").click()
    wait(d, "the stream ends", lambda: not streaming(d), 10)
    check("stopped" in last_assistant(d).find_element(By.CLASS_NAME, "stats").text, "the answer says it was stopped")
    check(d.find_element(By.ID, "send").is_displayed(), "the send button is back")
    deadline = time.time() + 10
    while time.time() < deadline and value(metrics(), "num_requests_running") != 0:
        time.sleep(0.1)
    ms = metrics()
    check(value(ms, "num_requests_running") == 0, "the running gauge returned to 0 after the stop")
    aborted = ms.get(("pagoda:request_success_total", (("finished_reason", "abort"),)), 0.0)
    check(aborted == aborted_before + 1, f"the server counted the request as aborted ({aborted_before} -> {aborted})")

    # Edit the first question: the conversation is cut there and answered again.
    count_before = len(d.find_elements(By.CSS_SELECTOR, "#messages .message"))
    set_field(d, "max-tokens", "16")
    set_field(d, "extra-body", '{"chat_template_kwargs": {"enable_thinking": false}}')
    d.find_element(By.CSS_SELECTOR, "#messages .message.user .edit").click()
    area = d.find_element(By.CSS_SELECTOR, "#messages .message.user .edit-area")
    area.clear()
    area.send_keys("Name one colour.")
    d.find_element(By.CSS_SELECTOR, "#messages .message.user .save-edit").click()
    wait(d, "the edited question is answered", lambda: not streaming(d) and len(d.find_elements(By.CSS_SELECTOR, "#messages .message")) == 2, 60)
    check(count_before > 2, f"edit cut the conversation from {count_before} messages to 2 and answered again")

    # Completion mode: the conversation is one text that /v1/completions continues.
    d.find_element(By.ID, "new-chat").click()
    d.execute_script("const m = document.getElementById('mode'); m.value = 'completion'; m.dispatchEvent(new Event('change'));")
    set_field(d, "extra-body", "")
    answer = ask(d, "The capital of France is")
    completions = d.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.endsWith('/v1/completions')).length")
    check(completions == 1 and answer.find_elements(By.CSS_SELECTOR, ".content"),
          "completion mode continues the text through /v1/completions")
    d.execute_script("const m = document.getElementById('mode'); m.value = 'chat'; m.dispatchEvent(new Event('change'));")
    check(len(d.find_elements(By.CSS_SELECTOR, "#conversations li")) == 2, "the new chat is listed beside the first")
    d.find_element(By.CSS_SELECTOR, "#conversations li:last-child .chat-title").click()

    # Conversations are kept in the browser across a reload.
    d.refresh()
    wait(d, "the conversation is back", lambda: len(d.find_elements(By.CSS_SELECTOR, "#messages .message")) == 2)
    check(d.find_element(By.CSS_SELECTOR, "#messages .message.user").text.find("Name one colour.") >= 0,
          "the conversation survived a reload (localStorage)")


def load(n=8):
    """A short load: n streamed chat requests, four at a time, straight to the API."""
    def one(i):
        body = {"model": ARGS.model, "messages": [{"role": "user", "content": f"Say something about number {i}."}],
                "max_tokens": 24, "temperature": 0.8, "seed": i,
                "chat_template_kwargs": {"enable_thinking": False}}
        status, text = http("/v1/chat/completions", body)
        assert status == 200, text
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(n)))


def dashboard_checks(d):
    load()
    d.get(ARGS.base_url + "/dashboard")
    check_origin_only(d, "/dashboard")
    # Two polls after the load, so the table is read from an idle server.
    first = time.time()
    wait(d, "the dashboard updates", lambda: d.find_element(By.ID, "updated").get_attribute("data-now")
         and float(d.find_element(By.ID, "updated").get_attribute("data-now")) / 1000 > first + 2, 30)
    shown = {el.get_attribute("id")[len("total-"):]: el.get_attribute("data-value")
             for el in d.find_elements(By.CSS_SELECTOR, "#totals td")}
    ms = metrics()
    success = sum(v for (n, _), v in ms.items() if n == "pagoda:request_success_total")
    expected = {
        "requests": success,
        "prompt-tokens": value(ms, "prompt_tokens_total"),
        "generation-tokens": value(ms, "generation_tokens_total"),
        "running": value(ms, "num_requests_running"),
        "waiting": value(ms, "num_requests_waiting"),
        "kv-usage": value(ms, "kv_cache_usage_perc"),
        "preemptions": value(ms, "num_preemptions_total"),
        "prefix-hit-rate": value(ms, "prefix_cache_hits_total") / value(ms, "prefix_cache_queries_total"),
    }
    for name, q in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)]:
        expected[f"ttft-{name}"] = histogram_quantile(ms, "time_to_first_token_seconds", q)
        expected[f"itl-{name}"] = histogram_quantile(ms, "inter_token_latency_seconds", q)
    for key, want in expected.items():
        got = float(shown[key])
        check(math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), f"dashboard {key} = {got:g}, /metrics says {want:g}")
    check(expected["generation-tokens"] > 0 and expected["requests"] >= 8, "the load shows in the totals")

    def series(chart):
        return json.loads(d.find_element(By.ID, chart).get_attribute("data-series"))
    throughput = [y for _, y in series("chart-throughput")["tok/s"] if y is not None]
    check(max(throughput, default=0) > 0, f"the tokens/s chart plotted the load (peak {max(throughput, default=0):.1f} tok/s)")
    running = [y for _, y in series("chart-requests")["running"] if y is not None]
    check(max(running) >= 1 and running[-1] == 0, f"the requests chart saw requests run and end (peak {max(running)})")
    ttft = [y for _, y in series("chart-ttft")["p50"] if y is not None]
    check(ttft and all(y > 0 for y in ttft), f"the TTFT chart plotted {len(ttft)} windows")
    kv = [y for _, y in series("chart-kv")["used"] if y is not None]
    check(kv and math.isclose(kv[-1] / 100, expected["kv-usage"], abs_tol=1e-9), "the KV chart ends at /metrics' usage")
    preempt = [y for _, y in series("chart-preemptions")["total"] if y is not None]
    check(preempt and preempt[-1] == expected["preemptions"], "the preemptions chart ends at /metrics' count")
    # Tall enough for every chart.
    d.set_window_size(1400, 1500)
    time.sleep(0.3)
    d.save_screenshot(os.path.join(ARGS.artifacts, "dashboard.png"))


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    p.add_argument("--artifacts", required=True)
    ARGS = p.parse_args()
    os.makedirs(ARGS.artifacts, exist_ok=True)
    for stale in ("chat.png", "dashboard.png", "failure.png"):
        if os.path.exists(os.path.join(ARGS.artifacts, stale)):
            os.remove(os.path.join(ARGS.artifacts, stale))
    d = driver()
    try:
        try:
            chat_checks(d)
            dashboard_checks(d)
        except Exception:
            d.save_screenshot(os.path.join(ARGS.artifacts, "failure.png"))
            logs = d.get_log("browser") if hasattr(d, "get_log") else []
            print("browser console:", json.dumps(logs, indent=1), file=sys.stderr)
            raise
    finally:
        d.quit()
    for what in CHECKS:
        print(f"ok: {what}")
    print(f"{len(CHECKS)} web UI checks passed; screenshots in {ARGS.artifacts}")


if __name__ == "__main__":
    main()
