"""``lmforge serve`` in two processes (``serve/split.py``): the engine steps where the model was loaded, the HTTP
server runs in a process forked from it, and the two speak over a pipe. What the tests hold:

- answers through the HTTP process are the engine's own: concurrent greedy replies each equal to the same question
  asked alone; stop strings, the attention page (a job run in the engine's process) and /metrics' engine figures
  come through the pipe; the server is one process with one child;
- either process ending ends the other, with a clear line, never a hang: the HTTP process killed, the command
  exits non-zero naming it; the engine's process killed, a stream in flight ends with an error event and the HTTP
  process closes its port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'lmforge[serve]')")
requests = pytest.importorskip("requests", reason="requests (dev extra) sends the raw HTTP requests")

from serve_helpers import chat_model, free_port  # noqa: E402
from test_serve import QUESTION, alone, concurrently  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, single_thread):
    return chat_model(tmp_path_factory.mktemp("split") / "chat-model")


def start(model_dir: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """``lmforge serve`` as a user starts it; (the process, its URL) once /health answers."""
    port = free_port()
    src = str(Path(__file__).resolve().parents[1] / "src")  # first, then what the caller's PYTHONPATH names
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "lmforge.cli", "serve", "--model", str(model_dir), "--port",
                             str(port), "--threads", "1", "--http-process", *flags], env=env,
                            stderr=subprocess.PIPE, text=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    while True:
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except requests.exceptions.ConnectionError:
            assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
            time.sleep(0.2)


def children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
            for c in (t / "children").read_text().split()]


def stop(proc: subprocess.Popen) -> None:
    for pid in [*children(proc.pid), proc.pid] if proc.poll() is None else []:
        os.kill(pid, signal.SIGKILL)
    proc.wait(30)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from Linux's /proc")
def test_answers_through_the_http_process_are_the_engines_own(model_dir):
    proc, url = start(model_dir, "--slots", "8")
    try:
        assert len(children(proc.pid)) == 1  # the HTTP process
        questions = [[{"role": "user", "content": f"question {i}: what is {i} plus {i}?"}] for i in range(8)]
        assert concurrently(url, questions, 12) == [alone(model_dir, q, 12) for q in questions]
        cut = requests.post(f"{url}/v1/completions", json={"prompt": "the cat", "max_tokens": 12, "stop": ["e"]})
        assert cut.status_code == 200 and "e" not in cut.json()["choices"][0]["text"]
        page = requests.post(f"{url}/v1/attention", json={"messages": QUESTION}, timeout=60)
        assert page.status_code == 200 and page.text.startswith("<!DOCTYPE html>")
        metrics = dict(line.split() for line in requests.get(f"{url}/metrics").text.splitlines()
                       if line.startswith("lmforge_engine") or line.startswith("lmforge_slots "))
        assert int(metrics["lmforge_engine_steps_total"]) > 8 and metrics["lmforge_slots"] == "8"
    finally:
        stop(proc)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from Linux's /proc")
def test_the_http_process_killed_ends_the_command_with_one_line(model_dir):
    proc, _ = start(model_dir)
    try:
        (http,) = children(proc.pid)
        os.kill(http, signal.SIGKILL)
        assert proc.wait(30) != 0
        errors = [line for line in proc.stderr.read().splitlines() if line.startswith("lmforge: error")]
        assert errors == ["lmforge: error: the HTTP process ended by SIGKILL"]
    finally:
        stop(proc)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from Linux's /proc")
def test_the_engines_process_killed_ends_the_streams_and_the_http_process(model_dir):
    proc, url = start(model_dir)
    (http,) = children(proc.pid)
    try:
        with requests.post(f"{url}/v1/chat/completions", stream=True, timeout=60, json={
                "messages": QUESTION, "stream": True, "max_tokens": 200, "temperature": 0}) as r:
            lines = r.iter_lines(decode_unicode=True)
            next(lines)
            os.kill(proc.pid, signal.SIGKILL)
            rest = [json.loads(line[6:]) for line in lines if line and line != "data: [DONE]"]
        assert "the engine's process ended" in rest[-1]["error"]["message"]
        deadline = time.monotonic() + 30
        while Path(f"/proc/{http}").exists() and Path(f"/proc/{http}/stat").read_text().split()[2] != "Z":
            assert time.monotonic() < deadline, "the HTTP process outlived its engine"
            time.sleep(0.2)
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"{url}/health", timeout=5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(http, signal.SIGKILL)
        proc.wait(30)


@pytest.mark.parametrize("cores,threads,asked,split", [(2, 2, None, False), (2, 1, None, True), (16, 8, None, True),
                                                       (2, 2, True, True), (16, 8, False, False)])
def test_the_http_process_is_the_default_when_a_core_is_left_beside_the_engine(monkeypatch, cores, threads,
                                                                                asked, split):
    import types

    import torch

    from lmforge.serve.process import http_process
    from lmforge.workflows.options import ServeOptions

    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    engine = types.SimpleNamespace(engine=object())
    assert http_process(engine, ServeOptions(http_process=asked)) is split
    assert http_process(types.SimpleNamespace(engine=None), ServeOptions(http_process=True)) is False  # an encoder
