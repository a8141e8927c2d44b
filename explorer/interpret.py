"""
Why the model predicts a token: the logit lens, direct logit attribution and
activation patching, computed from the model's own forward.

Nothing here re-implements the model. Forward hooks on the modules model.py
names record what one forward passed through them (a Trace): the residual
stream after the embeddings (transformer.drop) and after every block
(transformer.h[i]), every head's output before W_O (the input of
h[i].attn.c_proj, the heads side by side) and every MLP's output. From those:

  logit_lens    each point of the residual stream read as if it were the last:
                softmax(lm_head(ln_f(x))) (nostalgebraist 2020)
  attribution   the final residual is a sum: the embeddings, each head through
                its slice of W_O, each attention output bias, each MLP. With
                ln_f's scale fixed from the whole residual, ln_f is linear, so
                the logit of a token splits into one number per part (the
                direct logit attribution of Elhage et al. 2021)
  patch_heads   activation patching (Meng et al. 2022; Wang et al. 2022): the
                corrupt prompt's run with one head's output taken from the
                clean prompt's run, for every head, in one batched pass that
                starts each layer's copies from the corrupt run's residual

Every function takes a model in eval mode; all of them run under torch.no_grad.
"""

import contextlib

import torch

LENS_TOP = 5  # tokens the logit lens keeps at each point of the stream and position


def first(output):
    """A block returns x, or (x, something): the residual stream either way."""
    if isinstance(output, tuple):
        return output[0]
    return output


class Trace:
    """What one forward passed through the named modules, batch first. calls holds
    each block's positional and keyword arguments, so that a forward can be taken up
    again at any block with another residual stream."""

    def __init__(self, n_layer):
        self.embed = None  # (B, T, C) the residual stream after the embeddings
        self.resid = [None] * n_layer  # (B, T, C) after each block
        self.z = [None] * n_layer  # (B, T, nh * hs) the heads' outputs side by side, before W_O
        self.mlp = [None] * n_layer  # (B, T, C) each MLP's output
        self.calls = [None] * n_layer  # (args, kwargs) of each block's call

    def stream(self):
        """The n_layer + 1 points of the residual stream: (n_layer + 1, B, T, C)."""
        return torch.stack([self.embed] + self.resid)


def _keep_embed(trace):
    def hook(module, args, output):
        trace.embed = output

    return hook


def _keep_output(store, key):
    def hook(module, args, output):
        store[key] = first(output)

    return hook


def _keep_input(store, key):
    def hook(module, args):
        store[key] = args[0]

    return hook


def _keep_call(store, key):
    def hook(module, args, kwargs):
        store[key] = (args, kwargs)

    return hook


@contextlib.contextmanager
def recording(model):
    """Inside, every forward of model is recorded into the Trace this yields (the
    last forward wins). The hooks are registered last, so they see what other hooks
    (heads switched off) have made of each tensor."""
    trace = Trace(model.config.n_layer)
    handles = [model.transformer.drop.register_forward_hook(_keep_embed(trace))]
    for layer, block in enumerate(model.transformer.h):
        handles += [
            block.register_forward_pre_hook(_keep_call(trace.calls, layer), with_kwargs=True),
            block.register_forward_hook(_keep_output(trace.resid, layer)),
            block.attn.c_proj.register_forward_pre_hook(_keep_input(trace.z, layer)),
            block.mlp.register_forward_hook(_keep_output(trace.mlp, layer)),
        ]
    try:
        yield trace
    finally:
        for handle in handles:
            handle.remove()


def unembed(model, x):
    """Logits (..., vocab) of residual-stream vectors x (..., C): ln_f, then lm_head."""
    return model.lm_head(model.transformer.ln_f(x))


# -----------------------------------------------------------------------------
# The logit lens


@torch.no_grad()
def logit_lens(model, trace, k=LENS_TOP):
    """The top k tokens of softmax(lm_head(ln_f(x))) at every point x of the residual
    stream of batch row 0: (probs, ids), each (n_layer + 1, T, k). The last point is
    the model's own prediction."""
    points = trace.stream()[:, 0]  # (n_layer + 1, T, C)
    probs = torch.softmax(unembed(model, points).float(), dim=-1)  # (n_layer + 1, T, vocab)
    top = torch.topk(probs, min(k, probs.size(-1)), dim=-1)
    return top.values, top.indices


# -----------------------------------------------------------------------------
# Direct logit attribution


@torch.no_grad()
def attribution(model, trace, positions, tokens):
    """Each part's share of the logit of tokens (P,) at positions (P,), batch row 0.

    ln_f(x) = gain * (x - mean(x)) / scale + bias with scale = sqrt(var(x) + eps).
    With the scale fixed at the whole residual's, ln_f is linear in x, and the
    logit w_u . ln_f(x) is the sum over the parts p of x of
    w_u . (gain * (p - mean(p)) / scale), plus w_u . bias. Centring p is the same
    as centring the direction it is read along, which is what the code does.

    Returns a dict of float32 tensors: embed (P,), heads (P, n_layer, n_head),
    mlp (P, n_layer), bias (P,): the attention output biases and ln_f's bias."""
    c = model.config
    hs = c.n_embd // c.n_head
    ln = model.transformer.ln_f
    x = trace.resid[-1][0, positions].float()  # (P, C) the final residual
    scale = torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + ln.eps)  # (P, 1)
    w_u = model.lm_head.weight[tokens].float()  # (P, C) each token's unembedding
    direction = w_u / scale  # (P, C)
    if ln.weight is not None:
        direction = direction * ln.weight.float()
    direction = direction - direction.mean(dim=-1, keepdim=True)
    heads = []
    mlp = []
    bias = torch.zeros(len(positions), device=x.device)
    if ln.bias is not None:
        bias = bias + w_u @ ln.bias.float()
    for layer, block in enumerate(model.transformer.h):
        z = trace.z[layer][0, positions].float().view(-1, c.n_head, hs)  # (P, nh, hs)
        w_o = block.attn.c_proj.weight.float().view(c.n_embd, c.n_head, hs)  # (C, nh, hs)
        # the direction read back through each head's slice of W_O
        read = torch.einsum("pc,chs->phs", direction, w_o)  # (P, nh, hs)
        heads.append((z * read).sum(dim=-1))  # (P, nh)
        mlp.append((trace.mlp[layer][0, positions].float() * direction).sum(dim=-1))  # (P,)
        if block.attn.c_proj.bias is not None:
            bias = bias + direction @ block.attn.c_proj.bias.float()
    return {
        "embed": (trace.embed[0, positions].float() * direction).sum(dim=-1),
        "heads": torch.stack(heads, dim=1),
        "mlp": torch.stack(mlp, dim=1),
        "bias": bias,
    }


# -----------------------------------------------------------------------------
# Activation patching


@contextlib.contextmanager
def heads_replaced(c_proj, source, first_copy, n_head):
    """Inside, c_proj's input (B, T, nh * hs) has, in the n_head copies from batch row
    first_copy on, head h's slice replaced by source's (1, T, nh * hs) in copy h."""
    width = source.size(-1)
    hs = width // n_head
    # (nh, 1, nh * hs): row h is True on head h's slice
    mask = torch.zeros(n_head, 1, width, dtype=torch.bool, device=source.device)
    for h in range(n_head):
        mask[h, 0, h * hs : (h + 1) * hs] = True

    def hook(module, args):
        z = args[0].clone()
        z[first_copy:] = torch.where(mask, source, z[first_copy:])  # (nh, T, nh * hs)
        return (z,)

    handle = c_proj.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def logit_diff(logits, target, foil):
    """logits[..., target] - logits[..., foil]."""
    return logits[..., target].float() - logits[..., foil].float()


@torch.no_grad()
def patch_heads(model, clean, corrupt, target, foil):
    """Activation patching of every head's output, clean into corrupt.

    clean, corrupt: (1, T) token ids of the same length. For every head, the corrupt
    run with that head's output (before W_O, at every position) taken from the clean
    run; the last position's diff = logit[target] - logit[foil].

    One pass over the blocks: at layer l the batch takes n_head new copies of the
    corrupt run's residual entering l (nothing below l changes), one patched per
    head, beside the copies of the layers before, which go on from where their
    patch left them. Returns clean_diff, corrupt_diff (floats), patched
    (n_layer, n_head): the diff of each patched run, and logit_scale: the largest
    |logit| at the last position of the two runs, the size their rounding goes with."""
    c = model.config
    with recording(model) as clean_trace:
        clean_logits = model(clean)[0]  # (1, T, vocab)
    with recording(model) as corrupt_trace:
        corrupt_logits = model(corrupt)[0]  # (1, T, vocab)
    x = None  # (l * nh, T, C) the copies patched at the layers so far
    for layer, block in enumerate(model.transformer.h):
        args, kwargs = corrupt_trace.calls[layer]
        fresh = args[0].expand(c.n_head, -1, -1)  # (nh, T, C) the corrupt residual entering l
        if x is None:
            x = fresh
        else:
            x = torch.cat([x, fresh])
        first_copy = layer * c.n_head
        with heads_replaced(block.attn.c_proj, clean_trace.z[layer], first_copy, c.n_head):
            x = first(block(x, *args[1:], **kwargs))  # ((l + 1) nh, T, C)
    logits = unembed(model, x[:, -1])  # (n_layer nh, vocab)
    return {
        "clean_diff": logit_diff(clean_logits[0, -1], target, foil).item(),
        "corrupt_diff": logit_diff(corrupt_logits[0, -1], target, foil).item(),
        "patched": logit_diff(logits, target, foil).view(c.n_layer, c.n_head),
        "logit_scale": max(
            clean_logits[0, -1].float().abs().max().item(),
            corrupt_logits[0, -1].float().abs().max().item(),
        ),
    }
