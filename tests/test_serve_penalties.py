"""OpenAI's presence and frequency penalties, logit_bias and n (issue 38, item 4), per row in the batched step.

- the engine follows the formula: z_v + b_v - c_v·α_frequency - [c_v > 0]·α_presence, c_v the times v was
  generated (the prompt not counted): its greedy tokens equal a reference loop over one forward pass a token;
- rows with other settings beside it change nothing (the same tokens alone and in a batch of four);
- through the server: the fields are read, a bias of +100 makes its token the only one, bad values are 400s.
"""

from __future__ import annotations

import threading

import pytest
import torch

from lmforge.generation.lm import LM
from lmforge.generation.requests import Request
from serve_helpers import chat_model, live_server

requests = pytest.importorskip("requests", reason="requests (dev extra) sends the raw HTTP requests")
pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'lmforge[serve]')")


@pytest.fixture(scope="module")
def folder(tmp_path_factory, single_thread):
    return chat_model(tmp_path_factory.mktemp("penalties") / "chat-model")


def reference(model, prompt: list[int], n: int, presence: float, frequency: float, bias: dict[int, float]):
    tokens: list[int] = []
    counts: dict[int, int] = {}
    for _ in range(n):
        with torch.no_grad():
            z = model(torch.tensor([prompt + tokens])).logits[0, -1].double().clone()
        for t, b in bias.items():
            z[t] += b
        for t, c in counts.items():
            z[t] -= c * frequency + presence
        token = int(z.argmax())
        tokens.append(token)
        counts[token] = counts.get(token, 0) + 1
    return tokens


SETTINGS = [dict(presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None),
            dict(presence_penalty=1.2, frequency_penalty=0.0, logit_bias=None),
            dict(presence_penalty=0.0, frequency_penalty=1.5, logit_bias={7: 3.0, 11: -5.0}),
            dict(presence_penalty=-0.5, frequency_penalty=0.8, logit_bias={20: 1.0})]


def test_the_engine_follows_openais_formula_alone_and_batched(folder):
    import lmforge

    model, tok = lmforge.load(folder)
    prompt = tok.encode("the cat sat on the mat and the dog", add_special_tokens=False).ids
    lm = LM(model.eval(), tok, slots=4)
    asks = [Request(prompt, max_new_tokens=12, stop_ids=[], **s) for s in SETTINGS]
    together = [g.tokens for g in lm.run(asks)]
    alone = [lm.run([a])[0].tokens for a in asks]
    assert together == alone
    for s, got in zip(SETTINGS, alone, strict=True):
        assert got == reference(model, prompt, 12, s["presence_penalty"], s["frequency_penalty"], s["logit_bias"] or {})
    assert len(set(map(tuple, alone))) > 1  # the settings change the text: the test can tell them apart



def test_a_slot_keeps_nothing_of_its_last_requests_penalties(folder):
    """A request without bias or penalties, taken into a slot a penalised one left, beside a penalised one (so that
    the step adds the slots' shifts): its own greedy tokens (the slot's old counts were once added to it)."""
    import lmforge

    model, tok = lmforge.load(folder)
    prompt = tok.encode("the cat sat on the mat and the dog", add_special_tokens=False).ids
    lm = LM(model.eval(), tok, slots=2)
    plain, *penalised = [Request(prompt, max_new_tokens=12, stop_ids=[], **s) for s in SETTINGS]
    lm.run([penalised[2]])  # slot 0 now holds its counts and bias
    got = lm.run([plain, penalised[0]])
    assert got[0].tokens == reference(model, prompt, 12, 0.0, 0.0, {})
    assert got[1].tokens == reference(model, prompt, 12, 1.2, 0.0, {})

def test_the_server_reads_them_and_refuses_bad_ones(folder):
    with live_server(folder, slots=4) as (url, service):
        token = service.tokenizer.vocab.get("Ġcat", 50)
        forced = requests.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 5, "temperature": 0,
                                                              "logit_bias": {str(token): 100}}).json()
        assert forced["choices"][0]["text"] == service.tokenizer.decode([token] * 5)
        bodies = [{"prompt": "the dog", "max_tokens": 8, "temperature": 0, "presence_penalty": p,
                   "frequency_penalty": f} for p, f in ((0, 0), (1.5, 0), (0, 2), (-1, 1))]
        alone = [requests.post(f"{url}/v1/completions", json=b).json()["choices"][0]["text"] for b in bodies]
        together: list = [None] * 4

        def ask(i: int) -> None:
            together[i] = requests.post(f"{url}/v1/completions", json=bodies[i]).json()["choices"][0]["text"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert together == alone
        bad = [({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
               ({"logit_bias": {"abc": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
               ({"logit_bias": {"999999": 1}}, "logit_bias")]
        for body, param in bad:
            r = requests.post(f"{url}/v1/completions", json={"prompt": "hello", **body})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_n_choices_are_the_same_request_seeded_k_apart(folder):
    with live_server(folder, slots=4) as (url, _):
        body = {"prompt": "the cat", "max_tokens": 8, "temperature": 1.0, "seed": 40}
        many = requests.post(f"{url}/v1/completions", json={**body, "n": 3}).json()
        alone = [requests.post(f"{url}/v1/completions", json={**body, "seed": 40 + k}).json() for k in range(3)]
        assert [c["text"] for c in many["choices"]] == [a["choices"][0]["text"] for a in alone]
        assert [c["index"] for c in many["choices"]] == [0, 1, 2]
        assert many["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"]  # the prompt counted once
        assert many["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone)
        assert len({c["text"] for c in many["choices"]}) > 1
        chat = requests.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hello"}], "n": 2, "temperature": 0, "max_tokens": 4}).json()
        assert len(chat["choices"]) == 2 and chat["choices"][0]["message"] == chat["choices"][1]["message"]


def test_n_choices_stream_together_each_with_its_index(folder):
    """stream with n: the chunks of the n choices interleave, each carrying its index; each choice reassembled is
    the non-streamed one, one usage chunk counts the prompt once, and one [DONE] ends the stream (chat and
    completions, through the openai client)."""
    import openai

    with live_server(folder, slots=4) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        settings = dict(max_tokens=8, temperature=1.0, seed=7, n=3)
        whole = client.completions.create(model=model, prompt="the cat", **settings)
        texts, usage = ["", "", ""], []
        for chunk in client.completions.create(model=model, prompt="the cat", stream=True,
                                               stream_options={"include_usage": True}, **settings):
            for choice in chunk.choices:
                texts[choice.index] += choice.text
            if chunk.usage is not None:
                usage.append(chunk.usage)
        assert texts == [c.text for c in whole.choices] and len(set(texts)) > 1
        assert len(usage) == 1 and usage[0].prompt_tokens == whole.usage.prompt_tokens
        assert usage[0].completion_tokens == whole.usage.completion_tokens
        chat = {"messages": [{"role": "user", "content": "hello"}], **settings}
        whole = client.chat.completions.create(model=model, **chat)
        parts, reasons = ["", "", ""], [None] * 3
        for chunk in client.chat.completions.create(model=model, stream=True, **chat):
            for choice in chunk.choices:
                parts[choice.index] += choice.delta.content or ""
                reasons[choice.index] = choice.finish_reason or reasons[choice.index]
        assert parts == [c.message.content for c in whole.choices]
        assert reasons == [c.finish_reason for c in whole.choices]
        with requests.post(f"{url}/v1/completions", stream=True, json={"prompt": "the cat", "stream": True,
                                                                        **settings}) as r:
            lines = [line for line in r.iter_lines(decode_unicode=True) if line]
        assert lines.count("data: [DONE]") == 1 and lines[-1] == "data: [DONE]"
