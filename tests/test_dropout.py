"""model.Dropout, nn.Dropout with its CPU mask drawn from random bits. Oracles: the
binomial counts of a fair mask (the rate per element and per pair of elements sharing
one random word), the gradient written out (the output over the input), nn.Dropout's
own path where the model leaves it alone, and the eager masks against the compiled."""

import math

import pytest
import torch

from model import GPT, Dropout, GPTConfig


def mask_of(p, shape=(64, 256, 128), seed=0):
    torch.manual_seed(seed)
    return Dropout(p)(torch.ones(shape)) != 0  # (shape) True where kept


def within(count, n, rate, sds=5):
    """count of n Bernoulli(rate) draws is within sds standard deviations of its mean."""
    return abs(count - n * rate) <= sds * math.sqrt(n * rate * (1 - rate))


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_drops_p_of_the_elements_and_scales_the_rest_to_keep_the_mean(p):
    torch.manual_seed(1)
    x = torch.rand(64, 256, 128) + 0.5
    y = Dropout(p)(x)
    kept = y != 0
    n = x.numel()
    assert within(n - int(kept.sum()), n, p)
    dropped = round(p * 65536)
    # every kept element is scaled by the same factor, 1 / (1 - p) for the p it draws
    torch.testing.assert_close(y[kept], x[kept] * 65536 / (65536 - dropped))
    assert abs(y.mean().item() / x.mean().item() - 1) < 0.01


def test_the_four_elements_of_a_random_word_are_independent():
    """One 64-bit word is the mask of four neighbours: each of them, and each pair of
    them, drops at the rate independent draws would."""
    p = 0.1
    words = ~mask_of(p).flatten().view(-1, 4)  # (n/4, 4) True where dropped
    n = words.size(0)
    for i in range(4):
        assert within(int(words[:, i].sum()), n, p)
        for j in range(i + 1, 4):
            assert within(int((words[:, i] & words[:, j]).sum()), n, p * p)


def test_masks_follow_the_seed_and_differ_between_calls():
    torch.manual_seed(3)
    d = Dropout(0.1)
    x = torch.ones(8, 64, 32)
    first, second = d(x), d(x)
    torch.manual_seed(3)
    assert torch.equal(d(x), first)
    assert not torch.equal(first, second)


def test_gradient_is_the_output_over_the_input():
    torch.manual_seed(2)
    x = (torch.rand(4, 32, 48) + 0.5).requires_grad_()
    y = Dropout(0.3)(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y / x).detach())


def test_eval_mode_and_p_zero_pass_the_input_through_as_nn_dropout_does():
    x = torch.randn(4, 8, 16)
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert torch.equal(Dropout(0.0)(x), x)
    # not on the CPU: nn.Dropout's own kernel (the meta device stands in for a GPU)
    on_meta = Dropout(0.5)(torch.empty(4, 8, 16, device="meta"))
    assert on_meta.device.type == "meta" and on_meta.shape == (4, 8, 16)


def test_odd_sizes_and_non_contiguous_inputs():
    torch.manual_seed(4)
    x = torch.rand(7, 13, 5).transpose(0, 2) + 0.5  # 455 elements, not a multiple of 4
    y = Dropout(0.5)(x)
    assert y.shape == x.shape
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] * 2)
    assert 0 < int(kept.sum()) < x.numel()


def test_the_model_drops_on_the_residual_stream_with_this_dropout():
    model = GPT(
        GPTConfig(block_size=16, vocab_size=29, n_layer=2, n_head=2, n_embd=16, dropout=0.1)
    )
    kinds = {type(m) for m in model.modules() if isinstance(m, torch.nn.Dropout)}
    assert kinds == {Dropout}
    # 1 after the embeddings, 2 in each block
    assert sum(isinstance(m, Dropout) for m in model.modules()) == 1 + 2 * 2


def test_compiled_draws_the_masks_the_eager_module_draws():
    """The CPU recipe trains compiled: inductor must keep the draws of random_, not
    replace them with its own generator."""
    d = Dropout(0.1)
    compiled = torch.compile(d)
    x = torch.rand(4, 64, 32)
    torch.manual_seed(5)
    eager = d(x)
    torch.manual_seed(5)
    assert torch.equal(compiled(x), eager)
