#!/usr/bin/python3
"""Cairn's direct-API example: a small PyTorch training job that checkpoints
through cairnd with cairn.Checkpointer (optionally async_save through
cairn-agent) and resumes from its latest checkpoint after being killed.

The training image's example (deploy/image, run by the Kubernetes example
Job): it runs on that image's torch 1.13 too. For torch 2.x with FSDP2 and
DCP (dcp.async_save through cairn.torch's CairnStorageWriter), see train.py
beside it.

W ranks (torch.multiprocessing spawn, gloo on CPU) train a small MLP
regressor with dropout on synthetic, seeded data for --steps steps with Adam
and a cosine learning-rate schedule, wrapped in DistributedDataParallel.
Every --save-every steps all ranks save, with cairn.Checkpointer, the whole
training state as one nested state_dict:

    model   the module's parameters (replicated on every rank: DDP)
    optim   Adam's state (exp_avg, exp_avg_sq, step per parameter) and its
            param_groups (current learning rate included)
    sched   the scheduler's state_dict
    step    the last finished step
    rng     per rank: torch's and Python's RNG state (each rank draws its own
            batches and dropout masks from them)

Why DDP and not ShardedTensor: DDP is how a model this size is trained, and
torch 1.13's optimizers do not step ShardedTensor parameters. Replicated
state is no waste for Cairn: identical tensors saved by several ranks are
replicas, and cairnd's planner has each written once, the writes spread over
the ranks. The RNG states are the only per-rank entries (rng.rank<r>.*).

On start every rank asks cairnd for the job's latest committed checkpoint;
when there is one, it loads it into the freshly built model, optimizer,
scheduler and RNGs and continues after its step, so a killed and restarted
run ends with exactly the parameters of an uninterrupted one.

With an agent socket (--agent-socket / CAIRN_AGENT_SOCKET) saves are
async_save through cairn-agent: training is blocked only for the snapshot,
and each save is waited for before the next one. Without, saves are
synchronous (save returns when the checkpoint is committed).

Usage:
  train_direct.py --coordinator HOST:PORT --job NAME [--world-size 2]
                  [--steps 60] [--rank R] [--save-every 10]
                  [--kill-at-step S] [--final-state PATH]
                  [--agent-socket PATH]
Coordinator and job default to CAIRN_COORDINATOR and CAIRN_JOB. Prints one
line per save and per resume. --kill-at-step S makes every rank die hard
(os._exit(137), no clean-up: like a lost node) before running step S; the
command then exits 137. --final-state PATH writes the final model and
optimizer tensors with torch.save (rank 0) for comparing runs.
"""

import argparse
import datetime
import os
import random
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import cairn

PROGRAM = os.path.basename(__file__)  # train.py in the training image
KILL_EXIT_CODE = 137
IN_FEATURES = 16
HIDDEN = 64
BATCH = 32


class Mlp(nn.Module):
    """A three-layer MLP with dropout (dropout draws from torch's RNG, so a
    resume that lost the RNG state would train differently)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN_FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, 1)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        x = self.dropout(F.gelu(self.fc1(x)))
        return self.head(F.gelu(self.fc2(x)))


def teacher(x):
    """The synthetic target: a fixed smooth function of the inputs."""
    w = torch.linspace(-0.5, 0.5, IN_FEATURES)
    return (torch.tanh(x @ w) + 0.2 * x[:, 0] * x[:, 1]).unsqueeze(1)


def batch():
    """This rank's next batch, drawn from torch's global RNG (seeded per
    rank), plus a coin from Python's, so both RNG states matter."""
    x = torch.randn(BATCH, IN_FEATURES)
    if random.random() < 0.5:
        x = -x
    return x, teacher(x)


def materialize_adam_state(opt):
    """Creates Adam's per-parameter state (as torch 1.13's first step would)
    so that a freshly built optimizer has tensors to load a checkpoint into."""
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state[p]
            if state:
                continue
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group.get("amsgrad"):
                state["max_exp_avg_sq"] = torch.zeros_like(
                    p, memory_format=torch.preserve_format)


def training_state(model, opt, sched, step, rank):
    """The nested state_dict saved (and loaded into) by cairn.Checkpointer."""
    return {
        "model": model.module.state_dict(),
        "optim": opt.state_dict(),
        "sched": sched.state_dict(),
        "step": step,
        "rng": {f"rank{rank}": {"torch": torch.get_rng_state(),
                                "python": random.getstate()}},
    }


def restore(state, model, opt, sched, rank):
    """Puts a loaded state_dict back into the live objects; returns its step.
    The model's tensors were loaded in place; the rest is applied here."""
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    sched.load_state_dict(state["sched"])
    rng = state["rng"][f"rank{rank}"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    return int(state["step"])


def say(rank, text):
    if rank == 0:
        print(f"{PROGRAM}: {text}", flush=True)


def rank_main(rank, args, port):
    torch.set_num_threads(1)  # deterministic kernels, and 2 cores are shared
    timeout = datetime.timedelta(seconds=args.timeout)
    if port is not None:  # spawned here: main() serves the rendezvous store
        store = dist.TCPStore("127.0.0.1", port, args.world_size, False,
                              timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank,
                                world_size=args.world_size, timeout=timeout)
    else:  # torchrun-style: rank 0 serves it at $MASTER_ADDR:$MASTER_PORT
        dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                                timeout=timeout)
    torch.manual_seed(args.seed)  # same initial model on every rank
    model = nn.parallel.DistributedDataParallel(Mlp())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    torch.manual_seed(args.seed * 1000 + rank)  # each rank its own batches
    random.seed(args.seed * 1000 + rank)

    options = {}
    if args.agent_socket:
        options["agent_socket"] = args.agent_socket
    ckpt = cairn.Checkpointer(coordinator=args.coordinator, job=args.job,
                              rank=rank, world_size=args.world_size, **options)

    step = 0
    try:
        latest = ckpt.latest_step()
    except cairn.NotFoundError:
        latest = None
        say(rank, f"job {args.job}: no checkpoint at {args.coordinator}, "
                  f"starting from step 0")
    if latest is not None:
        materialize_adam_state(opt)
        state = training_state(model, opt, sched, 0, rank)
        ckpt.load(state, step=latest)
        step = restore(state, model, opt, sched, rank)
        say(rank, f"job {args.job}: resumed from step {step} "
                  f"(lr {sched.get_last_lr()[0]:.6f})")

    pending = None  # the async save in flight
    while step < args.steps:
        if step + 1 == args.kill_at_step:
            say(rank, f"job {args.job}: killed before step {step + 1} (os._exit)")
            os._exit(KILL_EXIT_CODE)  # pylint: disable=protected-access
        step += 1
        x, y = batch()
        loss = F.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % args.save_every == 0 or step == args.steps:
            state = training_state(model, opt, sched, step, rank)
            if args.agent_socket:
                if pending is not None:
                    pending.wait()
                pending = ckpt.async_save(step, state)
                how = "async_save (snapshot taken; committing in the background)"
            else:
                ckpt.save(step, state)
                how = "save (committed)"
            say(rank, f"job {args.job}: saved step {step}, loss {loss.item():.5f}: {how}")
    if pending is not None:
        pending.wait()
        say(rank, f"job {args.job}: step {pending.step} committed")

    if rank == 0 and args.final_state:
        final = {"model": model.module.state_dict(), "optim": opt.state_dict()["state"]}
        torch.save(final, args.final_state)
    dist.barrier()
    dist.destroy_process_group()


def rendezvous_store(args):
    """The ranks' rendezvous store, served here on a port the kernel picked
    and held while they run (a port found free and released could be taken
    by another process before rank 0 binds it)."""
    return dist.TCPStore("127.0.0.1", 0, args.world_size, True,
                         timeout=datetime.timedelta(seconds=args.timeout),
                         wait_for_workers=False)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--coordinator", default=os.environ.get("CAIRN_COORDINATOR"),
                   help="cairnd's HOST:PORT (default: $CAIRN_COORDINATOR)")
    p.add_argument("--job", default=os.environ.get("CAIRN_JOB", "train-example"),
                   help="the job's name in cairnd (default: $CAIRN_JOB or train-example)")
    p.add_argument("--agent-socket", default=os.environ.get("CAIRN_AGENT_SOCKET"),
                   help="cairn-agent's socket: saves become async_save "
                        "(default: $CAIRN_AGENT_SOCKET; none: synchronous saves)")
    p.add_argument("--world-size", type=int,
                   default=int(os.environ.get("WORLD_SIZE", "2")),
                   help="number of ranks (default: $WORLD_SIZE or 2)")
    p.add_argument("--rank", type=int,
                   default=int(os.environ["RANK"]) if os.environ.get("RANK") else None,
                   help="run only this rank in this process, the others being "
                        "started elsewhere (torchrun, an indexed Kubernetes "
                        "Job); they meet at $MASTER_ADDR:$MASTER_PORT "
                        "(default: $RANK; none: spawn every rank here)")
    p.add_argument("--steps", type=int, default=60, help="train to this step")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--kill-at-step", type=int, default=0,
                   help="die hard (os._exit) before running this step")
    p.add_argument("--final-state", default=None,
                   help="torch.save the final model and optimizer tensors here")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective may wait (gloo)")
    args = p.parse_args(argv)
    if not args.coordinator:
        p.error("no coordinator: pass --coordinator HOST:PORT or set CAIRN_COORDINATOR")
    if args.world_size < 1 or args.steps < 1 or args.save_every < 1:
        p.error("--world-size, --steps and --save-every must be >= 1")
    if args.rank is not None:
        if not 0 <= args.rank < args.world_size:
            p.error(f"--rank {args.rank} is not in [0, {args.world_size})")
        if not os.environ.get("MASTER_ADDR"):
            p.error("--rank/$RANK needs $MASTER_ADDR (and $MASTER_PORT, "
                    "default 29500): the address of rank 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.rank is not None:
        os.environ.setdefault("MASTER_PORT", "29500")
        rank_main(args.rank, args, None)
        return 0
    store = rendezvous_store(args)
    try:
        mp.spawn(rank_main, args=(args, store.port), nprocs=args.world_size,
                 join=True)
    except mp.ProcessExitedException as e:
        # Every rank dies at the same step; spawn reports the first it sees
        # (and may have terminated the others with SIGTERM first).
        if args.kill_at_step and (e.exit_code == KILL_EXIT_CODE or e.signal_name):
            print(f"{PROGRAM}: job {args.job}: ranks killed before step "
                  f"{args.kill_at_step}", flush=True)
            sys.exit(KILL_EXIT_CODE)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
