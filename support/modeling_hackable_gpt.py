"""
model.py's GPT as a `transformers` model, for the configurations that no stock class of
`transformers` holds. export.py copies this file beside the weights, and

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)

loads it: `generate`, `pipeline("text-generation")` and the Trainer drive it like any
causal LM, through transformers' own DynamicCache. Its modules and parameters carry
model.py's names, so the folder's model.safetensors is a checkpoint's state dict as it is.

Why a file of our own (support/export_hf.py exports to GPT-2 or GPT-NeoX where one of
them matches exactly). The stock classes that come closest to the default recipe (rotary
positions, QK-norm, ReLU², LayerNorm blocks, no biases), each with the one feature that
rules it out:
  - Persimmon: LayerNorm blocks, rotary positions, per-head QK-norm and ReLU² in a plain
    MLP, but its QK-norm is a LayerNorm (it subtracts the mean), where ours is an RMSNorm.
  - Qwen3 and OLMo 2: RMS QK-norm, but RMSNorm blocks (no mean subtracted) and a gated MLP.
  - Nemotron and Arcee: ReLU² in a plain MLP, but no QK-norm at all.
  - GPT-NeoX: everything but QK-norm (and grouped-query attention, and a window); the
    export uses it for rotary models without those.
  - Mistral: a sliding window with model.py's rule, but RMSNorm blocks and a gated MLP.

Only torch and transformers are imported: the file runs inside transformers, without
this project beside it. Written against transformers 5.24, whose `cache` argument and
output were `past_key_values` before 5.24: the model takes and returns either.
Dropout is left out: a loaded model is for inference and fine-tuning without it.
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

# the name of the cache in a causal LM's arguments and output, in this transformers
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class HackableGPTConfig(PreTrainedConfig):
    """GPTConfig's fields under model.py's own names, with the names transformers'
    utilities read (hidden_size, num_hidden_layers, ...) mapped onto them."""

    model_type = "hackable_gpt"
    attribute_map = {
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
        "num_key_value_heads": "n_kv_head",
        "max_position_embeddings": "block_size",
    }

    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_kv_head: int | None = None
    bias: bool = True
    rope: bool = False
    qk_norm: bool = False
    qk_gain: bool = False
    activation: str = "gelu"
    attention: str = "softmax"
    sliding_window: int | None = None
    sink_tokens: int = 0
    token_shift: bool = False
    rope_base: float = 10000.0
    layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        # every layer keeps every key: a window (with its sinks) is a mask over them,
        # so the cache transformers makes must not drop the keys that left the window
        self.layer_types = ["full_attention"] * self.n_layer
        super().__post_init__(**kwargs)


def visible(i, j, window=None, sinks=0):
    """model.py's masking rule (section 2) for query positions i and key positions j."""
    causal = j <= i
    if window is None:
        return causal
    return causal & ((j > i - window) | (j < sinks))


def rotary_tables(head_size, pos, base):
    """cos and sin (..., T, hs/2) at positions pos (..., T), as model.rotary_tables."""
    exponents = torch.arange(0, head_size, 2, device=pos.device).float() / head_size
    inv_freq = 1.0 / base**exponents  # (hs/2,)
    angles = pos.float()[..., None] * inv_freq  # (..., T, hs/2)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """x (B, nh, T, hs) with each channel pair (x1, x2) of its two halves turned."""
    x1, x2 = x.chunk(2, dim=-1)
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MultiHeadAttention(nn.Module):
    """model.py's MultiHeadAttention: one c_attn for every head's query, key and value,
    QK-norm, rotary, grouped-query heads, the window and its sinks, or linear attention."""

    def __init__(self, config, layer):
        super().__init__()
        self.layer = layer
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_size = config.n_embd // config.n_head
        kv_width = self.n_kv_head * self.head_size
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_width, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            # eps None: float32's machine epsilon, as model.py's RMSNorm
            self.q_norm = nn.RMSNorm(self.head_size, elementwise_affine=config.qk_gain)
            self.k_norm = nn.RMSNorm(self.head_size, elementwise_affine=config.qk_gain)
        self.attention = config.attention

    def forward(self, x, rotary, mask, cache, keep_weights):
        B, T, C = x.size()
        hs = self.head_size
        q, k, v = self.c_attn(x).split([C, self.n_kv_head * hs, self.n_kv_head * hs], dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, nkv, T, hs)
        if self.qk_norm:
            q = self.q_norm(q)
            k = self.k_norm(k)
        if rotary is not None:
            cos, sin = rotary
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer)  # (B, nkv, Tk, hs) each
        group = self.n_head // self.n_kv_head
        k = k.repeat_interleave(group, dim=1)  # (B, nh, Tk, hs)
        v = v.repeat_interleave(group, dim=1)  # (B, nh, Tk, hs)
        weights = None
        if self.attention == "linear":
            y, weights = linear_attention(q, k, v, mask)
        elif keep_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, Tk)
            scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            y = weights @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y), weights


def linear_attention(q, k, v, mask):
    """model.py's linear_attention (section 16) in its quadratic form over the cached
    keys: y_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j), j visible to i."""
    q = F.elu(q) + 1
    k = F.elu(k) + 1
    w = (q @ k.transpose(-2, -1)).masked_fill(~mask, 0.0)  # (B, nh, T, Tk)
    weights = w / w.sum(-1, keepdim=True)
    return weights @ v, weights


class MLP(nn.Module):
    """model.py's MLP: widened 4x, GELU (tanh approximation) or ReLU², then back."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.activation = config.activation

    def forward(self, x):
        x = self.c_fc(x)
        if self.activation == "relu2":
            x = F.relu(x)
            x = x * x
        else:
            x = F.gelu(x, approximate="tanh")
        return self.c_proj(x)


class Block(nn.Module):
    """model.py's pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config, layer):
        super().__init__()
        eps = config.layer_norm_eps
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=eps, bias=config.bias)
        self.attn = MultiHeadAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, rotary, mask, cache, keep_weights):
        y, weights = self.attn(self.ln_1(x), rotary, mask, cache, keep_weights)
        x = x + y
        x = x + self.mlp(self.ln_2(x))
        return x, weights


class HackableGPTForCausalLM(PreTrainedModel, GenerationMixin):
    """model.py's GPT: token embeddings (token-shifted where the model learned a shift) and
    position embeddings, the blocks, the final LayerNorm, and the LM head tied to the token
    embedding."""

    config_class = HackableGPTConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                h=nn.ModuleList([Block(config, layer) for layer in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias),
            )
        )
        if not config.rope:
            self.transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        if config.token_shift:
            self.shift_gain = nn.Parameter(torch.zeros(config.n_embd))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        """model.py's initialisation, for weights a folder does not hold."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and module.weight is not None:
            nn.init.ones_(module.weight)
        if isinstance(module, nn.LayerNorm) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_input_embeddings(self):
        return self.transformer.wte

    def set_input_embeddings(self, value):
        self.transformer.wte = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def attention_mask(self, attention_mask, T, Tk, device):
        """Bool (B or 1, 1, T, Tk): which of the Tk keys each of the T newest queries sees,
        by model.py's rule on the tokens' positions. Padding (0 in attention_mask) is no
        position and is never seen; a row that sees nothing (a padded query) sees every
        key, so that softmax stays finite there."""
        c = self.config
        if attention_mask is None:
            key_pos = torch.arange(Tk, device=device)[None]  # (1, Tk)
            real = torch.ones_like(key_pos, dtype=torch.bool)
        else:
            real = attention_mask[:, -Tk:].bool()  # (B, Tk)
            key_pos = real.long().cumsum(-1) - 1
        query_pos = key_pos[:, -T:]  # (B, T)
        window = None
        sinks = 0
        if c.attention == "softmax":
            window = c.sliding_window
            sinks = c.sink_tokens
        mask = visible(query_pos[:, :, None], key_pos[:, None, :], window, sinks)
        mask = mask & real[:, None, :]  # (B, T, Tk)
        mask = mask | ~mask.any(-1, keepdim=True)
        return mask[:, None]

    def token_shift(self, x, attention_mask, cache):
        """model.py's token shift: x (B, T, C) plus shift_gain times the embedding of the
        token before, zeros before the first real token (padding is no token).

        The embeddings ride in the cache as one more layer after the blocks', (B, 1, T, C)
        as its keys and values, so that transformers keeps them with the blocks' keys and
        values wherever it moves those: beam search reorders them, assisted decoding crops
        them. A cache that transformers sized for the blocks alone gets that layer here."""
        c = self.config
        embeddings = x  # (B, T, C)
        if cache is not None:
            while len(cache.layers) <= c.n_layer:
                cache.layers.append(DynamicLayer())
            embeddings, _ = cache.update(x[:, None], x[:, None], c.n_layer)
            embeddings = embeddings[:, 0]  # (B, Tk, C)
        B, Tk, _ = embeddings.shape
        real = torch.ones(B, Tk, dtype=torch.bool, device=x.device)
        if attention_mask is not None:
            real = attention_mask[:, -Tk:].bool()
        previous = embeddings[:, :-1] * real[:, :-1, None].to(x.dtype)  # (B, Tk-1, C)
        previous = torch.cat([torch.zeros_like(embeddings[:, :1]), previous], dim=1)
        T = x.size(1)
        return x + self.shift_gain.to(x.dtype) * previous[:, -T:]

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        past_key_values=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_attentions=None,
        logits_to_keep=0,
        **kwargs,
    ):
        c = self.config
        if cache is None:
            cache = past_key_values
        if inputs_embeds is None:
            inputs_embeds = self.transformer.wte(input_ids)  # (B, T, C)
        B, T, _ = inputs_embeds.shape
        device = inputs_embeds.device
        if use_cache is None:
            use_cache = c.use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=c)
        past = 0
        if cache is not None:
            past = cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=device)[None]  # (1, T)
        x = inputs_embeds
        if c.token_shift:
            x = self.token_shift(x, attention_mask, cache)
        rotary = None
        if c.rope:
            cos, sin = rotary_tables(c.n_embd // c.n_head, position_ids, c.rope_base)
            rotary = cos[:, None], sin[:, None]  # (B, 1, T, hs/2) each
        else:
            if position_ids.max() >= c.block_size:
                raise ValueError(
                    f"position {int(position_ids.max())} is past block_size {c.block_size}: "
                    "learned positions end there"
                )
            x = x + self.transformer.wpe(position_ids)
        mask = self.attention_mask(attention_mask, T, past + T, device)
        attentions = []
        for block in self.transformer.h:
            x, weights = block(x, rotary, mask, cache, bool(output_attentions))
            attentions.append(weights)
        x = self.transformer.ln_f(x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(x)  # (B, T, vocab)
        loss = None
        if labels is not None:
            flat_logits = logits[:, :-1].reshape(-1, logits.size(-1)).float()
            loss = F.cross_entropy(flat_logits, labels[:, 1:].reshape(-1), ignore_index=-100)
        kept = None
        if output_attentions:
            kept = tuple(attentions)
        return CausalLMOutputWithPast(loss=loss, logits=logits, attentions=kept, **{CACHE: cache})
