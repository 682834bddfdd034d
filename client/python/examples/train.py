#!/usr/bin/env python3
"""Cairn's PyTorch example: a small transformer trained with FSDP2 on gloo
ranks, checkpointed with torch.distributed.checkpoint (DCP) through cairnd;
killed, it resumes bit-identically, or into another number of ranks.

The job. W ranks (spawned here with torch.multiprocessing, or one per
process with --rank, as torchrun or an indexed Kubernetes Job starts them)
train a decoder-only transformer (2 blocks, width 32, 64-token vocabulary,
dropout) to predict the next token of seeded synthetic sequences. Every
block and the root are wrapped with FSDP2's fully_shard, so each rank holds
a shard of every parameter and of AdamW's state (DTensors). AdamW, a warmup
+ cosine learning-rate schedule, gradient clipping. Each step takes a
global batch of 12 sequences; rank r trains on its 12/W of them.

Checkpoints, the way DCP users write them (TrainState is a DCP Stateful):

    state = {"train": TrainState(model, optim, sched, data, rank)}
    fut = dcp.async_save(state, checkpoint_id=f"cairn://{cairnd}/{job}/{step}",
                         storage_writer=CairnStorageWriter(process_group=group),
                         process_group=group)
    ...                                  # train on; fut.result() before
                                         # the next save and before exiting
    dcp.load(state, checkpoint_id=f"cairn://{cairnd}/{job}/{step}",
             storage_reader=CairnStorageReader())

Every --save-every steps (and at the last step) each rank saves what a
resumed run needs to continue exactly:

    train.model  get_state_dict(model, optim)[0]: this rank's parameter shards
    train.optim  get_state_dict(...)[1]: AdamW's exp_avg, exp_avg_sq and step
                 shards, and its param_groups (the current learning rate)
    train.sched  the LR scheduler's state_dict
    train.data   the data position: epoch and index into its shuffle
    train.step   the last finished step
    train.rng    rank<r>: rank r's torch RNG state (its dropout masks)

async_save copies the state (staging) and returns; the save runs in a
background thread while training goes on, and is waited for before the next
one. With --agent-socket (or CAIRN_AGENT_SOCKET) the copy goes straight into
the node's cairn-agent's shared memory, and the agent writes it. It runs on a gloo group of its own, passed to async_save and to
CairnStorageWriter both: the save's collectives (DCP's, and one of the
writer's own: DCP does not tell the writer its group) run in that thread
while FSDP's run on the default group in the training thread, and two
threads must never issue collectives on one group. Cairn commits a
checkpoint atomically: it becomes the job's latest only once every rank's
part is written.

Resuming. On start rank 0 reads the DCP metadata of the job's latest
committed checkpoint from cairnd (CairnStorageReader, checkpoint id
cairn://HOST:PORT/JOB/latest) and tells the other ranks its step; if there
is one, dcp.load loads it into the freshly built model, optimizer,
scheduler, data stream and RNG, and training continues after its step.

- Same number of ranks: bit-identical. A run killed at any moment (kill -9
  of its rank processes; an async_save being written is lost, and the
  resume is from the checkpoint before it) and started again ends with
  exactly the parameters and optimizer state of a run never interrupted.
- Another number of ranks: DCP and Cairn reshard the checkpoint, so the
  full state right after the load is the saved one, element by element, and
  training continues from it. The saved per-rank RNG states belong to the
  old ranks, so each rank reseeds its RNG from (seed, step, rank) instead.
  The continuation is not bit-identical to one with the old number of
  ranks: the per-rank batches, the order of the gradient reduction and the
  dropout masks all change with it.

Usage:
  train.py --coordinator HOST:PORT --job NAME [--world-size 2] [--steps 40]
           [--save-every 10] [--final-state PATH] [--rank R]
           [--agent-socket PATH]
Coordinator and job default to $CAIRN_COORDINATOR and $CAIRN_JOB; with
--rank R (or $RANK) this process runs rank R only and meets the others at
$MASTER_ADDR:$MASTER_PORT. Each rank prints its pid; rank 0 prints a line
per save, commit and resume. Kill the ranks (kill -9 PID...) and run the
command again: it resumes from the latest committed checkpoint. When a rank
is killed, the command exits 128 + the signal's number (137 for SIGKILL).
--steps is also the length of the LR schedule. --final-state PATH: rank 0
writes the full (unsharded) model and optimizer state at the end with
torch.save, for comparing runs.
"""

import argparse
import datetime
import math
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                     get_state_dict,
                                                     set_state_dict)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import cairn
from cairn.torch import CairnStorageReader, CairnStorageWriter

VOCAB = 64
SEQ_LEN = 16
DIM = 32
HEADS = 4
LAYERS = 2
DROPOUT = 0.1
SEQUENCES = 192     # the synthetic data set: an epoch is 16 steps
GLOBAL_BATCH = 12   # sequences per step, split evenly over the ranks
WARMUP = 5


# ------------------------------------------------------------ model

class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(),
                                 nn.Linear(4 * DIM, DIM))
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (self.qkv(self.norm1(x))
                   .view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dropout(self.proj(a.transpose(1, 2).reshape(b, t, DIM)))
        return x + self.dropout(self.mlp(self.norm2(x)))


class Transformer(nn.Module):
    """Decoder-only language model: token + position embeddings, blocks,
    final norm, output head."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ_LEN, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model(seed, mesh):
    """The same initial model on every rank (seeded), sharded with FSDP2:
    each block, then the root (embeddings, final norm, head)."""
    torch.manual_seed(seed)
    model = Transformer()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def lr_schedule(total_steps):
    """Linear warmup, then cosine decay to 10% at `total_steps`."""
    def factor(step):
        if step < WARMUP:
            return (step + 1) / WARMUP
        progress = min(1.0, (step - WARMUP) / max(1, total_steps - WARMUP))
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))
    return factor


# ------------------------------------------------------------ data

class TokenStream:
    """Seeded synthetic sequences of a random bigram language (each token
    has 4 possible successors), reshuffled every epoch. Its state is its
    position (epoch, index): the same global batches follow on any number
    of ranks."""

    def __init__(self, seed):
        g = torch.Generator().manual_seed(seed)
        successors = torch.randint(VOCAB, (VOCAB, 4), generator=g)
        choices = torch.randint(4, (SEQUENCES, SEQ_LEN), generator=g)
        seqs = torch.empty(SEQUENCES, SEQ_LEN + 1, dtype=torch.long)
        seqs[:, 0] = torch.randint(VOCAB, (SEQUENCES,), generator=g)
        for t in range(SEQ_LEN):
            seqs[:, t + 1] = successors[seqs[:, t], choices[:, t]]
        self.sequences = seqs
        self.seed = seed
        self.epoch = 0
        self.index = 0

    def next_batch(self, rank, world_size):
        """Rank `rank`'s share of the next global batch: (inputs, targets)."""
        if self.index + GLOBAL_BATCH > SEQUENCES:
            self.epoch, self.index = self.epoch + 1, 0
        shuffle = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        order = torch.randperm(SEQUENCES, generator=shuffle)
        batch = order[self.index:self.index + GLOBAL_BATCH]
        self.index += GLOBAL_BATCH
        share = GLOBAL_BATCH // world_size
        rows = self.sequences[batch[rank * share:(rank + 1) * share]]
        return rows[:, :-1], rows[:, 1:]

    def state_dict(self):
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state):
        self.epoch, self.index = state["epoch"], state["index"]


def rank_seed(seed, rank, step=0):
    """The seed of a rank's own RNG (dropout), at a start from `step`."""
    return seed * 1_000_003 + step * 1009 + rank


# ------------------------------------------------------------ checkpoint

class TrainState(Stateful):
    """Everything a resumed run needs, as one DCP Stateful: dcp.async_save
    calls state_dict(); dcp.load fills state_dict()'s tensors and objects
    from the checkpoint, then calls load_state_dict() with them."""

    def __init__(self, model, optim, sched, data, rank):
        self.model, self.optim, self.sched = model, optim, sched
        self.data, self.rank = data, rank
        self.step = 0
        # Whether state_dict() holds this rank's RNG state: False while
        # loading a checkpoint saved by another number of ranks.
        self.with_rng = True

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        state = {"model": model_sd, "optim": optim_sd,
                 "sched": self.sched.state_dict(),
                 "data": self.data.state_dict(), "step": self.step}
        if self.with_rng:
            state["rng"] = {f"rank{self.rank}": torch.get_rng_state()}
        return state

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optim,
                       model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])
        self.sched.load_state_dict(state_dict["sched"])
        self.data.load_state_dict(state_dict["data"])
        self.step = int(state_dict["step"])
        if self.with_rng:
            torch.set_rng_state(state_dict["rng"][f"rank{self.rank}"])


def checkpoint_id(args, step):
    return f"cairn://{args.coordinator}/{args.job}/{step}"


def latest_checkpoint(args):
    """(step, number of ranks that saved it) of the job's latest committed
    checkpoint, or None. Rank 0 reads its DCP metadata from cairnd and tells
    the others: every rank must load the same step, even if a save commits
    meanwhile (collective)."""
    found = [None]
    if dist.get_rank() == 0:
        reader = CairnStorageReader(checkpoint_id=checkpoint_id(args, "latest"))
        try:
            metadata = reader.read_metadata()  # resolves "latest" to a step
            saved_by = sum(1 for fqn in metadata.state_dict_metadata
                           if fqn.startswith("train.rng."))
            found = [(reader.step, saved_by)]
        except cairn.NotFoundError:
            pass
    dist.broadcast_object_list(found, src=0)
    return found[0]


def resume(state, args, rank, world_size):
    """Loads the job's latest committed checkpoint into `state` (collective);
    returns the number of ranks that saved it, or None when there is none."""
    latest = latest_checkpoint(args)
    if latest is None:
        return None
    step, saved_by = latest
    train = state["train"]
    train.with_rng = saved_by == world_size
    dcp.load(state, checkpoint_id=checkpoint_id(args, step),
             storage_reader=CairnStorageReader())
    if not train.with_rng:
        torch.manual_seed(rank_seed(args.seed, rank, train.step))
        train.with_rng = True
    return saved_by


def async_save(state, args, group):
    """Starts saving the current state as checkpoint train.step; returns
    DCP's future (its result() returns once the checkpoint is committed)."""
    ckpt_id = checkpoint_id(args, state["train"].step)
    # The writer is given the step too: with a cairn-agent it then stages
    # straight into the agent's shared memory (one copy).
    return dcp.async_save(
        state, checkpoint_id=ckpt_id,
        storage_writer=CairnStorageWriter(checkpoint_id=ckpt_id,
                                          process_group=group,
                                          agent_socket=args.agent_socket),
        process_group=group)


def write_final_state(path, model, optim, step, rank):
    """Rank 0 torch.saves the full, unsharded model and optimizer state
    (collective: every rank takes part in gathering it)."""
    model_sd, optim_sd = get_state_dict(model, optim, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"step": step, "model": model_sd, "optim": optim_sd}, path)


# ------------------------------------------------------------ training

def train_step(model, optim, sched, data, rank, world_size):
    inputs, targets = data.next_batch(rank, world_size)
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    optim.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optim.step()
    sched.step()
    return loss.item()


def say(rank, text):
    """Prints a line from rank 0 (or from every rank: rank=None), in one
    write so the ranks' lines do not interleave."""
    if rank in (0, None):
        print(f"train.py: {text}\n", end="", flush=True)


def init_process_group(rank, args, port):
    timeout = datetime.timedelta(seconds=args.timeout)
    if port is None:  # torchrun-style: rank 0 serves $MASTER_ADDR:$MASTER_PORT
        dist.init_process_group("gloo", rank=rank, world_size=args.world_size,
                                timeout=timeout)
        return
    store = dist.TCPStore("127.0.0.1", port, args.world_size, False,
                          timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank,
                            world_size=args.world_size, timeout=timeout)


def rank_main(rank, args, port):
    torch.set_num_threads(1)  # deterministic kernels; the ranks share cores
    init_process_group(rank, args, port)
    world = args.world_size
    say(None, f"rank {rank} of {world}: pid {os.getpid()}")
    checkpoint_group = dist.new_group(backend="gloo")  # async_save's own

    model = build_model(args.seed, init_device_mesh("cpu", (world,)))
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr,
                              weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_schedule(args.steps))
    data = TokenStream(args.seed)
    torch.manual_seed(rank_seed(args.seed, rank))
    train = TrainState(model, optim, sched, data, rank)
    state = {"train": train}

    saved_by = resume(state, args, rank, world)
    if saved_by is None:
        say(rank, f"job {args.job}: no checkpoint at {args.coordinator}, "
                  f"starting from step 0")
    else:
        how = ("" if saved_by == world else
               f"; saved by {saved_by} ranks, resharded to {world}, "
               f"RNG reseeded")
        say(rank, f"job {args.job}: resumed from step {train.step} "
                  f"(lr {sched.get_last_lr()[0]:.6f}{how})")

    pending = None  # (step, future) of the save in flight
    while train.step < args.steps:
        loss = train_step(model, optim, sched, data, rank, world)
        train.step += 1
        if train.step % args.save_every and train.step != args.steps:
            continue
        if pending is not None:
            pending[1].result()
            say(rank, f"job {args.job}: step {pending[0]} committed")
        pending = (train.step, async_save(state, args, checkpoint_group))
        say(rank, f"job {args.job}: saving step {train.step} (async_save), "
                  f"loss {loss:.4f}")
    if pending is not None:
        pending[1].result()
        say(rank, f"job {args.job}: step {pending[0]} committed")

    if args.final_state:
        write_final_state(args.final_state, model, optim, train.step, rank)
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------ command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--coordinator", default=os.environ.get("CAIRN_COORDINATOR"),
                   help="cairnd's HOST:PORT (default: $CAIRN_COORDINATOR)")
    p.add_argument("--job", default=os.environ.get("CAIRN_JOB", "train-example"),
                   help="the job's name in cairnd (default: $CAIRN_JOB or "
                        "train-example)")
    p.add_argument("--world-size", type=int,
                   default=int(os.environ.get("WORLD_SIZE", "2")),
                   help=f"number of ranks, dividing {GLOBAL_BATCH} "
                        f"(default: $WORLD_SIZE or 2)")
    p.add_argument("--rank", type=int,
                   default=int(os.environ["RANK"]) if os.environ.get("RANK") else None,
                   help="run only this rank in this process, the others being "
                        "started elsewhere (torchrun, an indexed Kubernetes "
                        "Job); they meet at $MASTER_ADDR:$MASTER_PORT "
                        "(default: $RANK; none: spawn every rank here)")
    p.add_argument("--steps", type=int, default=40, help="train to this step")
    p.add_argument("--save-every", type=int, default=10,
                   help="async_save every this many steps (and at the last)")
    p.add_argument("--final-state", default=None,
                   help="rank 0 torch.saves the full model and optimizer "
                        "state here at the end")
    p.add_argument("--agent-socket",
                   default=os.environ.get("CAIRN_AGENT_SOCKET") or None,
                   help="save through this node's cairn-agent (default "
                        "CAIRN_AGENT_SOCKET): async_save then blocks for one "
                        "copy into its shared memory")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective may wait (gloo)")
    args = p.parse_args(argv)
    if not args.coordinator:
        p.error("no coordinator: pass --coordinator HOST:PORT or set "
                "CAIRN_COORDINATOR")
    if args.world_size < 1 or args.steps < 1 or args.save_every < 1:
        p.error("--world-size, --steps and --save-every must be >= 1")
    if GLOBAL_BATCH % args.world_size:
        p.error(f"--world-size {args.world_size} does not divide the global "
                f"batch of {GLOBAL_BATCH} sequences")
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
    # The ranks' rendezvous store, served here on a port the kernel picked
    # and held while they run (a port found free and then released could be
    # taken by another process before a rank binds it).
    store = dist.TCPStore("127.0.0.1", 0, args.world_size, True,
                          timeout=datetime.timedelta(seconds=args.timeout),
                          wait_for_workers=False)
    try:
        mp.spawn(rank_main, args=(args, store.port), nprocs=args.world_size,
                 join=True)
    except mp.ProcessExitedException as e:
        if not e.signal_name:
            raise
        say(0, f"job {args.job}: rank {e.error_index} was killed "
               f"({e.signal_name}); run the command again to resume from the "
               f"latest committed checkpoint")
        return 128 + signal.Signals[e.signal_name].value
    return 0


if __name__ == "__main__":
    sys.exit(main())
