"""
A model of this project as TransformerLens's HookedTransformer (transformer-lens 3.9.0,
pinned in requirements-dev.txt), its weights as they are, so that its logits and every
head's attention pattern are model.py's and TransformerLens's own tools (run_with_cache,
its hooks, its composition scores) read one's own model:

    model, tok, _ = load_model("", "out-shakespeare-char-cpu")
    lens = hooked_transformer(model, tok)
    logits, cache = lens.run_with_cache("ROMEO:")
    cache["pattern", 0]                # (batch, n_head, T, T): GPT.attention_maps's layer 0

What becomes what:
  learned positions   positional_embedding_type "standard"
  rotary positions    "rotary" over the whole head, each channel paired with the one half a
                      head away (rotary_adjacent_pairs=False), base 10000; its cos and sin
                      tables are replaced by model.py's own (TransformerLens divides by a
                      frequency where model.py multiplies by its inverse: within 256
                      positions their cosines part by up to 1.5e-5)
  QK-norm             use_qk_norm: an RMSNorm per head, its gain 1 unless qk_gain learned
                      one; TransformerLens's config has one eps for every norm, so the two
                      QK-norms get torch's (float32's machine epsilon) on the modules and
                      the LayerNorms keep 1e-5
  ReLU²               act_fn "relu2" (3.9.0 has it). A gated MLP whose gate and input
                      weights are the same computes it too, relu(a) * a = relu(a)², and
                      mlp_spelling="gated" builds that one (its gate has no bias, so a
                      model with biases cannot be written so)
  grouped-query       n_key_value_heads
  a window            attn_types "local" in every layer, window_size: the same rule (a
                      query sees its last W positions, itself included)
  no biases           zero biases: TransformerLens always has them

What TransformerLens cannot hold is refused in one line (LensError): attention sinks (its
local attention is a window alone; its use_attention_sinks are gpt-oss's learned sink
logits, another idea), linear attention, KV shifting and token shift (its embeddings are
each token's own).
"""

import torch

from model import rotary_tables


class LensError(ValueError):
    """A model TransformerLens cannot hold; the message names the missing feature."""


def refusal(config):
    """Why config cannot be a HookedTransformer, in one line, or None."""
    if config.attention == "linear":
        return "TransformerLens has no linear attention (attention='linear')"
    if config.kv_shift:
        return "TransformerLens has no KV shifting (kv_shift): its keys are each token's own"
    if config.token_shift:
        return (
            "TransformerLens has no token shift (token_shift): its embeddings are each token's own"
        )
    if config.sink_tokens:
        return (
            f"TransformerLens has no attention sinks (sink_tokens={config.sink_tokens}): "
            "its local attention is a window alone"
        )
    return None


def lens_config(config, mlp_spelling="relu2"):
    """The HookedTransformerConfig of a GPTConfig."""
    from transformer_lens import HookedTransformerConfig

    c = config
    hs = c.n_embd // c.n_head
    act_fn = {"gelu": "gelu_pytorch_tanh", "relu2": "relu2"}[c.activation]
    gated = c.activation == "relu2" and mlp_spelling == "gated"
    if gated:
        act_fn = "relu"
    args = dict(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_heads=c.n_head,
        d_head=hs,
        d_mlp=4 * c.n_embd,
        d_vocab=c.vocab_size,
        n_ctx=c.block_size,
        act_fn=act_fn,
        gated_mlp=gated,
        normalization_type="LN",
        eps=1e-5,
        use_qk_norm=c.qk_norm,
        default_prepend_bos=False,
        tokenizer_prepends_bos=False,
        original_architecture="HackableGPTForCausalLM",
        dtype=torch.float32,
        device="cpu",
    )
    if c.rope:
        args |= dict(
            positional_embedding_type="rotary",
            rotary_dim=hs,
            rotary_adjacent_pairs=False,
            rotary_base=10000,
        )
    if c.n_kv_head != c.n_head:
        args["n_key_value_heads"] = c.n_kv_head
    if c.sliding_window is not None:
        args |= dict(
            use_local_attn=True, attn_types=["local"] * c.n_layer, window_size=c.sliding_window
        )
    return HookedTransformerConfig(**args)


def heads(w, n, hs):
    """A Linear's rows for n heads (n hs, C) as TransformerLens's (n, C, hs)."""
    return w.T.reshape(w.shape[1], n, hs).transpose(0, 1)


def lens_state_dict(model, mlp_spelling="relu2"):
    """model's weights under TransformerLens's names and shapes, zeros for the biases a
    model without them lacks."""
    c = model.config
    C = c.n_embd
    hs = C // c.n_head
    kv = c.n_kv_head * hs
    # grouped-query heads: TransformerLens keeps the shared heads as _W_K and _W_V
    shared = ""
    if c.n_kv_head != c.n_head:
        shared = "_"

    def bias(linear, width):
        if linear.bias is None:
            return torch.zeros(width)
        return linear.bias

    def norm(ln, p):
        gain = ln.weight
        shift = torch.zeros(C)
        if ln.bias is not None:
            shift = ln.bias
        return {p + "w": gain, p + "b": shift}

    sd = {"embed.W_E": model.transformer.wte.weight}
    if not c.rope:
        sd["pos_embed.W_pos"] = model.transformer.wpe.weight
    for layer, block in enumerate(model.transformer.h):
        p = f"blocks.{layer}."
        attn = block.attn
        w_q, w_k, w_v = attn.c_attn.weight.split([C, kv, kv])  # (out, C) each
        b_q, b_k, b_v = bias(attn.c_attn, C + 2 * kv).split([C, kv, kv])
        sd |= norm(block.ln_1, p + "ln1.")
        sd |= norm(block.ln_2, p + "ln2.")
        sd[p + "attn.W_Q"] = heads(w_q, c.n_head, hs)
        sd[p + "attn.b_Q"] = b_q.reshape(c.n_head, hs)
        sd[p + f"attn.{shared}W_K"] = heads(w_k, c.n_kv_head, hs)
        sd[p + f"attn.{shared}b_K"] = b_k.reshape(c.n_kv_head, hs)
        sd[p + f"attn.{shared}W_V"] = heads(w_v, c.n_kv_head, hs)
        sd[p + f"attn.{shared}b_V"] = b_v.reshape(c.n_kv_head, hs)
        sd[p + "attn.W_O"] = attn.c_proj.weight.T.reshape(c.n_head, hs, C)
        sd[p + "attn.b_O"] = bias(attn.c_proj, C)
        if c.qk_norm:
            for name in ("q_norm", "k_norm"):
                gain = getattr(attn, name).weight
                if gain is None:
                    gain = torch.ones(hs)
                sd[p + f"attn.{name}.w"] = gain
        sd[p + "mlp.W_in"] = block.mlp.c_fc.weight.T
        sd[p + "mlp.b_in"] = bias(block.mlp.c_fc, 4 * C)
        if c.activation == "relu2" and mlp_spelling == "gated":
            sd[p + "mlp.W_gate"] = block.mlp.c_fc.weight.T
        sd[p + "mlp.W_out"] = block.mlp.c_proj.weight.T
        sd[p + "mlp.b_out"] = bias(block.mlp.c_proj, C)
    sd |= norm(model.transformer.ln_f, "ln_final.")
    sd["unembed.W_U"] = model.lm_head.weight.T
    sd["unembed.b_U"] = torch.zeros(c.vocab_size)
    return {key: t.detach().float().cpu().clone() for key, t in sd.items()}


def hf_tokenizer(tok):
    """data/tokenizer.py's tokenizer as a transformers fast tokenizer over the same
    tokenizer.json that export.py writes, for TransformerLens's string inputs."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from data.tokenizer import CharTokenizer
    from support.export_tokenizer import tokenizer_config, tokenizer_json

    fields = tokenizer_config(tok)
    del fields["tokenizer_class"]
    # TransformerLens reloads a tokenizer that has a BOS by its hub name, to make it
    # prepend one (a KeyError for one built here, which has no name); the models
    # trained here take none (default_prepend_bos=False), so the lens's has none
    fields.pop("bos_token", None)
    if isinstance(tok, CharTokenizer):
        # TransformerLens pads a batch of strings, on the right by default, where no real
        # token sees the padding; a character vocabulary has no pad token, so its first
        # character pads (for Shakespeare, the newline)
        fields["pad_token"] = tok.itos[0]
    tokenizer = Tokenizer.from_str(tokenizer_json(tok))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **fields)


@torch.no_grad()
def hooked_transformer(model, tok=None, mlp_spelling="relu2", processed=False):
    """A HookedTransformer in float32 on the CPU holding model's weights as they are (no
    LayerNorm folded, nothing centred); tok, data/tokenizer.py's, lets it take strings.
    A feature TransformerLens lacks is a LensError. mlp_spelling: "relu2", or "gated" (a
    ReLU² model's MLP as a gated one with its gate weights equal to its input weights).
    processed: TransformerLens's own processing, as its from_pretrained does (LayerNorm
    folded into the next weights, writing weights and the unembedding centred, value
    biases folded): the same attention patterns and log-probabilities, logits moved by a
    constant per position, and the convention of its composition scores and heads.py's."""
    from transformer_lens import HookedTransformer

    why = refusal(model.config)
    if why is None and model.config.bias and mlp_spelling == "gated":
        why = "TransformerLens's gated MLP has no gate bias: a ReLU² model with biases is relu2"
    if why is not None:
        raise LensError(why)
    tokenizer = None
    if tok is not None:
        tokenizer = hf_tokenizer(tok)
    lens = HookedTransformer(
        lens_config(model.config, mlp_spelling), tokenizer, move_to_device=False
    )
    lens.load_and_process_state_dict(
        lens_state_dict(model, mlp_spelling),
        fold_ln=processed,
        center_writing_weights=processed,
        center_unembed=processed,
        fold_value_biases=processed,
    )
    c = model.config
    hs = c.n_embd // c.n_head
    for block in lens.blocks:
        if c.qk_norm:
            # torch's RMSNorm with eps=None, as model.py's
            block.attn.q_norm.eps = torch.finfo(torch.float32).eps
            block.attn.k_norm.eps = torch.finfo(torch.float32).eps
        if c.rope:
            cos, sin = rotary_tables(hs, torch.arange(block.attn.rotary_cos.shape[0]))
            # TransformerLens's layout: each table twice over, for the two halves
            block.attn.rotary_cos.copy_(torch.cat([cos, cos], dim=-1))
            block.attn.rotary_sin.copy_(torch.cat([sin, sin], dim=-1))
    return lens.eval()
