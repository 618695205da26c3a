#!/usr/bin/python3
"""ob's gpt-tiny trained with PyTorch DistributedDataParallel over Gloo.

The peer of `ob-launch` in bench/peers.sh; run it under torchrun:

    torchrun --nproc_per_node 4 bench/peers/ddp_gpt.py --data README.md \
        --steps 100 --log-dir LOGS [--ckpt FILE --ckpt-every 10]

It mirrors ob's reference training (lib/ob/model/{gpt,train,data}.cc) so
that the two runs do the same arithmetic:

  - model: GPT-2 shape, pre-LN blocks, tanh-GELU MLP, learned positions,
    LM head tied to the token table; gpt-tiny is 4 layers, 128 wide, 4
    heads, 64 positions, a 256-byte vocabulary;
  - weights: GPT-2 init (N(0, 0.02); residual projections 0.02/sqrt(2L);
    zero biases; LayerNorm 1/0), each layer drawn from a CPU generator seeded
    with Mix64(seed, layer index) in ob's order, so the first loss equals
    ob's;
  - data: the file's bytes are the tokens; sample i of step k is the window
    starting at Mix64(seed, k, i) mod (size - seq_len); micro-batch g of a
    step holds samples [g*b, (g+1)*b) and rank r runs micro-batches
    [r*m, (r+1)*m), as ob's data-parallel pipelines do;
  - each micro-batch's mean loss weighted by 1/m, DDP averaging over the
    ranks (gradients all-reduced once per step: no_sync on the others);
  - global-norm clipping at 1.0; AdamW lr 1e-3, betas (0.9, 0.95), eps 1e-8,
    weight decay 0.1 on >= 2-D parameters only; linear warm-up then cosine
    decay to 0 at --steps.

Every rank appends one flushed line per completed step to LOG_DIR/rank<R>.log:
    step=<k> unix_ms=<ms> step_s=<s> loss=<global mean> restart=<n> pid=<pid>
and one `start ...` line when it starts. With --ckpt, rank 0 saves model,
optimizer and step with torch.save every --ckpt-every steps (to a temporary
file, then renamed) and every rank resumes from it when it exists.
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

# ob's gpt-tiny preset (lib/ob/model/config.cc).
N_LAYER, N_EMBD, N_HEAD, N_POSITIONS, VOCAB = 4, 128, 4, 64, 256
INIT_STD = 0.02  # GPT-2's weight initialisation scale

MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def mix64(a, b=0, c=0):
    """ob::model::Mix64: data offsets and per-layer initialisation seeds."""
    h = splitmix64(a ^ 0x6A09E667F3BCC908)
    h = splitmix64(h ^ b)
    return splitmix64(h ^ splitmix64((c + 0xBB67AE8584CAA73B) & MASK64))


def layer_generator(seed, global_index):
    g = torch.Generator()
    g.manual_seed(mix64(seed, global_index))
    return g


class Block(nn.Module):
    def __init__(self, index, seed):
        super().__init__()
        h = N_EMBD
        self.ln_1 = nn.LayerNorm(h)
        self.c_attn = nn.Linear(h, 3 * h)
        self.attn_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h)
        self.c_fc = nn.Linear(h, 4 * h)
        self.mlp_proj = nn.Linear(4 * h, h)
        residual_std = INIT_STD / math.sqrt(2.0 * N_LAYER)
        gen = layer_generator(seed, index)
        with torch.no_grad():
            for lin, std in ((self.c_attn, INIT_STD), (self.attn_proj, residual_std),
                             (self.c_fc, INIT_STD), (self.mlp_proj, residual_std)):
                lin.weight.normal_(0.0, std, generator=gen)
                lin.bias.zero_()

    def attention(self, x):
        b, t, h = x.shape
        d = h // N_HEAD
        q, k, v = self.c_attn(x).split(h, dim=2)
        q, k, v = (z.view(b, t, N_HEAD, d).transpose(1, 2) for z in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(future, float("-inf"))
        y = torch.matmul(torch.softmax(att, -1), v)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, h))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, seed):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, N_EMBD)
        self.wpe = nn.Embedding(N_POSITIONS, N_EMBD)
        gen = layer_generator(seed, 0)
        with torch.no_grad():
            self.wte.weight.normal_(0.0, INIT_STD, generator=gen)
            self.wpe.weight.normal_(0.0, INIT_STD, generator=gen)
        self.blocks = nn.ModuleList(Block(i + 1, seed) for i in range(N_LAYER))
        self.ln_f = nn.LayerNorm(N_EMBD)

    def forward(self, ids, targets):
        t = ids.size(1)
        x = self.wte(ids) + self.wpe(torch.arange(t)).unsqueeze(0)
        for block in self.blocks:
            x = block(x)
        logits = torch.matmul(self.ln_f(x), self.wte.weight.t())  # tied LM head
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


class Tokens:
    """A file's bytes as tokens, sampled as ob::model::TokenSource does."""

    def __init__(self, path):
        with open(path, "rb") as f:
            data = f.read()
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()

    def batch(self, seed, step, first, count, seq_len):
        windows = self.tokens.numel() - seq_len
        xs, ys = [], []
        for i in range(first, first + count):
            off = mix64(seed, step, i) % windows
            xs.append(self.tokens[off:off + seq_len])
            ys.append(self.tokens[off + 1:off + seq_len + 1])
        return torch.stack(xs), torch.stack(ys)


def learning_rate(args, step):
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    decay = max(1, args.steps - args.warmup_steps)
    progress = min(1.0, (step - args.warmup_steps) / decay)
    return 0.5 * args.lr * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model, args):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="text file; its bytes are the tokens")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--global-batch", type=int, default=16, help="sequences per step")
    p.add_argument("--microbatch", type=int, default=1, help="sequences per forward/backward")
    p.add_argument("--seq-len", type=int, default=N_POSITIONS)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1234, help="ob-launch's default")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--log-dir", required=True, help="per-rank step logs go here")
    p.add_argument("--ckpt", help="checkpoint file: resume from it, save to it")
    p.add_argument("--ckpt-every", type=int, default=10)
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.global_batch % (world * args.microbatch) != 0:
        sys.exit(f"ddp_gpt: global batch {args.global_batch} is not a multiple of "
                 f"{world} ranks x micro-batch {args.microbatch}")
    m = args.global_batch // (world * args.microbatch)  # micro-batches per rank

    os.makedirs(args.log_dir, exist_ok=True)
    log = open(os.path.join(args.log_dir, f"rank{rank}.log"), "a", buffering=1)
    data = Tokens(args.data)
    model = Gpt(args.seed)
    optimizer = make_optimizer(model, args)
    first_step = 0
    if args.ckpt and os.path.exists(args.ckpt):
        state = torch.load(args.ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_step = state["step"] + 1
    ddp = DistributedDataParallel(model)
    print(f"start unix_ms={int(time.time() * 1000)} rank={rank} world={world} "
          f"restart={restart} pid={os.getpid()} first_step={first_step} "
          f"threads={torch.get_num_threads()}", file=log)

    for step in range(first_step, args.steps):
        start = time.perf_counter()
        lr = learning_rate(args, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=False)
        loss_sum = torch.zeros(1, dtype=torch.float64)
        for j in range(m):
            g = rank * m + j  # global micro-batch index
            x, y = data.batch(args.seed, step, g * args.microbatch, args.microbatch, args.seq_len)
            if j < m - 1:
                with ddp.no_sync():
                    loss = ddp(x, y)
                    (loss / m).backward()
            else:
                loss = ddp(x, y)  # this backward all-reduces (averages) the gradients
                (loss / m).backward()
            loss_sum += loss.detach().double() / (m * world)
        dist.all_reduce(loss_sum)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step_s = time.perf_counter() - start
        print(f"step={step} unix_ms={int(time.time() * 1000)} step_s={step_s:.6f} "
              f"loss={loss_sum.item():.6f} restart={restart} pid={os.getpid()}", file=log)
        if args.ckpt and rank == 0 and (step + 1) % args.ckpt_every == 0:
            tmp = args.ckpt + ".tmp"
            torch.save({"step": step, "model": model.state_dict(),
                        "optimizer": optimizer.state_dict()}, tmp)
            os.replace(tmp, args.ckpt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
