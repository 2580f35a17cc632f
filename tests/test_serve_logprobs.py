"""Log-probabilities through the server (issue 38, item 1): ``logprobs`` / ``top_logprobs`` on chat, ``logprobs``
and ``echo`` on completions, token-id prompts and lists of prompts.

- the numbers are the model's: a reply's log-probabilities equal the log-softmax of one forward pass over
  prompt + reply (float64 reference), an echoed prompt's likewise, and the top alternatives are its largest;
- a request's log-probabilities are the same bits alone and beside seven others (the engine's rows are
  independent), streamed or not;
- a token-id prompt answers as its text; a list of prompts answers each as if alone, in order;
- bad combinations are 400s naming the field.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'lmforge[serve]')")
requests = pytest.importorskip("requests", reason="requests (dev extra) sends the raw HTTP requests")

from lmforge.serve.logprobs import token_bytes  # noqa: E402
from serve_helpers import chat_model, live_server  # noqa: E402

QUESTION = [{"role": "user", "content": "what is the capital of france?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, single_thread):
    folder = chat_model(tmp_path_factory.mktemp("logprobs") / "chat-model")
    with live_server(folder, slots=8) as (url, service):
        yield url, service


def reference(service, ids: list[int]) -> torch.Tensor:
    """log p(ids[t + 1] | ids[:t + 1]) of every position by one forward pass, float64: (T-1, V)."""
    with torch.inference_mode():
        logits = service.model(torch.tensor([ids])).logits[0, :-1]
    return logits.double().log_softmax(-1)


def chat(url: str, **extra) -> dict:
    r = requests.post(f"{url}/v1/chat/completions", json={"messages": QUESTION, "temperature": 0, "max_tokens": 12,
                                                          **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_logprobs_are_the_models_own(served):
    url, service = served
    answer = chat(url, logprobs=True, top_logprobs=3)
    content = answer["choices"][0]["logprobs"]["content"]
    prompt, tokens = service.chat_ids([dict(m) for m in QUESTION]), []
    for entry in content:  # greedy: each listed token is the reference's most likely one after the ones before
        row = reference(service, prompt + tokens + [0])[-1]
        best = row.topk(3)
        token = int(best.indices[0])
        assert bytes(entry["bytes"]) == token_bytes(service.tokenizer, token)
        assert math.isclose(entry["logprob"], float(row[token]), abs_tol=1e-4)
        assert [bytes(t["bytes"]) for t in entry["top_logprobs"]] == \
            [token_bytes(service.tokenizer, int(t)) for t in best.indices]
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(best.values.tolist(), abs=1e-4)
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]  # the chosen token is the best
        tokens.append(token)
    specials = {service.tokenizer.id_to_token[i] for i in service.tokenizer.special_ids}  # listed, not in the text
    assert b"".join(bytes(e["bytes"]) for e in content if e["token"] not in specials).decode(errors="replace") == \
        answer["choices"][0]["message"]["content"]


def test_logprobs_are_the_same_bits_alone_beside_others_and_streamed(served):
    url, _ = served
    questions = [[{"role": "user", "content": f"question {i}: what is {i} plus {i}?"}] for i in range(8)]
    alone = [requests.post(f"{url}/v1/chat/completions", json={"messages": q, "temperature": 0, "max_tokens": 10,
                                                               "logprobs": True, "top_logprobs": 2}).json()
             for q in questions]
    together: list = [None] * 8

    def ask(i: int) -> None:
        together[i] = requests.post(f"{url}/v1/chat/completions", json={
            "messages": questions[i], "temperature": 0, "max_tokens": 10, "logprobs": True, "top_logprobs": 2}).json()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [a["choices"][0]["logprobs"] for a in alone] == [b["choices"][0]["logprobs"] for b in together]
    with requests.post(f"{url}/v1/chat/completions", stream=True, json={
            "messages": questions[3], "temperature": 0, "max_tokens": 10, "logprobs": True, "top_logprobs": 2,
            "stream": True}) as r:
        import json

        chunks = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
                  if line and line != "data: [DONE]"]
    streamed = [e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == alone[3]["choices"][0]["logprobs"]["content"]


def test_echo_gives_the_prompts_logprobs_and_token_ids_answer_as_text(served):
    url, service = served
    text = "the cat sat on the mat"
    ids = service.prompt_ids(text)
    r = requests.post(f"{url}/v1/completions", json={"prompt": text, "echo": True, "max_tokens": 0, "logprobs": 2})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == text and r.json()["usage"]["completion_tokens"] == 0
    columns = choice["logprobs"]
    assert columns["token_logprobs"][0] is None and columns["top_logprobs"][0] is None
    ref = reference(service, ids)
    assert columns["token_logprobs"][1:] == pytest.approx([float(ref[t, i]) for t, i in enumerate(ids[1:])], abs=1e-4)
    assert "".join(columns["tokens"]) == text and columns["text_offset"][0] == 0
    by_ids = requests.post(f"{url}/v1/completions", json={"prompt": ids, "echo": True, "max_tokens": 0, "logprobs": 2})
    assert by_ids.json()["choices"][0]["logprobs"] == columns


def test_a_list_of_prompts_answers_each_as_alone_in_order(served):
    url, _ = served
    prompts = ["the cat", "hello there", "the dog slept"]
    alone = [requests.post(f"{url}/v1/completions", json={"prompt": p, "max_tokens": 6, "temperature": 0,
                                                           "logprobs": 1}).json()["choices"][0] for p in prompts]
    many = requests.post(f"{url}/v1/completions", json={"prompt": prompts, "max_tokens": 6, "temperature": 0,
                                                        "logprobs": 1}).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert [{k: c[k] for k in ("text", "logprobs")} for c in many["choices"]] == \
        [{k: c[k] for k in ("text", "logprobs")} for c in alone]
    echoed = requests.post(f"{url}/v1/completions", json={"prompt": "the cat", "max_tokens": 6, "temperature": 0,
                                                          "echo": True}).json()["choices"][0]
    assert echoed["text"] == "the cat" + alone[0]["text"] and echoed["logprobs"] is None


@pytest.mark.parametrize("route,body,param", [
    ("chat/completions", {"messages": QUESTION, "top_logprobs": 2}, "top_logprobs"),
    ("chat/completions", {"messages": QUESTION, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("completions", {"prompt": "the cat", "logprobs": 21}, "logprobs"),
    ("completions", {"prompt": "the cat", "max_tokens": 0}, "max_tokens"),
    ("completions", {"prompt": ["a", "b"], "stream": True}, "stream"),
    ("completions", {"prompt": [1, 2, 99999]}, "prompt"),
    ("completions", {"prompt": [[1, 2], []]}, "prompt"),
])
def test_bad_logprob_requests_are_400_naming_the_field(served, route, body, param):
    url, _ = served
    r = requests.post(f"{url}/v1/{route}", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_the_openai_client_reads_them(served):
    openai = pytest.importorskip("openai", reason="the openai client is the tests' peer (dev extra)")
    url, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    answer = client.chat.completions.create(model="chat-model", messages=QUESTION, logprobs=True, top_logprobs=3,
                                            temperature=0, max_tokens=8)
    content = answer.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    legacy = client.completions.create(model="chat-model", prompt="the cat sat", echo=True, max_tokens=0, logprobs=1)
    assert legacy.choices[0].logprobs.token_logprobs[0] is None and legacy.choices[0].text == "the cat sat"
