"""A Mac's GPU (MPS), on machines without one: its availability faked, its device real.

Nothing here has run on a Mac. What a CPU can check: the main config's choice where MPS
is found (its first step really fails here, as MPS ops do on Linux, and the CPU recipe
takes over with one line), the precision MPS is given (float32: half precision is
refused, since PyTorch's causal attention on MPS let tokens see later ones in it,
pytorch #195910), and the redraw of a token of probability 0 that MPS's multinomial can
return (pytorch #192577), run on the CPU by naming it among the devices that redraw.
"""

import os
import re

import pytest
import torch

import model
import train
from support import device as device_module
from support.device import DeviceError, inference_dtype, training_dtype

MPS = torch.device("mps")  # a device object needs no Mac; only tensors on it do
REPO = os.path.dirname(os.path.abspath(train.__file__))


@pytest.fixture
def mps_found(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_a_failed_first_step_on_mps_falls_back_to_the_cpu_recipe(mps_found, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = train.get_config(["config/shakespeare.py"])
    assert cfg.device == "cpu" and cfg.n_layer == 4 and cfg.max_time > 0  # the CPU recipe
    assert cfg.note.startswith("config/shakespeare.py: no CUDA GPU found, so a model sized for")
    # the baby GPT's iter was tried on MPS, and its error is named in the same line
    assert re.search(
        r"the baby GPT's first step failed on MPS \((RuntimeError|NotImplementedError): ", cfg.note
    )
    assert cfg.note.endswith("--device=cpu trains it on the CPU anyway")
    assert "\n" not in cfg.note


def test_mps_fast_enough_trains_the_baby_gpt_uncompiled_in_float32(mps_found, monkeypatch):
    from support import run_estimate

    monkeypatch.chdir(REPO)
    timed = []
    monkeypatch.setattr(
        run_estimate, "seconds_per_iter", lambda settings, here: timed.append(here) or 0.5
    )
    cfg = train.get_config(["config/shakespeare.py"])
    assert timed == ["mps"]
    assert cfg.note.startswith("config/shakespeare.py: the baby GPT on mps")
    assert (cfg.n_layer, cfg.n_embd, cfg.device) == (6, 384, "auto")
    # compile: None is on for CUDA only (train.py); dtype auto is float32 on MPS
    assert cfg.compile is None and cfg.dtype == "auto"
    assert training_dtype("auto", MPS)[0] == "float32"
    assert inference_dtype("auto", MPS) == torch.float32


def test_mps_slower_than_an_hour_names_its_own_device(mps_found, monkeypatch):
    from support import run_estimate

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(run_estimate, "seconds_per_iter", lambda settings, here: 10.0)
    cfg = train.get_config(["config/shakespeare.py"])
    assert cfg.device == "cpu" and "would take 6.9 h here (10.0 s each)" in cfg.note
    assert cfg.note.endswith("--device=mps trains it there anyway")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "bf16", "fp16"])
def test_half_precision_on_mps_is_refused_in_one_line(dtype):
    for pick in (training_dtype, inference_dtype):
        name = dtype
        if pick is training_dtype:  # train.py's settings take the full names only
            name = device_module.DTYPE_ALIASES.get(dtype, dtype)
        with pytest.raises(DeviceError) as e:
            pick(name, MPS)
        assert "--dtype=float32" in str(e.value) and "\n" not in str(e.value)
        if pick is training_dtype and name == "float16":
            assert "float16 training needs CUDA" in str(e.value)  # as on any CPU
        else:
            full = device_module.DTYPE_ALIASES.get(name, name)
            assert f"--dtype={full} on MPS" in str(e.value) and "195910" in str(e.value)
    # the same precisions elsewhere are as they were: float16 inference on the CPU runs
    assert inference_dtype("float16", torch.device("cpu")) == torch.float16


def test_a_token_of_probability_zero_is_drawn_again(monkeypatch):
    logits = torch.tensor([[2.0, 1.0, float("-inf"), 0.5]])
    real = torch.multinomial
    calls = []

    def first_draw_zero(probs, num_samples, generator=None):
        calls.append(1)
        if len(calls) == 1:  # the bug: the token whose probability is 0
            return torch.tensor([[2]])
        return real(probs, num_samples, generator=generator)

    monkeypatch.setattr(torch, "multinomial", first_draw_zero)
    # on a device that is not known to need it, nothing is checked: one draw, as before
    assert model.sample_next(logits).item() == 2 and len(calls) == 1
    # the CPU named as such a device: the zero-probability draw is drawn again
    calls.clear()
    gen = torch.Generator().manual_seed(0)
    token = model.sample_next(logits, generator=gen, redraw=("cpu",)).item()
    assert token != 2 and len(calls) == 2
