"""Damaged and hostile files through train.py and sample.py: each is refused in
one line that names it, nothing in it runs, and nothing beside it changes; and a
--key=value is never evaluated. docs/reliability.md lists what each test proves.
"""

import glob
import io
import os
import pickle
import random
import shutil
import struct
import zipfile

import pytest
import torch
from conftest import error_line, file_hash, small_run
from safetensors.torch import load_file, save_file


class RunsCode:
    """Unpickling this runs a shell command: what a hostile file would hold."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# -----------------------------------------------------------------------------
# Untrusted and damaged files, through train.py and sample.py


def damage_files(inputs, marker):
    """Copies of the good files, each damaged in one way: {name: path}."""
    root = os.path.join(inputs["root"], "damaged")
    good = os.path.join(inputs["ckpt"], "ckpt.pt")
    with open(good, "rb") as f:
        blob = f.read()
    rng = random.Random(7)
    made = {}

    def checkpoint(name, data):
        folder = os.path.join(root, name)
        os.makedirs(folder)
        if isinstance(data, bytes):
            with open(os.path.join(folder, "ckpt.pt"), "wb") as f:
                f.write(data)
        else:
            torch.save(data, os.path.join(folder, "ckpt.pt"))
        made[name] = folder

    checkpoint("ckpt_truncated", blob[: len(blob) // 2])
    checkpoint("ckpt_empty", b"")
    checkpoint("ckpt_random", rng.randbytes(len(blob)))
    checkpoint("ckpt_flipped", flip_bytes_inside_a_tensor(blob))
    ckpt = torch.load(good, weights_only=True)
    checkpoint("ckpt_runs_code", dict(ckpt, model=RunsCode(marker)))
    checkpoint("ckpt_wrong_field", dict(ckpt, iter_num="2"))
    checkpoint("ckpt_wrong_shapes", dict(ckpt, model_args=dict(ckpt["model_args"], n_embd=64)))
    checkpoint("ckpt_nan", dict(ckpt, model=with_a_nan(ckpt["model"])))

    def dataset(name, filename, data):
        folder = os.path.join(root, name)
        shutil.copytree(os.path.join(inputs["data"], "small"), os.path.join(folder, "small"))
        with open(os.path.join(folder, "small", filename), "wb") as f:
            f.write(data)
        made[name] = folder

    with open(os.path.join(inputs["data"], "small", "meta.json"), "rb") as f:
        meta = f.read()
    with open(os.path.join(inputs["data"], "small", "train.bin"), "rb") as f:
        tokens = f.read()
    dataset("meta_python", "meta.json", f"__import__('os').system('touch {marker}')".encode())
    dataset("meta_pickle", "meta.json", pickle.dumps(RunsCode(marker)))
    dataset("meta_truncated", "meta.json", meta[: len(meta) // 2])
    dataset("meta_random", "meta.json", rng.randbytes(300))
    dataset("meta_wrong_vocab", "meta.json", meta.replace(b'"vocab_size": ', b'"vocab_size": 1'))
    dataset("bin_truncated", "train.bin", tokens[:-1])
    dataset("bin_random", "train.bin", rng.randbytes(len(tokens) // 2))
    dataset("bin_random_same_size", "train.bin", rng.randbytes(len(tokens)))

    def hf_folder(name, change):
        folder = os.path.join(root, name)
        shutil.copytree(inputs["hf"], folder)
        change(folder)
        made[name] = folder

    def runs_code(folder):
        os.remove(os.path.join(folder, "model.safetensors"))
        torch.save(
            {"transformer.wte.weight": RunsCode(marker)}, os.path.join(folder, "pytorch_model.bin")
        )

    def truncate(folder):
        path = os.path.join(folder, "model.safetensors")
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])

    def nan_weight(folder):
        path = os.path.join(folder, "model.safetensors")
        save_file(with_a_nan(load_file(path)), path)

    hf_folder("hf_runs_code", runs_code)
    hf_folder("hf_truncated", truncate)
    hf_folder("hf_nan", nan_weight)
    return made


def with_a_nan(weights):
    """A copy of weights, one number of the last matrix NaN: what sampling would fail on."""
    weights = dict(weights)
    name = [key for key, value in weights.items() if value.dim() == 2][-1]
    weights[name] = weights[name].clone()
    weights[name][0, 0] = float("nan")
    return weights


def flip_bytes_inside_a_tensor(blob):
    """blob with 64 bytes flipped in the middle of its largest tensor: still a valid zip archive."""
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        member = max(z.infolist(), key=lambda info: info.file_size)
    at = member.header_offset
    name_len, extra_len = struct.unpack("<HH", blob[at + 26 : at + 30])  # the local file header
    middle = at + 30 + name_len + extra_len + member.file_size // 2
    flipped = bytearray(blob)
    for i in range(middle, middle + 64):
        flipped[i] ^= 0xFF
    return bytes(flipped)


# name -> (which command lines read it, what the error line must name besides the file)
DAMAGED = {
    "ckpt_truncated": ("both", "truncated"),
    "ckpt_empty": ("both", "truncated"),
    "ckpt_random": ("both", "not a checkpoint"),
    "ckpt_flipped": ("both", "CRC"),
    "ckpt_runs_code": ("both", "could run code"),
    "ckpt_wrong_field": ("train", "iter_num"),
    "ckpt_wrong_shapes": ("both", "does not match"),
    "ckpt_nan": ("both", "not finite"),
    "meta_python": ("train", "not valid JSON"),
    "meta_pickle": ("train", "not valid JSON"),
    "meta_truncated": ("train", "not valid JSON"),
    "meta_random": ("train", "not valid JSON"),
    "meta_wrong_vocab": ("train", "vocab_size"),
    "bin_truncated": ("train", "odd number of bytes"),
    "bin_random": ("train", "meta.json says"),
    "bin_random_same_size": ("train", "outside the vocabulary"),
    "hf_runs_code": ("both", "could run code"),
    "hf_truncated": ("both", "could not load GPT-2 weights"),
    "hf_nan": ("both", "not finite"),
}


def named_file(name, folder):
    if name.startswith("ckpt"):
        return os.path.join(folder, "ckpt.pt")
    if name.startswith("meta"):
        return os.path.join(folder, "small", "meta.json")
    if name.startswith("bin"):
        return os.path.join(folder, "small", "train.bin")
    return folder


@pytest.fixture(scope="module")
def damaged(forker, inputs):
    marker = os.path.join(inputs["root"], "CODE_RAN")
    made = damage_files(inputs, marker)
    out = os.path.join(inputs["root"], "damaged-out")
    sample = ["--max_new_tokens=3", "--num_samples=1", "--attn_dir", "", "--prompt=ROMEO"]
    jobs = {}
    for name, folder in made.items():
        if name.startswith("ckpt"):
            jobs[(name, "train")] = (
                "train.py",
                small_run(inputs, folder, "--max_iters=4", "--init_from=resume"),
            )
            jobs[(name, "sample")] = ("sample.py", [f"--out_dir={folder}", *sample])
        elif name.startswith("hf"):
            jobs[(name, "train")] = (
                "train.py",
                small_run(inputs, out + name, f"--init_from={folder}", dataset="small_gpt2"),
            )
            jobs[(name, "sample")] = ("sample.py", [f"--init_from={folder}", *sample])
        else:
            jobs[(name, "train")] = (
                "train.py",
                small_run(inputs, out + name) + [f"--data_root={folder}"],
            )
    jobs = {key: job for key, job in jobs.items() if DAMAGED[key[0]][0] in ("both", key[1])}
    hashes = {name: folder_hashes(folder) for name, folder in made.items()}
    results = dict(zip(jobs, forker.run(list(jobs.values()), workers=3)))
    return {"made": made, "results": results, "marker": marker, "hashes": hashes}


def folder_hashes(folder):
    return {
        path: file_hash(path)
        for path in glob.glob(os.path.join(folder, "**"), recursive=True)
        if os.path.isfile(path)
    }


@pytest.mark.parametrize(
    "name, cli",
    [
        (n, c)
        for n, (which, _) in DAMAGED.items()
        for c in ("train", "sample")
        if which in ("both", c)
    ],
)
def test_damaged_or_hostile_file_is_refused_in_one_line(damaged, name, cli):
    folder = damaged["made"][name]
    line = error_line(damaged["results"][(name, cli)])
    assert named_file(name, folder) in line and DAMAGED[name][1] in line, line
    if name.startswith(("bin", "meta")):  # how to make the dataset whole again
        assert "; prepare the dataset again with: python " in line, line
    assert not os.path.exists(damaged["marker"])  # nothing in any file ran
    # refusing a file leaves it, and everything beside it, as it was: nothing changed or added
    assert folder_hashes(folder) == damaged["hashes"][name]


def test_overrides_are_never_evaluated(forker, inputs, tmp_path):
    """Config files are Python by design; --key=value never is."""
    payload = "__import__('os').system('touch MARKER')"
    ok, bad = forker.run(
        [
            ("train.py", small_run(inputs, payload, "--max_iters=0"), {"cwd": tmp_path}),
            ("train.py", small_run(inputs, "out", f"--batch_size={payload}"), {"cwd": tmp_path}),
        ],
        workers=2,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert os.path.isfile(tmp_path / payload / "ckpt.pt")  # the text became a folder name
    assert "batch_size expects int" in error_line(bad)
    assert not (tmp_path / "MARKER").exists()
