"""Tokenizer training and harmony rendering for the tiny pair.

The tokenizer is a byte-level BPE in the layout of gpt-oss's tokenizer.json: the o200k
pre-tokenizer Split regex followed by a ByteLevel step without its own regex, a ByteLevel
decoder, `ignore_merges` (a whole piece that is in the vocabulary is emitted as is, as tiktoken
does), and the harmony special tokens as added special tokens after the ordinary ids, in
o200k_harmony's order (<|startoftext|>, <|endoftext|>, two reserved, <|return|>, ... ,
<|endofprompt|>), so `<|reserved_N|>` names carry their own id as harmony's do.

Rendering reproduces the project's C renderer (models/harmony.c) token for token: special
tokens are placed by id, and the role name, the channel name and each content are encoded as
separate texts.
"""

import json
import os

# The o200k_base / o200k_harmony pre-tokenizer regex (gpt-oss facts §5.1), as gpt-oss's
# tokenizer.json writes it.
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# o200k_harmony's specials 199998..200018 in id order; None = reserved (named by its id).
SPECIALS = ["<|startoftext|>", "<|endoftext|>", None, None, "<|return|>", "<|constrain|>", None,
            "<|channel|>", "<|start|>", "<|end|>", "<|message|>", None, None, None, "<|call|>",
            None, None, None, None, None, "<|endofprompt|>"]

IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"


def system_content(effort):
    """The system message content exactly as harmony (and models/harmony.c) renders it."""
    return ("%s\nKnowledge cutoff: %s\n\nReasoning: %s\n\n# Valid channels: analysis, "
            "commentary, final. Channel must be included for every message."
            % (IDENTITY, KNOWLEDGE_CUTOFF, effort))


def training_texts(convs):
    """Every text the renderer encodes for these conversations (for tokenizer training)."""
    for c in convs:
        yield system_content(c["effort"])
        yield "system"
        for t in c["turns"]:
            yield "user"
            yield t["user"]
            yield "assistant"
            yield "analysis"
            yield t["analysis"]
            yield "assistant"
            yield "final"
            yield t["final"]


def train_tokenizer(texts, bpe_size):
    """A byte-level BPE with `bpe_size` ordinary ids (the 256 byte characters included) and the
    harmony specials after them. Returns a tokenizers.Tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=bpe_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    n = tok.get_vocab_size()
    names = [s if s else "<|reserved_%d|>" % (n + i) for i, s in enumerate(SPECIALS)]
    added = tok.add_special_tokens(names)
    assert added == len(names)
    for i, name in enumerate(names):
        assert tok.token_to_id(name) == n + i, name
    return tok


def save_tokenizer_files(tok, outdir, model_max_length):
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json as in gpt-oss's repo."""
    tok.save(os.path.join(outdir, "tokenizer.json"))
    # Pretty-print tokenizer.json like the hub copy (tokenizers writes one line).
    path = os.path.join(outdir, "tokenizer.json")
    with open(path) as f:
        obj = json.load(f)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    decoder = {}
    for name, tid in sorted(tok.get_added_tokens_decoder().items()):
        decoder[str(name)] = {"content": tid.content, "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False, "special": True}
    cfg = {
        "added_tokens_decoder": decoder,
        "bos_token": "<|startoftext|>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|return|>",
        "extra_special_tokens": {},
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(outdir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|startoftext|>", "eos_token": "<|return|>",
                   "pad_token": "<|endoftext|>"}, f, indent=2)
        f.write("\n")


class Renderer:
    """Harmony rendering to ids, as models/harmony.c does it."""

    def __init__(self, tok):
        from tokenizers import Tokenizer
        if isinstance(tok, str):
            tok = Tokenizer.from_file(tok)
        self.tok = tok
        self.sp = {n: tok.token_to_id(n) for n in
                   ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>",
                    "<|call|>", "<|constrain|>", "<|endoftext|>"]}
        for n, i in self.sp.items():
            assert i is not None, "the tokenizer has no special token %s" % n
        self._cache = {}

    def enc(self, text):
        if text in self._cache:
            return self._cache[text]
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if len(self._cache) < 64:  # role/channel names and the three system contents
            self._cache[text] = ids
        return ids

    def message(self, role, channel, content_ids):
        out = [self.sp["<|start|>"]] + self.enc(role)
        if channel is not None:
            out += [self.sp["<|channel|>"]] + self.enc(channel)
        return out + [self.sp["<|message|>"]] + list(content_ids) + [self.sp["<|end|>"]]

    def prompt(self, effort, history, user, enc=None):
        """history: earlier (user, final) pairs; user: the turn to answer."""
        enc = enc or self.enc
        ids = self.message("system", None, self.enc(system_content(effort)))
        for u, f in history:
            ids += self.message("user", None, enc(u))
            ids += self.message("assistant", "final", enc(f))
        ids += self.message("user", None, enc(user))
        return ids + [self.sp["<|start|>"]] + self.enc("assistant")

    def completion(self, analysis, final, enc=None):
        """What the model generates after the prompt: the analysis message, then the final
        message ending in <|return|>."""
        enc = enc or self.enc
        sp = self.sp
        ids = [sp["<|channel|>"]] + self.enc("analysis") + [sp["<|message|>"]] + enc(analysis)
        ids += [sp["<|end|>"], sp["<|start|>"]] + self.enc("assistant")
        ids += [sp["<|channel|>"]] + self.enc("final") + [sp["<|message|>"]] + enc(final)
        return ids + [sp["<|return|>"]]

    def examples(self, conv, enc=None):
        """One (prompt ids, completion ids) pair per turn of a conversation; earlier turns appear
        as final-channel replies (harmony drops their analysis)."""
        out, history = [], []
        for t in conv["turns"]:
            p = self.prompt(conv["effort"], history, t["user"], enc)
            out.append((p, self.completion(t["analysis"], t["final"], enc)))
            history.append((t["user"], t["final"]))
        return out


def batch_encoder(tok, texts):
    """Encodes many texts at once (tokenizers' parallel batch); returns a dict text -> ids."""
    uniq = sorted(set(texts))
    encs = tok.encode_batch(uniq, add_special_tokens=False)
    return {t: e.ids for t, e in zip(uniq, encs)}
