"""The tokenizer's routes (/tokenize, /detokenize, /tokenizer_info: vLLM's and llama.cpp's shapes) and
lm-evaluation-harness scoring a multiple-choice task through ``lmforge serve`` (issue 38: a real client).

lm-eval's ``local-completions`` finds the remote tokenizer, tokenizes each context and choice through /tokenize,
and sends token ids with ``echo`` and ``logprobs``; its accuracy must equal ``lmforge evaluate --tasks`` on the same
items (the prompt is the chat template's rendering, written out as text, so both score the same tokens).
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'lmforge[serve]')")
requests = pytest.importorskip("requests", reason="requests (dev extra) sends the raw HTTP requests")

from serve_helpers import chat_model, live_server  # noqa: E402

WORDS = ["cat", "dog", "mat", "tree", "paris", "france", "hello", "fine", "thanks", "slept", "under", "capital"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, single_thread):
    folder = chat_model(tmp_path_factory.mktemp("tokenizer") / "chat-model")
    with live_server(folder, slots=4) as (url, service):
        yield url, service, folder


def test_tokenize_and_detokenize_in_both_shapes(served):
    url, service, _ = served
    text = "<|im_start|>user\nthe cat sat<|im_end|>"
    vllm = requests.post(f"{url}/tokenize", json={"prompt": text}).json()
    assert vllm["tokens"] == service.tokenizer.encode(text).ids and vllm["count"] == len(vllm["tokens"])
    assert vllm["tokens"][0] == service.tokenizer.vocab["<|im_start|>"]  # a name written out is the token
    llama = requests.post(f"{url}/tokenize", json={"content": text, "with_pieces": True}).json()
    assert [p["id"] for p in llama["tokens"]] == vllm["tokens"] and llama["tokens"][0]["piece"] == "<|im_start|>"
    back = requests.post(f"{url}/detokenize", json={"tokens": vllm["tokens"]}).json()
    assert back["prompt"] == back["content"] == text
    info = requests.get(f"{url}/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and info["model_max_length"] == 256 and "im_start" in info["chat_template"]
    for route, body, param in [("tokenize", {}, "prompt"), ("tokenize", {"prompt": "a", "content": "b"}, "prompt"),
                               ("detokenize", {"tokens": [10**6]}, "tokens"),
                               ("detokenize", {"tokens": "x"}, "tokens")]:
        r = requests.post(f"{url}/{route}", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_the_tokenizer_routes_need_the_key(tmp_path, single_thread):
    with live_server(chat_model(tmp_path / "m"), api_key="sesame") as (url, _):
        assert requests.post(f"{url}/tokenize", json={"prompt": "x"}).status_code == 401
        assert requests.get(f"{url}/tokenizer_info").status_code == 401
        ok = requests.post(f"{url}/tokenize", json={"prompt": "x"}, headers={"Authorization": "Bearer sesame"})
        assert ok.status_code == 200


def items(n: int = 20) -> list[dict]:
    rng = random.Random(7)
    out = []
    for k in range(n):
        choices = rng.sample(WORDS, 3)
        out.append({"messages": [{"role": "user", "content": f"question {k}: which word? {' '.join(choices)}"}],
                    "choices": choices, "answer": choices[k % 3]})
    return out


def test_lm_eval_harness_scores_through_the_server_as_evaluate_does(served, tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness (dev extra) is the real client")
    from lm_eval.tasks import TaskManager

    import lmforge
    from lmforge.tokenizers.chat import ChatFormat
    from lmforge.workflows.chat_eval import evaluate_tasks

    url, _, folder = served
    mine = tmp_path / "test.jsonl"
    mine.write_text("".join(json.dumps(i) + "\n" for i in items()))
    model, tok = lmforge.load(folder)
    ours = evaluate_tasks(model, tok, mine, SimpleNamespace(limit=0, shots=0, normalization="none", batch_size=8,
                                                            seed=0, max_new_tokens=8))
    fmt = ChatFormat(tok)
    theirs = tmp_path / "lmeval.jsonl"
    rows = []
    for item in items():
        ids = fmt.prompt_ids(item["messages"])
        text = tok.decode(ids)  # the rendered prompt, its markers written out
        assert requests.post(f"{url}/tokenize", json={"prompt": text}).json()["tokens"] == ids
        rows.append({"prompt": text, "choices": item["choices"], "gold": item["choices"].index(item["answer"])})
    theirs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "lmforge_mc.yaml").write_text(
        "task: lmforge_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {theirs}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{prompt}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{gold}}\"\ntarget_delimiter: \"\"\n"
        "metric_list:\n  - metric: acc\n")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    result = lm_eval.simple_evaluate(
        model="local-completions", tasks=["lmforge_mc"], task_manager=TaskManager(include_path=str(tasks)),
        model_args=f"model=chat-model,base_url={url}/v1/completions,tokenizer_backend=remote,num_concurrent=1,"
                   "max_retries=1,max_length=256")
    assert result["results"]["lmforge_mc"]["acc,none"] == pytest.approx(ours["accuracy"]["none"], abs=1e-9)
    assert 0 < ours["accuracy"]["none"] < 1  # a test that can tell two scorers apart
