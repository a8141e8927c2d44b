"""
Explore a model's attention live, in the browser: every head's map, its label,
and what switching heads off does to the next token, the loss and the text.

    python explore.py                  # the main command's model; open the address it prints
    python explore.py --out_dir=out-shakespeare-char-cpu   # config/shakespeare_cpu.py's run
    python explore.py --init_from=path/to/gpt2 --port=8001
    python explore.py --host=0.0.0.0   # reachable from other machines

It serves one page (no file from outside: it works offline) and the JSON API
the page uses, POST /api/analyze, /api/generate and /api/patch, GET /api/steps
(docs/explorer.md documents them). Trained with --snapshots=True, a run's
folder gives the page a step slider. Ctrl-C stops it. Options are --key=value;
`python explore.py --help` lists them.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import errno
import os
import socket
import sys

import torch

from explorer.live import open_model
from explorer.server import Explorer, ExplorerServer, address
from support import cli
from support.device import inference_dtype, pick_device
from support.head_measures import HeadsError


@dataclasses.dataclass
class Settings:
    out_dir: str = "out-shakespeare-char"  # the checkpoint's folder
    # "" = out_dir's checkpoint; or a checkpoint folder, or a Hugging Face GPT-2 folder
    init_from: str = ""
    # the address to listen on; anything but localhost opens it to the network
    host: str = "127.0.0.1"
    port: int = 8000  # 0 = any free port
    device: str = "cpu"  # cpu, auto (cuda, then mps, then cpu), cuda, cuda:N, mps
    dtype: str = "float32"  # float32, bfloat16, float16, or auto (bfloat16 on a GPU that has it)
    threads: int = 0  # torch's CPU threads; 0 = torch's default


LOOPBACK = ("127.0.0.1", "localhost", "::1")
HOSTS = "127.0.0.1 (this machine only), 0.0.0.0 (every interface) or an address of this machine"


class ExploreError(Exception):
    """A problem with the user's input; the message is one line saying what to do."""


def start_server(cfg):
    """Load the model and bind the server; return it (not yet serving)."""
    if not 0 <= cfg.port <= 65535:
        raise ExploreError(f"--port must be from 0 to 65535, got {cfg.port}")
    if not cfg.host:
        # an empty host listens on every interface, as 0.0.0.0 does: say it if it is meant
        raise ExploreError(f"--host is empty; pass {HOSTS}")
    cli.check_threads(cfg.threads)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    dtype = inference_dtype(cfg.dtype, device)
    # a run being trained that has no ckpt.pt yet opens at its newest snapshot
    model, tok, folder, step, opened = open_model(cfg.init_from, cfg.out_dir)
    model.to(device=device, dtype=dtype).eval()
    # a training run's folder: its snapshots are steps the page can go back to
    explorer = Explorer(model, tok, run_dir=folder, step=step, opened=opened)
    try:
        return ExplorerServer(explorer, cfg.host, cfg.port)
    except OSError as e:
        fix = "pass another --port (or --port=0 for any free one)"
        # a name that does not resolve, or an address that is not this machine's
        if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
            fix = f"pass another --host: {HOSTS}"
        raise ExploreError(
            f"cannot listen on {cfg.host}:{cfg.port} ({e.strerror or e}); {fix}"
        ) from None


def main(cfg):
    server = start_server(cfg)
    if cfg.host not in LOOPBACK:
        print(
            f"warning: listening on {cfg.host}: anyone who can reach this machine can use "
            "the model; the default --host=127.0.0.1 keeps it to this machine",
            file=sys.stderr,
        )
    c = server.explorer.config
    print(f"model: {c.n_layer} layers x {c.n_head} heads, context {c.block_size}")
    print(f"explorer at {address(server)} (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("\nstopped", file=sys.stderr)  # Ctrl-C is how the explorer is meant to stop
    finally:
        server.server_close()


def run(argv):
    """The command: what `python explore.py ...` exits with (cli.py)."""
    return cli.run(main, argv, __doc__, Settings, (ExploreError, HeadsError))


if __name__ == "__main__":
    code = run(sys.argv[1:])
    # A request's thread may still be inside torch (a generation, say). The
    # interpreter's shutdown would stop that thread where it stands, and torch then
    # aborts the process (pytorch#38228). The explorer has nothing to save, so the
    # process ends here, its output flushed, without that shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
