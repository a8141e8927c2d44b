"""
A GPT-2-class model with a byte-level BPE as one GGUF file, for llama.cpp: its `gpt2`
architecture, written with the gguf package (llama.cpp's own Python writer) in the layout
llama.cpp's convert_hf_to_gguf.py gives GPT-2. export.py --format=gguf writes it.

  the weights   float32, model.py's Linear layout (what the converter makes of GPT-2's
                Conv1D), the tensor names from gguf's own table for GPT-2; zero biases
                for a model without them (llama.cpp's gpt2 requires them), and the
                token embedding again as `output` (the tied LM head)
  the tokenizer tokenizer.ggml.model "gpt2" (byte-level BPE), pre-tokenizer "gpt-2",
                its tokens, merges and <|endoftext|>, padded with [PADn] tokens up to the
                model's vocab_size

What GGUF's gpt2 cannot hold is refused in one line (GGUFError): rotary positions,
QK-norm, grouped-query attention, a window, linear attention, KV shifting and ReLU²
(llama.cpp's gpt2 graph is GPT-2's: learned positions and GELU), and a character
vocabulary. GGUF's tokenizer models are SentencePiece, byte-level BPE, WordPiece, Unigram
and a few others; none is a character vocabulary. A byte-level BPE without merges could
spell the ASCII characters one byte each, but it would hold no character outside ASCII,
and llama.cpp gives a gpt2 vocabulary without an end-of-text token the id 11 as its start
and end, which here is a character.
"""

import json
import os

from support.export_hf import RUN_CHOICES, ExportError, model_args
from support.export_tokenizer import tokenizer_json


class GGUFError(ExportError):
    """A model or file GGUF's gpt2 cannot hold; one line naming what."""


def refusal(config, tok):
    """Why this model cannot be a gpt2 GGUF, in one line, or None."""
    c = config
    features = [
        (c.rope, "rotary positions (rope)"),
        (c.qk_norm, "QK-norm (qk_norm)"),
        (c.n_kv_head != c.n_head, "grouped-query attention (n_kv_head)"),
        (c.sliding_window is not None, "a sliding window (sliding_window)"),
        (c.attention != "softmax", "linear attention (attention='linear')"),
        (c.kv_shift, "KV shifting (kv_shift)"),
        (c.token_shift, "token shift (token_shift)"),
        (c.activation != "gelu", "ReLU² (activation='relu2')"),
    ]
    for present, name in features:
        if present:
            return f"GGUF's gpt2 architecture has no {name}; export it with --format=hf"
    if tok.describe()["kind"] == "char":
        return (
            "GGUF has no character vocabulary (its tokenizer models are SentencePiece, "
            "byte-level BPE, WordPiece, Unigram...); export it with --format=hf"
        )
    return None


def bpe_vocabulary(tok, vocab_size):
    """(tokens, token types, merges, id of <|endoftext|>) of a byte-level BPE, from the
    tokenizer.json export.py writes, padded to vocab_size."""
    from gguf import TokenType

    spec = json.loads(tokenizer_json(tok))
    vocab = dict(spec["model"]["vocab"])
    for added in spec["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = sorted(vocab, key=vocab.get)
    special = {added["content"] for added in spec["added_tokens"] if added["special"]}
    types = [TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens]
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")
        types.append(TokenType.UNUSED)
    # tokenizers writes a merge as "a b" or as ["a", "b"], by its version
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, types, merges, tok.eot_token


def write_gguf(model, tok, path):
    """model and tok as the GGUF file path (a new file: written beside it, then renamed)."""
    import numpy as np

    from support.export_hf import with_biases

    c = model.config
    why = refusal(c, tok)
    if why is not None:
        raise GGUFError(why)
    try:
        from gguf import MODEL_ARCH, GGUFWriter, LlamaFileType, get_tensor_name_map
    except ImportError:
        raise GGUFError("--format=gguf needs the gguf package: pip install gguf") from None
    path = os.path.abspath(path)
    if os.path.exists(path):
        raise GGUFError(f"{path} already exists; pass another --to or remove it first")
    state = {key: t.detach().float().cpu() for key, t in model.state_dict().items()}
    for key, shape in with_biases(c).items():
        if key not in state:
            state[key] = np.zeros(shape, dtype=np.float32)
    names = get_tensor_name_map(MODEL_ARCH.GPT2, c.n_layer)
    tokens, types, merges, eot = bpe_vocabulary(tok, c.vocab_size)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        writer = GGUFWriter(tmp, "gpt2")
        writer.add_name("hackable-gpt")
        writer.add_context_length(c.block_size)
        writer.add_embedding_length(c.n_embd)
        writer.add_feed_forward_length(4 * c.n_embd)
        writer.add_block_count(c.n_layer)
        writer.add_head_count(c.n_head)
        writer.add_layer_norm_eps(1e-5)
        writer.add_file_type(LlamaFileType.ALL_F32)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(eot)
        writer.add_eos_token_id(eot)
        args = {k: v for k, v in model_args(c).items() if k not in RUN_CHOICES}
        writer.add_string("hackable_gpt.gpt_config", json.dumps(args))
        for key, t in state.items():
            name = names.get_name(key.removesuffix(".weight").removesuffix(".bias"))
            suffix = key.rsplit(".", 1)[1]
            writer.add_tensor(f"{name}.{suffix}", np.ascontiguousarray(t, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
