"""
What a GPU can do at most, by its name, and how near a run comes to it: model FLOPs
utilisation (MFU), the training FLOPs a run does per second as a fraction of the GPU's
bf16 peak (train.py shows it beside the loss), and the memory bandwidth that bounds
decoding one token at a time (bench/decode.py).
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
    "L40": 181e12,
    "L4": 121e12,
    "A10": 125e12,
}

# Peak memory (HBM or GDDR) bandwidth in bytes/s, from the same data sheets (NVIDIA's
# H200, H100, GH200, A100, A800, L40S, L40, L4 and A10 sheets), matched the same way.
# GH200 before H200, which its name contains; the A100's 40 GB models are the bare name.
PEAK_BANDWIDTH = {
    "GH200 144G": 4.9e12,  # HBM3e
    "GH200": 4.0e12,  # HBM3, 96 GB
    "H200": 4.8e12,  # SXM and NVL alike
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,  # SXM
    "H800 PCIe": 2.0e12,
    "H800": 3.35e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,
    "A800-SXM4-80GB": 2.039e12,
    "A800 80GB PCIe": 1.935e12,
    "A800": 1.555e12,
    "L40S": 864e9,
    "L40": 864e9,
    "L4": 300e9,
    "A10": 600e9,
}


def lookup(table, device_name):
    """The first entry of table whose key is part of device_name, or None."""
    for key, value in table.items():
        if key in device_name:
            return value
    return None


def flops_per_token(model):
    """Training FLOPs per token of a GPT: 6 per parameter (2 forward, 4 backward) plus the
    attention scores over block_size positions (the PaLM paper's appendix B count)."""
    c = model.config
    return 6 * model.num_params(non_embedding=True) + 12 * c.n_layer * c.n_embd * c.block_size


def peak_flops(device_name):
    """The bf16 peak of a GPU by name, or None for one not in PEAK_FLOPS."""
    return lookup(PEAK_FLOPS, device_name)


def peak_bandwidth(device_name):
    """The data-sheet memory bandwidth of a GPU by name, or None for one not in PEAK_BANDWIDTH."""
    return lookup(PEAK_BANDWIDTH, device_name)


def mfu(flops, tokens, seconds, peak):
    """The fraction of peak (FLOP/s) reached by tokens tokens of flops FLOPs each in seconds."""
    return flops * tokens / seconds / peak


def estimate_mfu(model, tokens_per_iter, dt):
    """MFU of an iteration of tokens_per_iter tokens in dt seconds, against the current
    GPU's peak; None without a GPU, or one of unknown peak."""
    if not torch.cuda.is_available() or dt <= 0:
        return None
    peak = peak_flops(torch.cuda.get_device_name())
    if peak is None:
        return None
    return mfu(flops_per_token(model), tokens_per_iter, dt, peak)
