"""export.py and its library (support/export_hf.py, export_tokenizer.py, export_lens.py,
modeling_hackable_gpt.py): a model of this project in transformers and TransformerLens,
and back.

The oracles are the tools themselves, on real files: transformers' own classes loading
the exported folder offline (GPT2LMHeadModel, GPTNeoXForCausalLM, the folder's remote
code), its AutoTokenizer, generate and pipeline; TransformerLens 3.9.0's HookedTransformer
and TransformerBridge; tiktoken's GPT-2 encoding; the corpus's own characters. model.py
gives the logits, greedy tokens and attention maps they must equal.
"""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import ROOT, child_env, run_in_process, tiny_run

from data.tokenizer import GPT2Tokenizer, build_tokenizer, train_bpe
from model import GPT, GPTConfig
from support.export_hf import ExportError, export, read_model, read_tokenizer, write_atomically
from support.loading import load_checkpoint, load_model

transformers = pytest.importorskip("transformers")
# TransformerLens (requirements-dev.txt) is imported by the tests that use it, through
# support/export_lens.py: it takes seconds to load, and every worker collects this file

# 3.9.0 says HookedTransformer goes in 4.0: the oracle is pinned to 3.9.0
pytestmark = pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")

# float32 logits and attention weights agree to this, or the export is wrong
EXACT = 1e-5

# the configs this project trains, tiny: what each must become in transformers
RECIPE = dict(bias=False, rope=True, qk_norm=True, activation="relu2")
CONFIGS = {
    "classic, bias": (dict(bias=True), "GPT2LMHeadModel"),
    "classic, no bias": (dict(bias=False), "GPT2LMHeadModel"),
    "learned positions, ReLU²": (dict(bias=False, activation="relu2"), "GPT2LMHeadModel"),
    "rotary alone": (dict(bias=False, rope=True), "GPTNeoXForCausalLM"),
    "cpu recipe": (RECIPE, "HackableGPTForCausalLM"),
    "15-minute recipe": (dict(RECIPE, qk_gain=True), "HackableGPTForCausalLM"),
    "token shift": (dict(RECIPE, qk_gain=True, token_shift=True), "HackableGPTForCausalLM"),
    "grouped-query": (dict(RECIPE, n_kv_head=2), "HackableGPTForCausalLM"),
    "sliding window": (dict(RECIPE, sliding_window=8), "HackableGPTForCausalLM"),
    "window and sinks": (dict(RECIPE, sliding_window=8, sink_tokens=2), "HackableGPTForCausalLM"),
    "linear attention": (
        dict(bias=False, rope=True, activation="relu2", attention="linear"),
        "HackableGPTForCausalLM",
    ),
}
# what TransformerLens cannot hold, and the words its refusal must say
NOT_IN_LENS = {
    "window and sinks": "attention sinks",
    "linear attention": "linear attention",
    "token shift": "token shift",
}
BLOCK = 32


@pytest.fixture(scope="module")
def text(corpus_path):
    with open(corpus_path, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def chars(text):
    """The corpus's character vocabulary, as data/prepare.py makes it."""
    return build_tokenizer("char", text)


def tiny(chars, **overrides):
    """A 2-layer, 32-wide model whose every weight, gain and bias is moved off its
    initial value, so that a missed transpose, a swapped part or a dropped bias shows."""
    torch.manual_seed(0)
    shape = dict(block_size=BLOCK, vocab_size=chars.vocab_size, n_layer=2, n_head=4, n_embd=32)
    config = GPTConfig(**(shape | overrides))
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def tokens(n, vocab, seed=1):
    return torch.randint(0, vocab, (2, n), generator=torch.Generator().manual_seed(seed))


def files(folder):
    return sorted(os.listdir(folder))


# -----------------------------------------------------------------------------
# transformers: the same logits and greedy tokens, in a stock class or the folder's code


@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_gives_model_py_logits_and_greedy_tokens(name, chars, tmp_path):
    overrides, architecture = CONFIGS[name]
    model = tiny(chars, **overrides)
    folder = str(tmp_path / "hf")
    export(model, chars, folder)
    expected = ["config.json", "generation_config.json", "model.safetensors"]
    expected += ["tokenizer.json", "tokenizer_config.json"]
    stock = architecture != "HackableGPTForCausalLM"
    if not stock:
        expected.append("modeling_hackable_gpt.py")
    assert files(folder) == sorted(expected)
    # a stock class needs no code from the folder: loaded without trusting any
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=not stock)
    assert type(hf).__name__ == architecture
    assert (type(hf).__module__.startswith("transformers.models.")) == stock
    hf.eval()
    idx = tokens(BLOCK, chars.vocab_size)
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max() <= EXACT
    # greedy decoding through transformers' own KV cache; a model without an end to its
    # positions (a window, linear attention) goes on past block_size
    prompt = idx[:1, :5]
    n = BLOCK - 5
    if model.config.context > BLOCK:
        n = 2 * BLOCK
    with torch.no_grad():
        greedy = hf.generate(prompt, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    assert torch.equal(greedy, model.generate(prompt, n, temperature=0))


@pytest.mark.parametrize("options", [dict(sliding_window=8, sink_tokens=2), dict(token_shift=True)])
def test_generate_with_left_padding_gives_each_prompts_own_tokens(options, chars, tmp_path):
    """A batch of prompts of two lengths, the shorter padded on the left: the folder's code
    puts positions and the window's sinks where the tokens are, not where the padding is,
    and the first real token's shift sees no token before it, not the padding."""
    model = tiny(chars, **RECIPE, **options)
    export(model, chars, str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "hf"), trust_remote_code=True
    )
    long, short = tokens(6, chars.vocab_size)[0], tokens(3, chars.vocab_size, seed=2)[0]
    batch = torch.stack([long, torch.cat([torch.zeros(3, dtype=torch.long), short])])
    padding = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        out = hf.generate(
            batch, attention_mask=padding, do_sample=False, max_new_tokens=20, min_new_tokens=20
        )
    assert torch.equal(out[0], model.generate(long[None], 20, temperature=0)[0])
    assert torch.equal(out[1, 3:], model.generate(short[None], 20, temperature=0)[0])


def test_beam_search_reorders_the_shifted_embeddings_with_the_keys(chars, tmp_path):
    """Beam search through transformers' cache, which reorders every layer's keys and
    values as beams overtake one another, against the same search recomputing each whole
    sequence without a cache: token shift's embeddings ride in that cache, and are
    reordered with it."""
    model = tiny(chars, **CONFIGS["token shift"][0])
    export(model, chars, str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "hf"), trust_remote_code=True
    )
    prompt = tokens(5, chars.vocab_size)[:1]
    search = dict(num_beams=3, num_return_sequences=3, do_sample=False, max_new_tokens=20)
    with torch.no_grad():
        cached = hf.generate(prompt, use_cache=True, min_new_tokens=20, **search)
        whole = hf.generate(prompt, use_cache=False, min_new_tokens=20, **search)
    assert torch.equal(cached, whole)
    # the beams differ, so that a beam read from another's embeddings would show
    assert len({tuple(row.tolist()) for row in cached}) == 3


@pytest.mark.stock_formula
def test_output_attentions_are_model_py_attention_maps(chars, tmp_path):
    model = tiny(chars, **RECIPE, n_kv_head=2, sliding_window=8)
    export(model, chars, str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "hf"), trust_remote_code=True
    )
    idx = tokens(BLOCK, chars.vocab_size)
    with torch.no_grad():
        _, maps = model.attention_maps(idx)
        theirs = hf(idx, output_attentions=True).attentions
    for ours, weights in zip(maps, theirs, strict=True):
        assert (ours - weights).abs().max() <= EXACT


def test_the_cache_goes_by_either_name_transformers_has_given_it(chars, tmp_path):
    """transformers 5.24 calls the cache `cache`, its releases before `past_key_values`:
    the folder's code continues a sequence from a cache passed by either name, and
    returns it under the installed release's name."""
    model = tiny(chars, **RECIPE)
    export(model, chars, str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "hf"), trust_remote_code=True
    )
    code = sys.modules[type(hf).__module__]
    idx = tokens(BLOCK, chars.vocab_size)
    with torch.no_grad():
        whole = hf(idx).logits[:, -1]  # (1, vocab)
        for name in ("cache", "past_key_values"):
            cache = getattr(hf(idx[:, :-1], use_cache=True), code.CACHE)
            last = hf(idx[:, -1:], use_cache=True, **{name: cache})
            assert (last.logits[:, -1] - whole).abs().max() <= EXACT, name
            assert getattr(last, code.CACHE) is cache
            assert cache.get_seq_length() == BLOCK


# -----------------------------------------------------------------------------
# Back again: the folder is the model it came from


@pytest.mark.parametrize(
    "name", ["classic, bias", "classic, no bias", "rotary alone", "cpu recipe"]
)
def test_the_folder_reads_back_as_the_same_model(name, chars, tmp_path):
    model = tiny(chars, **CONFIGS[name][0])
    export(model, chars, str(tmp_path / "hf"))
    back = read_model(str(tmp_path / "hf"))
    assert back.config == model.config
    assert back.state_dict().keys() == model.state_dict().keys()
    for key, t in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], t), key
    assert read_tokenizer(str(tmp_path / "hf")).describe() == chars.describe()


def test_biases_a_fine_tune_in_transformers_learned_come_back(chars, tmp_path):
    """GPT-2's class always has biases: zeros for a model without them. Once transformers
    has trained them they are no longer zero, and the model read back keeps them."""
    model = tiny(chars, bias=False)
    export(model, chars, str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    with torch.no_grad():
        hf.transformer.h[1].mlp.c_fc.bias.normal_()
    hf.save_pretrained(str(tmp_path / "tuned"))
    back = read_model(str(tmp_path / "tuned")).eval()
    assert back.config.bias and not model.config.bias
    idx = tokens(BLOCK, chars.vocab_size)
    with torch.no_grad():
        assert (back(idx)[0] - hf(idx).logits).abs().max() <= EXACT


# -----------------------------------------------------------------------------
# Tokenizers: transformers' AutoTokenizer is the tokenizer the model was trained with


def test_the_character_vocabulary_round_trips_every_character(chars, text, tmp_path):
    export(tiny(chars, bias=False), chars, str(tmp_path / "hf"))
    # a GPT-2-class folder: AutoTokenizer needs no remote code
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    sample = text[:20_000] + chars.chars  # every character of the corpus, newline included
    ids = tok(sample)["input_ids"]
    assert ids == chars.encode(sample)
    assert tok.decode(ids) == sample  # no spaces put between characters
    with pytest.raises(Exception, match="Missing \\[UNK\\]"):
        tok("ROMEO: \u00e9")  # a character outside the vocabulary is an error, not dropped


def test_gpt2_bpe_encodes_as_tiktoken(text, tmp_path):
    gpt2 = GPT2Tokenizer()
    model = GPT(
        GPTConfig(block_size=BLOCK, vocab_size=50304, n_layer=1, n_head=2, n_embd=16)
    ).eval()
    export(model, gpt2, str(tmp_path / "hf"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    sample = text[:20_000] + "<|endoftext|> naïve café  \u2603 \U0001f600\n\n  don't"
    ids = tok(sample)["input_ids"]
    assert ids == gpt2.encoding.encode(sample, allowed_special={"<|endoftext|>"})
    assert tok.decode(ids) == sample
    config = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert config["eos_token_id"] == 50256 == tok.eos_token_id
    assert read_tokenizer(str(tmp_path / "hf")).describe() == {"kind": "gpt2"}


def test_a_bpe_trained_here_encodes_as_it_did(text, tmp_path):
    bpe = train_bpe([text[:50_000]], 512)
    model = GPT(GPTConfig(block_size=BLOCK, vocab_size=512, n_layer=1, n_head=2, n_embd=16))
    export(model.eval(), bpe, str(tmp_path / "hf"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    # a literal <|endoftext|> in a text stays text, as in BPETokenizer
    sample = text[50_000:70_000] + " <|endoftext|> naïve \U0001f600"
    ids = tok(sample)["input_ids"]
    assert ids == bpe.encode(sample)
    assert tok.decode(ids) == sample
    assert read_tokenizer(str(tmp_path / "hf")).describe() == bpe.describe()


# -----------------------------------------------------------------------------
# A run of train.py, export.py on its checkpoint, and every command back from the folder


@pytest.fixture(scope="module")
def run(data_root, tmp_path_factory):
    """A checkpoint of the CPU recipe's kind, trained by train.py, and its export by
    `python export.py`, a process of its own."""
    root = tmp_path_factory.mktemp("export")
    run_dir = str(root / "run")
    recipe = [f"--{key}={value}" for key, value in RECIPE.items()]
    run_in_process(tiny_run(data_root, run_dir, *recipe, max_iters=40, eval_interval=40))
    folder = str(root / "hf")
    done = subprocess.run(
        [sys.executable, "export.py", f"--out_dir={run_dir}", f"--to={folder}"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"run": run_dir, "hf": folder, "out": done.stdout, "root": root}


def test_export_py_writes_the_folder_and_says_how_to_load_it(run):
    assert "HackableGPTForCausalLM" in run["out"]
    assert f'from_pretrained("{run["hf"]}", trust_remote_code=True)' in run["out"]
    assert "modeling_hackable_gpt.py" in files(run["hf"])
    # nothing left beside it: the temporary folder became the export
    assert files(os.path.dirname(run["hf"])) == ["hf", "run"]


def test_the_round_trip_equals_the_checkpoint(run):
    ckpt = load_checkpoint(run["run"])
    model, tok, _ = load_model(run["hf"], "")
    assert tok.describe() == ckpt["tokenizer"]
    assert {k: getattr(model.config, k) for k in ckpt["model_args"]} == ckpt["model_args"]
    state = model.state_dict()
    assert state.keys() == ckpt["model"].keys()
    for key, t in ckpt["model"].items():
        assert torch.equal(state[key], t), key


def test_pipeline_writes_what_sample_py_writes(run, capsys):
    """transformers' pipeline on the folder, greedy, against sample.py on the checkpoint."""
    import sample

    pipe = transformers.pipeline("text-generation", model=run["hf"], trust_remote_code=True)
    out = pipe("ROMEO:", do_sample=False, max_new_tokens=20, min_new_tokens=20)
    argv = ["--prompt=ROMEO:", "--temperature=0", "--num_samples=1", "--max_new_tokens=20"]
    argv += ["--attn_dir=", "--device=cpu"]
    assert sample.run([f"--out_dir={run['run']}", *argv]) == 0
    from_checkpoint = capsys.readouterr().out
    assert out[0]["generated_text"] in from_checkpoint
    # and sample.py takes the folder as it takes a GPT-2 folder, with the same answer
    assert sample.run([f"--init_from={run['hf']}", *argv]) == 0
    assert out[0]["generated_text"] in capsys.readouterr().out


def test_train_py_fine_tunes_from_the_folder(run, data_root):
    out = str(run["root"] / "tuned")
    run_in_process(tiny_run(data_root, out, f"--init_from={run['hf']}", max_iters=2))
    tuned = load_checkpoint(out)
    assert tuned["model_args"] == load_checkpoint(run["run"])["model_args"]


def test_explore_and_heads_open_the_folder(run, data_root):
    import heads
    from explorer.live import open_model
    from explorer.server import Explorer

    model, tok, _, _, _ = open_model(run["hf"], "")
    answer = Explorer(model.eval(), tok).analyze({"prompt": "ROMEO:"})
    ours, _, _ = load_model("", run["run"])
    _, maps = ours.eval().attention_maps(torch.tensor([tok.encode("ROMEO:")]))
    assert (torch.tensor(answer["attention"][1]) - maps[1][0]).abs().max() <= EXACT
    argv = [f"--init_from={run['hf']}", "--dataset=shakespeare_char", f"--data_root={data_root}"]
    argv += [f"--out_dir={run['root'] / 'heads'}", "--max_windows=4", "--device=cpu"]
    assert heads.run(argv) == 0
    assert os.path.exists(run["root"] / "heads" / "heads" / "heads.json")


# -----------------------------------------------------------------------------
# Bad input: one line, exit code 2, nothing half-written


def test_bad_input_is_one_line_and_leaves_nothing(run, tmp_path, capsys):
    import export as command

    def line(argv):
        code = command.run(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
        return err[0]

    assert "no checkpoint at" in line([f"--out_dir={tmp_path / 'none'}", f"--to={tmp_path / 'a'}"])
    assert "--to=DIR" in line([f"--out_dir={run['run']}"])
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert "not an empty folder" in line([f"--out_dir={run['run']}", f"--to={taken}"])
    assert files(taken) == ["notes.txt"]
    (tmp_path / "file").write_text("")
    assert "cannot write into" in line(
        [f"--out_dir={run['run']}", f"--to={tmp_path / 'file' / 'x'}"]
    )
    assert sorted(files(tmp_path)) == ["file", "taken"]


def test_a_damaged_folder_is_one_line_in_the_commands_that_read_it(run, tmp_path, capsys):
    import shutil

    import sample

    folder = tmp_path / "damaged"
    shutil.copytree(run["hf"], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert sample.run([f"--init_from={folder}", "--max_new_tokens=5", "--attn_dir="]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.safetensors is missing, truncated" in err[0], err


def test_a_failed_write_leaves_no_folder_and_a_killed_one_is_swept(tmp_path):
    def fails(folder):
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write("{")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomically(str(tmp_path / "hf"), fails)
    assert files(tmp_path) == []
    # what a killed export leaves: its temporary folder, swept by the next one beside it
    (tmp_path / ".hf.tmp.99999").mkdir()
    write_atomically(str(tmp_path / "hf"), lambda folder: None)
    assert files(tmp_path) == ["hf"]
    with pytest.raises(ExportError, match="not an empty folder"):
        write_atomically(str(tmp_path), lambda folder: None)


# -----------------------------------------------------------------------------
# GGUF: a GPT-2-class model with GPT-2's BPE as llama.cpp's file


def test_gguf_holds_a_bpe_model_as_transformers_reads_it(text, tmp_path):
    """transformers reads GGUF files with gguf's own tables of llama.cpp's names: the
    same logits, and the tokenizer built from the file's tokens and merges. A BPE trained
    here, the same kind of file as GPT-2's with a vocabulary small enough to read fast."""
    pytest.importorskip("gguf")  # requirements.txt lists it
    from support.export_gguf import write_gguf

    bpe = train_bpe([text[:50_000]], 512)
    torch.manual_seed(0)
    config = GPTConfig(block_size=BLOCK, vocab_size=576, n_layer=2, n_head=2, n_embd=16)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    write_gguf(model.eval(), bpe, str(tmp_path / "model.gguf"))
    assert files(tmp_path) == ["model.gguf"]
    # transformers' GGUF reader takes context_length for another field: n_positions given
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="model.gguf", n_positions=BLOCK
    )
    idx = tokens(BLOCK, bpe.vocab_size)
    with torch.no_grad():
        assert (model(idx)[0] - hf.eval()(idx).logits).abs().max() <= EXACT
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="model.gguf")
    sample = text[50_000:60_000] + " naïve \U0001f600"
    assert tok(sample)["input_ids"] == bpe.encode(sample)
    assert tok.decode(bpe.encode(sample)) == sample


def test_gguf_vocabulary_of_gpt2_is_tiktokens(tmp_path):
    """GPT-2's tokens in the file, in GPT-2's byte-level spelling, are tiktoken's bytes."""
    pytest.importorskip("gguf")
    from data.tokenizer import _BYTE_LEVEL_CHARS
    from support.export_gguf import bpe_vocabulary

    gpt2 = GPT2Tokenizer()
    token_list, types, merges, eot = bpe_vocabulary(gpt2, 50304)
    assert len(token_list) == 50304 and len(merges) == 50000 and eot == 50256
    assert token_list[50256] == "<|endoftext|>" and token_list[50257] == "[PAD50257]"
    for i in range(50256):
        spelled = bytes(_BYTE_LEVEL_CHARS[c] for c in token_list[i])
        assert spelled == gpt2.encoding.decode_single_token_bytes(i), i


def test_gguf_refuses_what_gpt2_cannot_hold_by_name(run, chars, tmp_path, capsys):
    import export as command
    from support.export_gguf import GGUFError, write_gguf

    with pytest.raises(GGUFError, match="no character vocabulary"):
        write_gguf(tiny(chars, bias=False), chars, str(tmp_path / "a.gguf"))
    code = command.run([f"--out_dir={run['run']}", "--format=gguf", f"--to={tmp_path / 'b.gguf'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("error: GGUF's gpt2 architecture has no rotary positions (rope)")
    assert files(tmp_path) == []


# -----------------------------------------------------------------------------
# TransformerLens: a HookedTransformer with model.py's logits and attention patterns


LENS_CONFIGS = [name for name in CONFIGS if name not in NOT_IN_LENS]


@pytest.mark.stock_formula
@pytest.mark.parametrize("name", LENS_CONFIGS)
def test_hooked_transformer_gives_model_py_logits_and_patterns(name, chars):
    from support.export_lens import hooked_transformer

    model = tiny(chars, **CONFIGS[name][0])
    lens = hooked_transformer(model, chars)
    idx = tokens(BLOCK, chars.vocab_size)
    with torch.no_grad():
        ours, maps = model.attention_maps(idx)
        logits, cache = lens.run_with_cache(idx)
    assert (ours - logits).abs().max() <= EXACT
    for layer, weights in enumerate(maps):
        assert (cache["pattern", layer] - weights).abs().max() <= EXACT
    # strings go through the same tokenizer
    assert lens.to_tokens("ROMEO:", prepend_bos=False)[0].tolist() == chars.encode("ROMEO:")


@pytest.mark.stock_formula
@pytest.mark.parametrize("kind", ["gpt2", "bpe"])
def test_hooked_transformer_takes_strings_through_a_bpe(kind, text):
    """A model of GPT-2's BPE, or of one trained on the corpus, in TransformerLens: its
    strings tokenized as data/tokenizer.py tokenizes them (tiktoken's encoding for GPT-2's),
    no BOS prepended, and model.py's logits from a string (a KeyError in TransformerLens
    before, which reloads a tokenizer with a BOS by its hub name)."""
    from support.export_lens import hooked_transformer

    tok = GPT2Tokenizer() if kind == "gpt2" else train_bpe([text[:50_000]], 512)
    model = tiny(tok, rope=True, qk_norm=True, activation="relu2", bias=False)
    lens = hooked_transformer(model, tok)
    words = "ROMEO: But soft! Ün <|endoftext|>"
    ids = tok.encode(words)
    assert len(ids) <= BLOCK  # the lens cuts a longer text at its n_ctx
    assert lens.to_tokens(words, prepend_bos=False)[0].tolist() == ids
    assert lens.to_tokens(words)[0].tolist() == ids  # the lens's default: no BOS
    with torch.no_grad():
        ours, _ = model.attention_maps(torch.tensor([ids]))
        logits = lens(words)
    assert (ours - logits).abs().max() <= EXACT


def save_for_lens(folder, tok, dataset="tiny", data_root=None, **overrides):
    import dataclasses

    from support.checkpoint import checkpoint_path, save_checkpoint

    model = tiny(tok, **overrides)
    ckpt = {
        "model": model.state_dict(),
        "model_args": dataclasses.asdict(model.config),
        "tokenizer": tok.describe(),
        "dataset": dataset,
        "config": {"data_root": data_root},
    }
    save_checkpoint(ckpt, checkpoint_path(str(folder)))
    return model


@pytest.mark.stock_formula
def test_lens_example_on_a_bpe_model_of_one_layer_and_its_refusals(tmp_path, capsys):
    """experiments.lens_example, as docs/export.md gives it, on a GPT-2-BPE model of one
    layer (a KeyError, then a StopIteration, before); a text longer than block_size, a
    head that is not there and a model TransformerLens cannot hold: one line each."""
    from experiments import lens_example

    tok = GPT2Tokenizer()
    save_for_lens(tmp_path / "one", tok, n_layer=1, rope=True)
    png = tmp_path / "lens.png"
    assert lens_example.run([f"--out_dir={tmp_path / 'one'}", f"--png={png}"]) == 0
    out = capsys.readouterr().out
    differences = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "largest" in line]
    assert len(differences) == 3  # the logits, layer 0's pattern, the drawn head's map
    assert max(differences) <= EXACT
    assert "is in layer 0: no earlier head composes into it" in out
    assert png.exists()
    save_for_lens(tmp_path / "linear", tok, attention="linear")
    refused = [
        ([f"--out_dir={tmp_path / 'one'}", "--text=" + "a b " * BLOCK], "pass a shorter --text"),
        ([f"--out_dir={tmp_path / 'one'}", "--layer=1", "--head=0"], "layers 0 to 0"),
        ([f"--out_dir={tmp_path / 'linear'}"], "TransformerLens has no linear attention"),
    ]
    for argv, words in refused:
        assert lens_example.run(argv + [f"--png={tmp_path / 'no.png'}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "no.png").exists()


@pytest.mark.stock_formula
def test_export_exactness_on_a_model_shorter_than_its_prompt(tmp_path, chars, data_root, capsys):
    """experiments.export_exactness on a model of block_size 8, below its 16-token
    prompt: greedy decoding from half the block (a traceback in transformers'
    generate, asked for -8 new tokens, before)."""
    from experiments import export_exactness

    save_for_lens(tmp_path / "short", chars, "shakespeare_char", data_root, block_size=8)
    assert export_exactness.run([f"--runs=short={tmp_path / 'short'}"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| short")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].split("|")]
    assert float(cells[3]) <= EXACT  # transformers' logits
    assert cells[4] == "4 equal"  # greedy tokens from a 4-token prompt
    assert cells[-2] == "equal"  # the round trip


@pytest.mark.stock_formula
@pytest.mark.parametrize("name", ["classic, bias", "15-minute recipe", "grouped-query"])
def test_processed_as_transformer_lens_does_gives_heads_py_composition_scores(name, chars):
    """TransformerLens's processing (LayerNorm folded, writing weights centred) keeps the
    patterns and log-probabilities, and its composition scores are support/composition.py's
    on rotary, QK-norm and grouped-query models too."""
    from support.composition import composition_scores
    from support.export_lens import hooked_transformer

    model = tiny(chars, **CONFIGS[name][0])
    lens = hooked_transformer(model, processed=True)
    idx = tokens(BLOCK, chars.vocab_size)
    with torch.no_grad():
        ours, maps = model.attention_maps(idx)
        logits, cache = lens.run_with_cache(idx)
    assert (ours.log_softmax(-1) - logits.log_softmax(-1)).abs().max() <= EXACT
    for layer, weights in enumerate(maps):
        assert (cache["pattern", layer] - weights).abs().max() <= EXACT
    found = composition_scores(model)
    later = torch.tensor([[0, 1], [0, 0]], dtype=torch.bool)[:, None, :, None].expand(2, 4, 2, 4)
    for kind in ("q", "k", "v"):
        theirs = lens.all_composition_scores(kind.upper())
        assert (found[kind][later] - theirs[later]).abs().max() <= EXACT


def test_relu2_as_a_gated_mlp_is_the_same_model(chars):
    """relu(a) * a = relu(a)^2: the gated spelling, gate and input weights equal."""
    from support.export_lens import LensError, hooked_transformer

    model = tiny(chars, **RECIPE)
    gated = hooked_transformer(model, mlp_spelling="gated")
    assert gated.cfg.gated_mlp and gated.cfg.act_fn == "relu"
    assert torch.equal(gated.blocks[0].mlp.W_gate, gated.blocks[0].mlp.W_in)
    idx = tokens(BLOCK, chars.vocab_size)
    with torch.no_grad():
        assert (gated(idx) - model(idx)[0]).abs().max() <= EXACT
    with pytest.raises(LensError, match="no gate bias"):
        hooked_transformer(tiny(chars, activation="relu2", bias=True), mlp_spelling="gated")


@pytest.mark.parametrize("name", NOT_IN_LENS)
def test_what_transformer_lens_cannot_hold_is_refused_by_name(name, chars):
    from support.export_lens import LensError, hooked_transformer

    with pytest.raises(LensError, match=NOT_IN_LENS[name]):
        hooked_transformer(tiny(chars, **CONFIGS[name][0]))


@pytest.mark.stock_formula
@pytest.mark.parametrize("name", ["classic, no bias", "rotary alone"])
def test_transformer_bridge_loads_the_stock_class_folders(name, chars, tmp_path):
    from transformer_lens.model_bridge import TransformerBridge

    model = tiny(chars, **CONFIGS[name][0])
    export(model, chars, str(tmp_path / "hf"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(str(tmp_path / "hf"), device="cpu")
    idx = tokens(BLOCK, chars.vocab_size)
    with torch.no_grad():
        ours, maps = model.attention_maps(idx)
        logits, cache = bridge.run_with_cache(idx)
    assert (ours - logits).abs().max() <= EXACT
    for layer, weights in enumerate(maps):
        assert (cache[f"blocks.{layer}.attn.hook_pattern"] - weights).abs().max() <= EXACT
