#!/usr/bin/python3
"""A plain PyTorch training loop for ob's models, on one device: the peer
of `ob-launch` on one GPU (issue 13, GPU point 3; issue 58; bench/README.md).

    python3 bench/peers/torch_loop.py --model gpt2-medium --micro-batch 8 \
        --global-batch 32 --seq-len 1024 --steps 100 [--device cuda] \
        [--precision bf16] [--compile] [--peak-tflops 989] [--json OUT] [--trace FILE]

What it runs is what ob trains (lib/ob/model/gpt.cc, llama.cc, train.cc):
GPT-2 (pre-LN blocks, tanh-GELU MLP, learned positions, LM head tied to the
token table) or the Llama family (RMSNorm, rotary positions with Llama 3's
scaling, grouped-query attention, SwiGLU; llama-tiny untied, llama3.2-1b
tied, as ob's presets); eager PyTorch with
`scaled_dot_product_attention(is_causal)` (an explicit masked softmax where
the torch has none, 1.13), fused AdamW on a GPU (lr 1e-3, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on matrices), global-norm clipping at 1.0,
gradient accumulation over global/micro micro-batches, bf16 autocast over
fp32 weights (or fp32). --compile puts each block and the head with its
loss under torch.compile, as torchtitan does (the stronger peer; exit 3
where the torch has none); its compilation falls in the first steps, left
out with --skip, and its first step's time is reported. Tokens are drawn
at random on the device: the loop measures the model, not a data loader
(ob reads its corpus from a file; that cost is ob's).

It prints one line per step and a summary: tokens/s over the steps after
--skip (warm-up), MFU = model FLOPs per second / peak, with the same model
FLOPs per token as ob (lib/ob/profile/analytic.cc): `mfu` by PaLM's count,
6N + 12·L·(a·d)·s (per block 6·params + 12·(a·d)·s, head 6·(V·h + its
norm)), `mfu_llmc` by llm.c's, 6N + 6·L·(a·d)·s with N every parameter; and
peak memory (torch.cuda.max_memory_allocated).
"""

import argparse
import importlib
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# ob's GPT-2 presets (lib/ob/model/config.cc): layers, width, heads, positions, vocabulary.
PRESETS = {
    "gpt-tiny": (4, 128, 4, 64, 256),
    "gpt2": (12, 768, 12, 1024, 50257),
    "gpt2-medium": (24, 1024, 16, 1024, 50257),
    "gpt2-large": (36, 1280, 20, 1024, 50257),
    "gpt2-xl": (48, 1600, 25, 1024, 50257),
}
# ob's Llama presets (lib/ob/model/llama_config.cc) as Hugging Face's
# config.json names them.
LLAMA = {
    "llama-tiny": dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, intermediate_size=352, vocab_size=256, max_position_embeddings=64,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=16)),
    "llama3.2-1b": dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=64, intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072,
                        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=8192)),
}
# Dense peaks by device name, bf16 and fp32 (TF32 not counted), TFLOP/s.
PEAKS = {"H100": (989.0, 67.0), "H200": (989.0, 67.0), "A100": (312.0, 19.5)}


def causal_attention(q, k, v):
    """Causal attention of [b, heads, s, d] tensors: SDPA where the torch
    has it, else the masked softmax it computes."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = q.shape[-2]
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    return torch.softmax(att.masked_fill(future, float("-inf")), dim=-1).to(v.dtype) @ v


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
        y = causal_attention(heads(q), heads(k), heads(v))
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
        return self.loss(x, targets)

    def loss(self, x, targets):
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


class RmsNorm(nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def llama_inv_freq(c):
    """Rotary frequencies with Llama 3's scaling (HF's llama3 rope type)."""
    d, r = c["head_dim"], c["rope_scaling"]
    f = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
    factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
    old = r["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    scaled = torch.where(wavelen > old / low, f / factor, f)
    t = (old / wavelen - low) / (high - low)
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, (1 - t) * scaled / factor + t * scaled, scaled)


class LlamaBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.H, self.K, self.d = c["num_attention_heads"], c["num_key_value_heads"], d
        self.input_layernorm = RmsNorm(h, c["rms_norm_eps"])
        self.q_proj = nn.Linear(h, self.H * d, bias=False)
        self.k_proj = nn.Linear(h, self.K * d, bias=False)
        self.v_proj = nn.Linear(h, self.K * d, bias=False)
        self.o_proj = nn.Linear(self.H * d, h, bias=False)
        self.post_attention_layernorm = RmsNorm(h, c["rms_norm_eps"])
        self.gate_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], h, bias=False)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.o_proj, self.gate_proj, self.up_proj,
                    self.down_proj):
            nn.init.normal_(lin.weight, 0.0, 0.02)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, s, self.H, self.d).transpose(1, 2)
        k = self.k_proj(y).view(b, s, self.K, self.d).transpose(1, 2)
        v = self.v_proj(y).view(b, s, self.K, self.d).transpose(1, 2)

        def rotate(z):
            a, c = z.chunk(2, dim=-1)
            return z * cos + torch.cat((-c, a), dim=-1) * sin
        q, k = rotate(q).to(v.dtype), rotate(k).to(v.dtype)
        k = k.repeat_interleave(self.H // self.K, dim=1)
        v = v.repeat_interleave(self.H // self.K, dim=1)
        o = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, self.H * self.d)
        x = x + self.o_proj(o)
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        nn.init.normal_(self.embed_tokens.weight, 0.0, 0.02)
        self.layers = nn.ModuleList(LlamaBlock(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RmsNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = None
        if not c["tie_word_embeddings"]:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
            nn.init.normal_(self.lm_head.weight, 0.0, 0.02)
        self.register_buffer("inv_freq", llama_inv_freq(c), persistent=False)

    def forward(self, ids, targets):
        freqs = torch.outer(torch.arange(ids.shape[1], device=ids.device).float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.loss(x, targets)

    def loss(self, x, targets):
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(self.norm(x), head)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def flops_per_token(model, seq_len):
    """Model FLOPs per token as ob counts them (lib/ob/profile/analytic.cc):
    PaLM's 6N + 12·L·(a·d)·s (N less the embedding, the tied matrix once)
    and llm.c's 6N + 6·L·(a·d)·s (N every parameter)."""
    if model in LLAMA:
        c = LLAMA[model]
        L, h, V = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
        q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
        block = 2 * h * q + 2 * h * kv + 3 * h * c["intermediate_size"] + 2 * h
        head_own = h + (0 if c["tie_word_embeddings"] else V * h)
        palm = L * (6.0 * block + 12.0 * q * seq_len) + 6.0 * (V * h + h)
        llmc = 6.0 * (V * h + L * block + head_own) + 6.0 * L * q * seq_len
        return palm, llmc
    L, h, _, positions, V = PRESETS[model]
    block = 12 * h * h + 13 * h
    palm = L * (6.0 * block + 12.0 * h * seq_len) + 6.0 * (V * h + 2 * h)
    llmc = 6.0 * (V * h + positions * h + L * block + 2 * h) + 6.0 * L * h * seq_len
    return palm, llmc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt2-medium", choices=sorted(PRESETS) + sorted(LLAMA))
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the rates")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default=None, choices=["bf16", "fp32"],
                    help="default: bf16 on CUDA, fp32 on CPU (as ob-launch)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="dense peak; default: by device name")
    ap.add_argument("--compile", action="store_true", help="the model under torch.compile")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", default="", help="write the summary here too")
    ap.add_argument("--trace", default="", help="write a Chrome trace of steps --trace-steps here")
    ap.add_argument("--trace-steps", default="20-21", help="FIRST-LAST (as ob-launch's OB_TRACE_STEPS)")
    a = ap.parse_args()
    if a.global_batch % a.micro_batch or a.steps <= a.skip:
        sys.exit("torch_loop: the global batch must be a multiple of the micro-batch, --steps > --skip")
    precision = a.precision or ("bf16" if a.device.startswith("cuda") else "fp32")
    if a.model in LLAMA:
        vocab, positions = LLAMA[a.model]["vocab_size"], LLAMA[a.model]["max_position_embeddings"]
    else:
        n_layer, h, heads, positions, vocab = PRESETS[a.model]
    if a.seq_len > positions:
        sys.exit(f"torch_loop: --seq-len {a.seq_len} exceeds {a.model}'s {positions} positions")
    if a.compile and not hasattr(torch, "compile"):
        print(f"torch_loop: --compile: torch {torch.__version__} has no torch.compile", file=sys.stderr)
        sys.exit(3)

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    model = (Llama(LLAMA[a.model]) if a.model in LLAMA else Gpt(n_layer, h, heads, positions, vocab)).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if fused else {}))
    accum = a.global_batch // a.micro_batch
    if a.compile:
        # As torchtitan compiles: each block (one compilation serves them
        # all, as their code is one) and the head with its loss; the
        # embedding's lookup stays eager. The whole model would be one graph
        # of every layer, its compilation growing with the depth, and the
        # lent GPU's call has minutes.
        dynamo = importlib.import_module("torch._dynamo")  # (an `import torch._dynamo` here would make torch local)
        blocks = model.blocks if hasattr(model, "blocks") else model.layers
        for name in ("recompile_limit", "cache_size_limit"):  # (renamed in later torch)
            if hasattr(dynamo.config, name):
                setattr(dynamo.config, name, max(64, 2 * len(blocks)))
                break
        for i in range(len(blocks)):
            blocks[i] = torch.compile(blocks[i])
        model.loss = torch.compile(model.loss)
    run = model
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
                loss = run(ids[:, :-1], ids[:, 1:]) / accum
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
    palm, llmc = flops_per_token(a.model, a.seq_len)
    mfu = tokens_s * palm / (peak * 1e12) if peak > 0 else 0.0
    mfu_llmc = tokens_s * llmc / (peak * 1e12) if peak > 0 else 0.0
    summary = {
        "peer": "torch_loop" + (" (torch.compile)" if a.compile else ""), "model": a.model, "device": name,
        "precision": precision, "compile": a.compile, "first_step_s": times[0],
        "torch": torch.__version__, "micro_batch": a.micro_batch, "global_batch": a.global_batch,
        "seq_len": a.seq_len, "steps": a.steps, "skip": a.skip, "tokens_per_s": tokens_s,
        "median_step_s": sorted(measured)[len(measured) // 2], "mfu": mfu, "mfu_llmc": mfu_llmc, "peak_tflops": peak,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0,
        "final_loss": losses[-1],
    }
    print("# " + json.dumps(summary), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
