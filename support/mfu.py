"""
Model FLOPs utilisation (MFU): the training FLOPs a run does per second, as a fraction of
its GPU's peak. train.py shows it beside the loss.
"""

import torch

# Dense bf16 peaks in FLOP/s (vendors' data sheets), matched in order against the device
# name: variants before the bare name (H100 SXM is "H100 80GB HBM3").
PEAK_FLOPS = {
    "H200 NVL": 835e12,
    "H200": 989e12,
    "GH200": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "H800": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
}


def flops_per_token(model):
    """Training FLOPs per token of a GPT: 6 per parameter (2 forward, 4 backward) plus the
    attention scores over block_size positions (the PaLM paper's appendix B count)."""
    c = model.config
    return 6 * model.num_params(non_embedding=True) + 12 * c.n_layer * c.n_embd * c.block_size


def peak_flops(device_name):
    """The bf16 peak of a GPU by name, or None for one not in PEAK_FLOPS."""
    for key, flops in PEAK_FLOPS.items():
        if key in device_name:
            return flops
    return None


def estimate_mfu(model, tokens_per_iter, dt):
    """MFU of an iteration of tokens_per_iter tokens in dt seconds, against the current
    GPU's peak; None without a GPU, or one of unknown peak."""
    if not torch.cuda.is_available() or dt <= 0:
        return None
    peak = peak_flops(torch.cuda.get_device_name())
    if peak is None:
        return None
    return flops_per_token(model) * tokens_per_iter / dt / peak
