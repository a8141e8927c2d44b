"""
The optimizers train.py steps: AdamW, or Muon for the hidden matrices with AdamW
for the rest, and the learning-rate schedule.
"""

import math

import torch


class Muon(torch.optim.Muon):
    """torch.optim.Muon, with its Newton-Schulz orthogonalisation in float32 when
    float32=True. PyTorch runs it in bfloat16, with no option: right where bfloat16
    is native, about 40x slower where it is emulated (a CPU with only AVX2), where
    it then dominates the step. The hyperparameters, the state and the update rule
    are PyTorch's, so a checkpoint resumes with either."""

    def __init__(self, params, float32=False, **kwargs):
        super().__init__(params, **kwargs)
        self.float32 = float32

    @torch.no_grad()
    def step(self, closure=None):
        if not self.float32:
            return super().step(closure)
        # torch.optim._muon looks its iteration up at every step: lend it ours
        module = torch.optim._muon
        bf16_iteration = module._zeropower_via_newtonschulz
        module._zeropower_via_newtonschulz = newton_schulz
        try:
            return super().step(closure)
        finally:
            module._zeropower_via_newtonschulz = bf16_iteration


def newton_schulz(g, ns_coefficients, ns_steps, eps):
    """Muon's quintic Newton-Schulz iteration (Jordan et al. 2024, with
    torch.optim.Muon's coefficients and steps) in float32: it pushes every
    singular value of the matrix g towards 1, keeping its singular vectors."""
    a, b, c = ns_coefficients
    x = g.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T  # iterate on the wide side: its Gram matrix x x^T is the smaller
    x = x / x.norm().clamp(min=eps)  # Frobenius norm 1 bounds the spectral norm by 1
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(
            x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a
        )  # a x + (b G + c G^2) x
    return x.T if tall else x


def configure_optimizers(model, weight_decay, learning_rate, betas, device_type):
    """AdamW for a GPT, decaying its matrices only (not biases, LayerNorm gains)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return adamw(params, weight_decay, learning_rate, betas, device_type)


def adamw(params, weight_decay, learning_rate, betas, device_type):
    """AdamW for params, decaying the matrices among them only; the fused kernel
    updates every parameter in one pass (CUDA and CPU)."""
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device_type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)


def make_optimizers(model, cfg, device_type, dtype):
    """Optimizers that step together: [AdamW], or [Muon, AdamW]. Muon orthogonalises
    in bfloat16 only when training in it: elsewhere bfloat16 may be emulated (40x
    slower) or crash (hardware.py)."""
    lr, wd, betas = cfg.learning_rate, cfg.weight_decay, (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "adamw":
        return [configure_optimizers(model, wd, lr, betas, device_type)]
    # Muon orthogonalises the update of each hidden matrix. Embeddings (and the
    # head tied to them), biases and gains are not hidden matrices: AdamW.
    # match_rms_adamw scales Muon's steps like AdamW's, so one lr serves both.
    hidden = [p for p in model.transformer.h.parameters() if p.dim() == 2]
    hidden_ids = {id(p) for p in hidden}
    rest = [p for p in model.parameters() if id(p) not in hidden_ids]
    muon = Muon(
        hidden,
        lr=lr,
        weight_decay=wd,
        adjust_lr_fn="match_rms_adamw",
        ns_steps=cfg.muon_ns_steps,
        float32=dtype != "bfloat16",
    )
    return [muon, adamw(rest, wd, lr, betas, device_type)]


def get_lr(it, cfg, seconds=0.0):
    """Linear warmup, then cosine decay (or with lr_cooldown, a plateau and a straight
    line) to min_lr at lr_decay_iters, then min_lr.
    seconds: of training so far; with lr_decay_time the decay is also by time,
    whichever of the two is further along."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)  # 0 -> 1
    if cfg.lr_decay_time > 0:
        progress = max(progress, min(seconds / cfg.lr_decay_time, 1.0))
    if cfg.lr_cooldown:
        # warmup-stable-decay (Hu et al. 2024; Hagele et al. 2024): the peak lr until the
        # last lr_cooldown of the schedule, then a straight line down to min_lr; with 1.0
        # the line runs from the warmup's end (linear decay to zero, Bergsma et al. 2025)
        coeff = min(1.0, (1.0 - progress) / cfg.lr_cooldown)
    else:
        coeff = 0.5 * (1.0 + math.cos(math.pi * progress))  # 1 -> 0
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


def seq_warmup_cut(cfg, seconds):
    """Into how many pieces each sequence is cut after seconds of training: 4 in the
    first quarter of lr_decay_time, 2 in the second, then 1 (always 1 without seq_warmup).
    By seconds, as the lr decays, so that a slow machine and a fast one warm up over
    the same share of their run."""
    if not cfg.seq_warmup:
        return 1
    if seconds < cfg.lr_decay_time / 4:
        return 4
    if seconds < cfg.lr_decay_time / 2:
        return 2
    return 1


def late_dropout_on(cfg, it, seconds):
    """Whether dropout is on at iter it, after seconds of training: off for the first
    late_dropout of the schedule (by iters, or by lr_decay_time, whichever is further
    along, as the lr decays), on after it (always on without late_dropout)."""
    progress = it / cfg.lr_decay_iters
    if cfg.lr_decay_time > 0:
        progress = max(progress, seconds / cfg.lr_decay_time)
    return progress >= cfg.late_dropout
