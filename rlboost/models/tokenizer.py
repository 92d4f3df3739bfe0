"""A byte-level tokenizer built in code, so tiny models can read and write text with no download.

It is a real `PreTrainedTokenizerFast` (the `tokenizers` BPE model with no merges over GPT-2's
byte alphabet): every UTF-8 byte is one token, any text round-trips, and it carries a chat template,
so a tiny model goes through exactly the prompt and decode path of a real checkpoint.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models
from tokenizers.pre_tokenizers import ByteLevel
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: the pad/bos/eos ids of the tiny model configs

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """3 special tokens then the 256 byte symbols: a vocabulary of 259."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                        eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
