#!/usr/bin/python3
"""A plain PyTorch training loop for ob's GPT, on one device: the peer of
`ob-launch` on one GPU (issue 13, GPU point 3; bench/README.md).

    python3 bench/peers/torch_loop.py --model gpt2-medium --micro-batch 8 \
        --global-batch 32 --seq-len 1024 --steps 100 [--device cuda] \
        [--precision bf16] [--peak-tflops 989] [--json OUT] [--trace FILE]

What it runs is what ob trains (lib/ob/model/gpt.cc, train.cc): GPT-2
shape, pre-LN blocks, tanh-GELU MLP, learned positions, LM head tied to the
token table; eager PyTorch with `scaled_dot_product_attention(is_causal)`,
fused AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
matrices), global-norm clipping at 1.0, gradient accumulation over
global/micro micro-batches, bf16 autocast over fp32 weights (or fp32).
Tokens are drawn at random on the device: the loop measures the model,
not a data loader (ob reads its corpus from a file; that cost is ob's).

It prints one line per step and a summary: tokens/s over the steps after
--skip (warm-up), MFU = model FLOPs per second / peak, with the same model
FLOPs per token as ob (lib/ob/profile/analytic.cc: per block 6·params +
12·h·s, head 6·(V·h + 2h)), and peak memory (torch.cuda.max_memory_allocated).
"""

import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# ob's presets (lib/ob/model/config.cc): layers, width, heads, positions, vocabulary.
PRESETS = {
    "gpt-tiny": (4, 128, 4, 64, 256),
    "gpt2": (12, 768, 12, 1024, 50257),
    "gpt2-medium": (24, 1024, 16, 1024, 50257),
    "gpt2-large": (36, 1280, 20, 1024, 50257),
    "gpt2-xl": (48, 1600, 25, 1024, 50257),
}
# Dense peaks by device name, bf16 and fp32 (TF32 not counted), TFLOP/s.
PEAKS = {"H100": (989.0, 67.0), "H200": (989.0, 67.0), "A100": (312.0, 19.5)}


class Block(nn.Module):
    def __init__(self, h, heads, n_layer):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(h)
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h)
        self.c_fc = nn.Linear(h, 4 * h)
        self.mlp_proj = nn.Linear(4 * h, h)
        for lin, std in ((self.c_attn, 0.02), (self.c_proj, 0.02 / math.sqrt(2 * n_layer)),
                         (self.c_fc, 0.02), (self.mlp_proj, 0.02 / math.sqrt(2 * n_layer))):
            nn.init.normal_(lin.weight, 0.0, std)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        heads = lambda z: z.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, n_layer, h, heads, positions, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(positions, h)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList(Block(h, heads, n_layer) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(h)

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def flops_per_token(n_layer, h, vocab, seq_len):
    block_params = 12 * h * h + 13 * h
    return n_layer * (6.0 * block_params + 12.0 * h * seq_len) + 6.0 * (vocab * h + 2 * h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt2-medium", choices=sorted(PRESETS))
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the rates")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default=None, choices=["bf16", "fp32"],
                    help="default: bf16 on CUDA, fp32 on CPU (as ob-launch)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="dense peak; default: by device name")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", default="", help="write the summary here too")
    ap.add_argument("--trace", default="", help="write a Chrome trace of steps --trace-steps here")
    ap.add_argument("--trace-steps", default="20-21", help="FIRST-LAST (as ob-launch's OB_TRACE_STEPS)")
    a = ap.parse_args()
    if a.global_batch % a.micro_batch or a.steps <= a.skip:
        sys.exit("torch_loop: the global batch must be a multiple of the micro-batch, --steps > --skip")
    precision = a.precision or ("bf16" if a.device.startswith("cuda") else "fp32")
    n_layer, h, heads, positions, vocab = PRESETS[a.model]
    if a.seq_len > positions:
        sys.exit(f"torch_loop: --seq-len {a.seq_len} exceeds {a.model}'s {positions} positions")

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    model = Gpt(n_layer, h, heads, positions, vocab).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    accum = a.global_batch // a.micro_batch
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    trace_first, trace_last = (int(v) for v in a.trace_steps.split("-"))
    prof = None
    times, losses = [], []
    for step in range(a.steps):
        sync()
        if a.trace and step == trace_first:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if dev.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            prof = torch.profiler.profile(activities=acts)
            prof.__enter__()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(accum):
            ids = torch.randint(vocab, (a.micro_batch, a.seq_len + 1), generator=gen, device=dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = model(ids[:, :-1], ids[:, 1:]) / accum
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(total))  # syncs, as ob's step does when it reports
        sync()
        times.append(time.perf_counter() - t0)
        if prof is not None and step == trace_last:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(a.trace)
            prof = None
        print(f"step={step} loss={losses[-1]:.4f} step_s={times[-1]:.4f}", flush=True)

    tokens_per_step = a.global_batch * a.seq_len
    measured = times[a.skip:]
    tokens_s = tokens_per_step * len(measured) / sum(measured)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak = a.peak_tflops
    if peak <= 0:
        for key, (bf16, fp32) in PEAKS.items():
            if key in name:
                peak = bf16 if precision == "bf16" else fp32
    mfu = tokens_s * flops_per_token(n_layer, h, vocab, a.seq_len) / (peak * 1e12) if peak > 0 else 0.0
    summary = {
        "peer": "torch_loop", "model": a.model, "device": name, "precision": precision,
        "torch": torch.__version__, "micro_batch": a.micro_batch, "global_batch": a.global_batch,
        "seq_len": a.seq_len, "steps": a.steps, "skip": a.skip, "tokens_per_s": tokens_s,
        "median_step_s": sorted(measured)[len(measured) // 2], "mfu": mfu, "peak_tflops": peak,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0,
        "final_loss": losses[-1],
    }
    print("# " + json.dumps(summary), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
