"""``lmforge serve`` against a live server on 127.0.0.1, with the official ``openai`` client: chat, completions,
streaming, embeddings, errors, limits, continuous batching, disconnects, SIGTERM; and SmolLM2 (slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'lmforge[serve]')")
openai = pytest.importorskip("openai", reason="the openai client is the tests' peer (dev extra)")
requests = pytest.importorskip("requests", reason="requests (dev extra) sends the raw HTTP requests")

from serve_helpers import chat_model, free_port, live_server  # noqa: E402

QUESTION = [{"role": "user", "content": "what is the capital of france?"}]
MODEL = "chat-model"  # the folder chat_model writes: the name the server serves


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, single_thread):
    return chat_model(tmp_path_factory.mktemp("serve") / "chat-model")


@pytest.fixture(scope="module")
def server(model_dir):
    with live_server(model_dir, slots=16, max_queue=64) as (url, service):
        yield url, service


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def alone(model_dir: Path, messages: list[dict], n: int) -> str:
    """The same greedy reply from the Python API, no server."""
    import lmforge
    from lmforge.generation.options import GenerateOptions
    from lmforge.workflows.chat import chat

    model, tok = lmforge.load(model_dir)
    return chat(model, tok, messages, GenerateOptions(max_new_tokens=n, temperature=0.0))


def concurrently(url: str, questions: list[list[dict]], n: int) -> list[str | None]:
    """The greedy replies (up to n tokens) to all the questions asked at once, one client thread each."""
    replies: list[str | None] = [None] * len(questions)

    def ask(i: int) -> None:
        replies[i] = client(url).chat.completions.create(model=MODEL, messages=questions[i], temperature=0,
                                                         max_tokens=n).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return replies


def test_chat_completion_equals_the_python_api(server, model_dir):
    url, service = server
    answer = client(url).chat.completions.create(model="chat-model", messages=QUESTION, temperature=0, max_tokens=12)
    assert answer.choices[0].message.content == alone(model_dir, QUESTION, 12) and answer.object == "chat.completion"
    assert answer.choices[0].finish_reason == "length"  # the model's end of turn is unlikely early (chat_model)
    prompt = len(service.chat_ids(QUESTION))  # the conversation through the template: system turn + question
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == \
        (prompt, 12, prompt + 12)


def test_streaming_gives_the_same_text_in_pieces(server):
    url, _ = server
    whole = client(url).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=16)
    pieces = [c.choices[0].delta.content or "" for c in client(url).chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=16, stream=True) if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content and len([p for p in pieces if p]) > 1
    with requests.post(f"{url}/v1/chat/completions", stream=True, json={"messages": QUESTION, "stream": True,
                      "max_tokens": 4, "temperature": 0, "stream_options": {"include_usage": True}}) as r:
        lines = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert lines[-1] == "data: [DONE]"
    usage, last = json.loads(lines[-2][6:]), json.loads(lines[-3][6:])  # the usage chunk, after the last choice
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert last["choices"][0]["finish_reason"] == "length"


def test_completions_and_stop_strings(server):
    url, _ = server
    c = client(url)
    free = c.completions.create(model=MODEL, prompt="the cat sat", temperature=0, max_tokens=20).choices[0]
    assert free.text and c.completions.create(model=MODEL, prompt=["the cat sat"], temperature=0,
                                              max_tokens=20).choices[0].text == free.text
    stop = free.text[3:6]
    cut = c.completions.create(model=MODEL, prompt="the cat sat", temperature=0, max_tokens=20, stop=[stop])
    assert cut.choices[0].text == free.text[: free.text.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(server):
    """The same seed gives the same sample; other seeds other samples (it samples: not greedy, not one fixed
    stream whatever the seed)."""
    url, _ = server
    ask = dict(model=MODEL, messages=QUESTION, temperature=1.0, top_p=0.9, max_tokens=12)
    first = client(url).chat.completions.create(seed=7, **ask).choices[0].message.content
    assert client(url).chat.completions.create(seed=7, **ask).choices[0].message.content == first
    others = {client(url).chat.completions.create(seed=seed, **ask).choices[0].message.content for seed in (8, 9)}
    greedy = client(url).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=12)
    assert len(others | {first}) == 3 and greedy.choices[0].message.content not in others | {first}


def test_sixteen_concurrent_greedy_requests_equal_each_alone(server):
    """Continuous batching on the live server: the answers beside 15 others are the answers alone."""
    url, _ = server
    questions = [[{"role": "user", "content": f"hello there {i}, how are you?"}] for i in range(16)]
    solo = [client(url).chat.completions.create(model=MODEL, messages=q, temperature=0, max_tokens=10)
            .choices[0].message.content for q in questions]
    assert concurrently(url, questions, 10) == solo


def test_compile_on_cpu_makes_one_graph_before_listening_and_answers_as_the_eager_server(server, model_dir):
    """``lmforge serve --compile`` on CPU: the step compiled once at start (compile="dynamic"), then 8 concurrent
    greedy replies are the eager server's."""
    url, _ = server
    questions = [[{"role": "user", "content": f"what is the cat {i}?"}] for i in range(8)]
    eager = [client(url).chat.completions.create(model=MODEL, messages=q, temperature=0, max_tokens=10)
             .choices[0].message.content for q in questions]
    with live_server(model_dir, slots=8, compile=True) as (compiled_url, service):
        assert service.engine.engine.runner.dynamic and service.warmup[0] == 1
        assert concurrently(compiled_url, questions, 10) == eager


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": QUESTION, "frobnicate": 1}, 400, "frobnicate"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ({"messages": QUESTION, "n": 17}, 400, "n"),
    ({"messages": QUESTION, "temperature": 3}, 400, "temperature"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "the cat " * 300}]}, 400, None),
])
def test_bad_requests_are_400_naming_the_field(server, body, status, param):
    url, _ = server
    r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and (param is None or error["param"] == param), error
    with pytest.raises(openai.BadRequestError):
        client(url).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=0)


def test_an_endpoint_the_model_cannot_serve_is_400(server):
    url, _ = server
    for path, body in (("/v1/embeddings", {"input": "x"}), ("/v1/classify", {"input": "x"})):
        r = requests.post(f"{url}{path}", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text


def test_models_health_metrics_and_the_page(server):
    url, _ = server
    models = client(url).models.list()
    assert models.data[0].id == "chat-model"
    assert requests.get(f"{url}/health").json()["status"] == "ok"
    metrics = requests.get(f"{url}/metrics").text
    assert "lmforge_requests_total" in metrics and "lmforge_time_to_first_token_seconds_count" in metrics
    assert "lmforge_slots 16" in metrics
    asked = [{"role": "system", "content": "You answer in one short sentence about the sea and the wind. " * 3},
             {"role": "user", "content": "Hello?"}]
    for _ in range(2):  # the same long beginning twice: the second time it comes from the prefix cache
        client(url).chat.completions.create(model="chat-model", messages=asked, max_tokens=2, temperature=0)
    counts = dict(line.split() for line in requests.get(f"{url}/metrics").text.splitlines()
                  if line.startswith(("lmforge_prefix_", "lmforge_engine_")))
    assert int(counts["lmforge_prefix_cached_tokens_total"]) >= 16
    assert int(counts["lmforge_prefix_computed_tokens_total"]) > 0
    steps, busy = int(counts["lmforge_engine_steps_total"]), float(counts["lmforge_engine_busy_seconds_total"])
    assert steps >= 2 and busy > 0  # each request's prefill step at least; their time counted
    client(url).chat.completions.create(model="chat-model", messages=asked, max_tokens=3, temperature=0)
    after = dict(line.split() for line in requests.get(f"{url}/metrics").text.splitlines()
                 if line.startswith("lmforge_engine_"))
    assert int(after["lmforge_engine_steps_total"]) >= steps + 2  # 3 tokens: the prefill's and two steps
    assert float(after["lmforge_engine_busy_seconds_total"]) > busy
    page = requests.get(f"{url}/").text
    assert "<script>" in page and "http://" not in page.split("<script>")[1]  # no CDN: one self-contained page


def test_disconnects_free_their_slots(server, model_dir):
    """200 clients leave mid-stream: every slot comes back, nothing waits, the server still answers."""
    url, service = server
    for _ in range(200):
        with requests.post(f"{url}/v1/chat/completions", stream=True, json={"messages": QUESTION, "stream": True,
                          "max_tokens": 200}, timeout=30) as r:
            next(r.iter_lines(decode_unicode=True))  # the first event, then hang up
    deadline = time.monotonic() + 30
    while service.load()[:2] != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service.load()[:2] == (0, 0)
    after = client(url).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, temperature=0)
    assert after.choices[0].message.content == alone(model_dir, QUESTION, 3)


def test_api_key_queue_limit_and_body_limit(model_dir):
    from lmforge.generation.engine import Request as EngineRequest

    with live_server(model_dir, slots=1, max_queue=0, api_key="s3cret", max_body=2000) as (url, service):
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").models.list()
        assert requests.get(f"{url}/health").status_code == 200  # not under /v1: open
        c = client(url, "s3cret")
        assert [m.id for m in c.models.list().data] == [MODEL]
        # no queue, one free slot: a request is served
        served = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, temperature=0)
        assert served.choices[0].message.content == alone(model_dir, QUESTION, 3)
        ids = service.chat_ids(QUESTION)
        busy = service.complete(EngineRequest(ids, max_new_tokens=service.context - len(ids), stop_ids=[]))
        deadline = time.monotonic() + 30
        while not busy.tokens and time.monotonic() < deadline:
            time.sleep(0.01)
        r = requests.post(f"{url}/v1/chat/completions", json={"messages": QUESTION},
                       headers={"Authorization": "Bearer s3cret"})  # the one slot is taken: it would wait
        assert not busy.done  # still decoding when the second came
        busy.cancel()
        assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        big = requests.post(f"{url}/v1/chat/completions", headers={"Authorization": "Bearer s3cret"},
                         json={"messages": [{"role": "user", "content": "x" * 3000}]})
        assert big.status_code == 413


def test_a_model_error_fails_that_request_only(server, monkeypatch):
    url, service = server
    engine = service.engine.engine.runner
    real = engine.prefill

    def broken(slots, prompts, start=0):  # a one-token prompt breaks the model
        if any(len(ids) == 1 for ids in prompts):
            raise RuntimeError("boom")
        return real(slots, prompts, start)

    monkeypatch.setattr(engine, "prefill", broken)
    r = requests.post(f"{url}/v1/completions", json={"prompt": "t", "max_tokens": 3})
    assert r.status_code == 500 and "boom" in r.json()["error"]["message"]
    assert requests.post(f"{url}/v1/completions", json={"prompt": "the cat", "max_tokens": 3}).status_code == 200


def test_sigterm_finishes_the_stream_in_flight_then_exits_0(model_dir):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "lmforge.cli", "serve", "--model", str(model_dir), "--port",
                             str(port), "--threads", "1"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{url}/health").status_code == 200:
                    break
            except requests.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with requests.post(f"{url}/v1/chat/completions", stream=True, json={"messages": QUESTION, "stream": True,
                          "max_tokens": 60, "temperature": 0}, timeout=60) as r:
            lines = r.iter_lines(decode_unicode=True)
            next(lines)
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:])["choices"][0] for line in rest[:-1]]
        streamed = "".join(c["delta"].get("content") or "" for c in chunks)
        assert streamed == alone(model_dir, QUESTION, 60) and chunks[-1]["finish_reason"] == "length"  # all of it
        assert proc.wait(60) == 0
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"{url}/health")
        log = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
        assert {"method", "path", "status", "ms"} <= set(log[-1]) and log[-1]["path"] == "/v1/chat/completions"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_port_in_use_is_one_clear_line(model_dir):
    """The HTTP server runs beside the engine (which steps on the main thread): when it cannot listen, the command
    says so in one line and exits non-zero instead of serving nothing."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        done = subprocess.run([sys.executable, "-m", "lmforge.cli", "serve", "--model", str(model_dir), "--port",
                               str(port), "--threads", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("lmforge: error")]
    assert lines == [f"lmforge: error: --host 127.0.0.1 --port {port}: the server could not listen (is the port "
                     "in use?)"]
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_smollm2_answers_through_the_openai_client():
    from lmforge.data.sources import smollm2_path

    with live_server(smollm2_path(), slots=4) as (url, _):
        answer = client(url).chat.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1", temperature=0, max_tokens=30,
            messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
    assert answer.choices[0].message.content == "The capital of France is Paris."


def test_the_start_line_states_the_engines_slots_and_runner(model_dir):
    """--slots 6 on bfloat16 weights (no packed products: rows in multiples of 4) serves 8 slots: the start line
    says 8, not the 6 asked for, after the engine's one line on its runner and shapes."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "lmforge.cli", "serve", "--model", str(model_dir), "--port",
                             str(port), "--threads", "1", "--slots", "6", "--dtype", "bf16"], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while not any(line.startswith("lmforge serve: chat-model on") for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, lines
            lines.append(proc.stderr.readline().strip())
        runner = next(line for line in lines if line.startswith("lmforge: decoding with the"))
        assert "8 slots" in runner and "rows [4, 8]" in runner
        assert f"chat-model on http://127.0.0.1:{port} (8 slots, context 256; HTTP in a" in lines[-1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
