"""Chat templates (tokenizers/chat.py) against transformers' apply_chat_template; the chat workflow and command."""

from __future__ import annotations

import json

import pytest

from lmforge.errors import LmforgeError
from lmforge.tokenizers.chat import ChatTemplate

transformers = pytest.importorskip("transformers", reason="transformers (dev extra) is the oracle of the templates")

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
          "{% endfor %}")
RICH = ("{%- set ns = namespace(system='', n=0) -%}{%- macro turn(role, text) -%}"
        "{{ '<|' ~ role ~ '|>' }}{{ text | trim }}{{ eos_token }}{%- endmacro -%}"
        "{%- if messages[0].role == 'system' %}{% set ns.system = messages[0].content %}"
        "{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif -%}"
        "{{ bos_token }}{% if ns.system is defined and ns.system %}{{ turn('system', ns.system) }}{% endif %}"
        "{%- for m in rest %}{% set ns.n = ns.n + 1 %}{% if m.role == 'assistant' and m.content.startswith(' ') %}"
        "{{ raise_exception('no leading space') }}{% endif %}{{ turn(m.role, m.content | replace('😀', ':)')) }}"
        "{{ '[%d/%d]' % (loop.index, loop.length) }}{% if not loop.last %}\n{% endif %}{% endfor %}"
        "{{ '\n' ~ (rest | selectattr('role', 'equalto', 'user') | list | length) ~ ' asked, ' ~ ns.n ~ ' turns' }}"
        "{{ {'roles': rest | map(attribute='role') | list} | tojson }}"
        "{%- if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}],
    [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "6, naïvely 😀"},
     {"role": "user", "content": "  spaces  "}],
]


def hf_tokenizer(template: str):
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", chat_template=template)


@pytest.mark.parametrize("template", [CHATML, LLAMA2, RICH], ids=["chatml", "llama2", "rich"])
@pytest.mark.parametrize("generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_rendering_is_byte_identical_to_transformers(template, generation_prompt, conversation):
    messages = CONVERSATIONS[conversation]
    if template == LLAMA2 and messages[-1]["role"] == "user" and generation_prompt and conversation == 2:
        pass  # Llama-2's template ignores the flag: still compared
    expected = hf_tokenizer(template).apply_chat_template(messages, tokenize=False,
                                                          add_generation_prompt=generation_prompt)
    got = ChatTemplate(template, {"bos_token": "<s>", "eos_token": "</s>"}).render(messages, generation_prompt)
    assert got == expected


def test_assistant_spans_cover_each_reply_and_its_end_of_turn_marker():
    messages = CONVERSATIONS[2][:4]
    template = ChatTemplate(CHATML)
    text = template.render(messages)
    assert [text[a:b] for a, b in template.assistant_spans(messages)] == ["4.<|im_end|>", "6, naïvely 😀<|im_end|>"]
    llama = ChatTemplate(LLAMA2, {"bos_token": "<s>", "eos_token": "</s>"})
    text = llama.render(messages)
    assert [text[a:b] for a, b in llama.assistant_spans(messages)] == [" 4. </s>", " 6, naïvely 😀 </s>"]


@pytest.mark.parametrize(("template", "messages", "message"), [
    (LLAMA2, [{"role": "assistant", "content": "x"}], "chat template: Conversation roles must alternate"),
    ("{% for m in messages %}{{ m.content }", CONVERSATIONS[0], "chat template: syntax error at line 1"),
    (CHATML, [{"role": "wizard", "content": "x"}], r"messages\[0\]\.role: 'wizard' is not one of"),
    (CHATML, [{"role": "user", "content": ["a list"]}], r"messages\[0\]\.content: expected a string"),
    (CHATML, [], "messages: expected a non-empty list"),
])
def test_bad_templates_and_conversations_are_one_line(template, messages, message):
    with pytest.raises(LmforgeError, match=message):
        ChatTemplate(template, {"bos_token": "<s>", "eos_token": "</s>"}).render(messages)


def test_a_template_cannot_run_code():
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(LmforgeError, match="chat template"):
        ChatTemplate(escape).render(CONVERSATIONS[0])
    imports = "{{ ''.__class__.__base__.__subclasses__()[0].__init__.__globals__['sys'] }}"
    with pytest.raises(LmforgeError, match="chat template"):
        ChatTemplate(imports).render(CONVERSATIONS[0])


# -- SmolLM2's own template ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_tokenizers():
    from lmforge.data.sources import smollm2_path
    from lmforge.interop.gguf import gguf_tokenizer, read_gguf

    path = smollm2_path()
    ours = gguf_tokenizer(read_gguf(path))
    ours.chat_template = read_gguf(path).chat_template
    return ours, transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.slow
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_smollm2_template_renders_and_encodes_as_transformers(smollm2_tokenizers, conversation):
    from lmforge.workflows.chat import ChatFormat

    ours, theirs = smollm2_tokenizers
    fmt = ChatFormat(ours)
    for prompt in (False, True):
        expected = theirs.apply_chat_template(CONVERSATIONS[conversation], tokenize=False,
                                              add_generation_prompt=prompt)
        assert fmt.render(CONVERSATIONS[conversation], prompt) == expected
        assert fmt.encode(expected) == theirs(expected, add_special_tokens=False)["input_ids"]
        assert fmt.conversation_ids(CONVERSATIONS[conversation], prompt) == fmt.encode(expected)  # what is served
    assert fmt.stop_ids == [ours.token_to_id("<|im_end|>")]


def test_chat_command_answers_json_lines_without_a_terminal(tmp_path, capsys, monkeypatch):
    """A tiny decoder with a ChatML template: one answer line per conversation line, greedy = the API's."""
    import io

    import torch

    from lmforge.cli import main
    from lmforge.models import Decoder, get_preset, save_pretrained
    from lmforge.tokenizers import ByteLevelBPETokenizer
    from lmforge.workflows.chat import chat

    tok = ByteLevelBPETokenizer.train(["user assistant system hello there"] * 3, 270, 1,
                                      special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.set_role("eos", "<|im_end|>")
    tok.chat_template = CHATML
    torch.manual_seed(0)
    model = Decoder(get_preset("gpt-tiny", vocab_size=tok.vocab_size, eos_id=tok.eos_id, dropout=0.0,
                               attention_dropout=0.0, max_positions=256)).eval()
    save_pretrained(model, tmp_path / "m", tok)
    lines = [json.dumps({"messages": c}) for c in CONVERSATIONS[:2]]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("\n".join(lines).encode())))
    assert main(["chat", "--model", str(tmp_path / "m"), "--max-new-tokens", "12"]) == 0
    answers = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    from lmforge.generation.options import GenerateOptions

    assert [a["reply"] for a in answers] == [chat(model, tok, c, GenerateOptions(max_new_tokens=12))
                                             for c in CONVERSATIONS[:2]]
    assert all(a["finish_reason"] in ("stop", "length") for a in answers)
