"""The checkpoint's own tokenizer: tokenizer.json through the tokenizers library gives the ids transformers'
AutoTokenizer gives for a generic fast tokenizer. In transformers 5.24, tokenizer.json's post-processor
decides BOS / EOS there even when tokenizer_config.json sets add_bos_token / add_eos_token, so tpviz does not
apply them."""
import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from tpviz.live.load.inputs import TextTokenizer

VOCAB = {"<s>": 0, "</s>": 1, "hello": 2, "world": 3, "again": 4, "<unk>": 5}


def _folder(tmp_path, config: dict | None, template: bool):
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if template:  # tokenizer.json itself adds <s> (as Llama-3's and Gemma's do)
        tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 $B:1",
                                                           special_tokens=[("<s>", 0)])
    tok.save(str(tmp_path / "tokenizer.json"))
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
             "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True}, **config}))
    return tmp_path


@pytest.mark.parametrize("config, template", [
    (None, True), (None, False), ({}, True),  # no flags: tokenizer.json's own post-processor
    ({"add_bos_token": True}, False), ({"add_bos_token": False}, True),  # transformers leaves the template
    ({"add_bos_token": True, "add_eos_token": True}, False), ({"add_eos_token": True}, True)])
def test_bos_and_eos_as_transformers_adds_them(tmp_path, config, template):
    from transformers import AutoTokenizer
    folder = _folder(tmp_path, config, template)
    want = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)("hello world again")["input_ids"]
    assert TextTokenizer(folder).encode("hello world again") == want
    assert [i for i in want if i > 1] == [2, 3, 4]  # the words themselves, between any <s> and </s>
