#!/usr/bin/python3
"""An independent Hugging Face Llama / Qwen2 / Qwen3 causal LM, and ob's training recipe.

Not ob's code: the model is written from Hugging Face's published formulas
for LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM (transformers'
modeling_llama.py, modeling_qwen3.py, modeling_rope_utils.py), so that ob's
C++ Llama family can be checked against something it does not share.
Run it with Debian's torch 1.13: /usr/bin/python3 (stdlib + torch only;
CPU, fp32, deterministic).

CLI
  hf_llama.py init --model llama-tiny|qwen3-tiny [--set KEY=JSON ...] [--seed N] [--dtype F32|BF16|F16]
                   [--shards K] OUT_DIR
  hf_llama.py train HF_DIR --data FILE --steps N [--first-step 1] --seq-len S
                   --micro-batch b --global-batch B [--seed 0] [--out DIR]
                   [--lr 1e-3] [--min-lr 0] [--warmup-steps 0]
                   [--lr-schedule cosine|constant] [--schedule-steps T]
  hf_llama.py loss HF_DIR --data FILE --step K --seq-len S --micro-batch b
                   --global-batch B [--seed 0]
  hf_llama.py compare DIR_A DIR_B [--rel 1e-5] [--each REL]
train prints `step=<k> loss=<%.9g>` per step (the global batch's mean loss,
before the update); loss prints `loss=<%.9g>`; compare prints ||a - b|| / ||b|| over all
parameters (exit 1 above --rel) and the worst tensor's (exit 1 above
--each, when given; see cmd_compare for why not the largest element), and
exits 2 when the names or shapes differ.

Model (HF): RMSNorm x * rsqrt(mean(x^2) + eps) in fp32, then weight * x;
rotate_half RoPE (pairs i, i + d/2; emb = cat(freqs, freqs)), inv_freq =
theta^(-2i/d), scaled by rope_scaling / rope_parameters ("type" is an alias
of "rope_type"): "linear" inv_freq / factor; "llama3": wavelengths 2pi/f
above original/low_freq_factor divided by factor, below original/high kept,
in between (1 - s) f / factor + s f with s = (original/wavelen - low) /
(high - low). Qwen3: per-head RMSNorm of q and k (weight [head_dim]) before
the rotation. Qwen2 (or Llama's attention_bias): q/k/v(/o) biases, used
when the file has them. GQA: query head j reads kv head j // (H/K). Causal
softmax attention scaled by 1/sqrt(head_dim); SwiGLU down(silu(gate(x)) *
up(x)); final norm; lm_head, or the embedding when tie_word_embeddings.
head_dim from config.json, else hidden/heads. No dropout.

Recipe (ob's, so that losses and weights agree with ob-launch --resume):
  - data (lib/ob/model/data.h, data.cc): "*.bin" is uint16 ids (or llm.c's
    .bin: 256 int32 header, magic 20240520, version 1 u16 / 2 u32), "*.u32"
    uint32, anything else its bytes (vocabulary 256). Sample i of step k is
    the window at off = Mix64(seed, k, i) mod (n - S), x = tokens[off, off+S),
    y = tokens[off+1, off+S+1] (targets = tokens shifted by one).
  - batch (lib/ob/model/train.cc Train, bench/peers/ddp_gpt.py): micro-batch
    g of a step holds samples [g*b, (g+1)*b); each micro-batch's mean
    cross-entropy is weighted by b/B for the backward and summed (in
    double) as the step's loss. B must be a multiple of b (train.cc).
  - clipping (lib/ob/runtime/stage_worker_step.cc ApplyUpdate): the global L2 norm
    of all gradients (per-tensor norms, squares summed in double), scaled by
    clip / (norm + 1e-6) only when that is < 1; clip 1.0.
  - AdamW (train.cc MakeOptimizer, LibTorch's AdamW): lr 1e-3, betas (0.9,
    0.95), eps 1e-8, weight decay 0.1 on >= 2-D parameters (embedding,
    lm_head, projections), none on norms/biases; p *= 1 - lr*wd, then the
    bias-corrected Adam step with count t.
  - schedule (train.cc LearningRate; lib/ob/launch/worker/worker.cc sets its total
    to ob-launch --steps, whose last step is steps-1): step k < warmup:
    lr*(k+1)/warmup; after: min_lr + (lr-min_lr)/2 * (1 + cos(pi * min(1,
    (k-warmup)/max(1, T-warmup)))). Warm-up 0 and min_lr 0 by default
    (tools/launch/options.cc). T defaults to first_step + N, as `ob-launch
    --steps first_step+N --resume` runs steps first_step .. T-1.
  - resume from an import (lib/ob/ckpt/hf.h: the checkpoint is step
    first_step-1 with zero Adam moments and step counts;
    lib/ob/runtime/snapshot.cc SetAdamState drops the state of a count of 0):
    AdamW starts afresh, its bias correction counting t = 1, 2, ... from
    first_step, while the learning rate is that of the step numbers.
  - seed: default 0 here (TrainOptions' default, train.h); ob-launch's
    default is 1234 (tools/launch/options.cc): pass --seed to match a run.
train --out writes the final weights (F32, one model.safetensors, lm_head
only when untied) and a verbatim copy of config.json.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys

import torch
import torch.nn.functional as F

MASK64 = (1 << 64) - 1
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
TORCH_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}

PRESETS = {  # ob's presets (the C++ side defines them identically)
    "llama-tiny": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128,
        intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=64,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        rms_norm_eps=1e-5, tie_word_embeddings=False),
    "qwen3-tiny": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=128,
        intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=256, max_position_embeddings=64,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
}


def fail(msg, code=1):
    print("hf_llama: " + msg, file=sys.stderr)
    sys.exit(code)


# ---- safetensors, by the format's published layout ----

def write_safetensors(path, tensors):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for raw in blobs:
            f.write(raw)
    return at


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] not in DTYPES:
            fail(f"{path}: tensor {name} is {e['dtype']}, not F32/BF16/F16")
        a, b = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        raw = bytearray(data[8 + n + a:8 + n + b])
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"]).to(torch.float32)
    return out


def load_dir(d):
    """config.json and every tensor (fp32) of a single-file or sharded HF directory."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(d, name)))
    return cfg, tensors


# ---- the model ----

class Shape:
    def __init__(self, c):
        self.h, self.L = c["hidden_size"], c["num_hidden_layers"]
        self.H = c["num_attention_heads"]
        self.K = c.get("num_key_value_heads") or self.H
        self.d = c.get("head_dim") or self.h // self.H
        self.I, self.V = c["intermediate_size"], c["vocab_size"]
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.positions = c.get("max_position_embeddings", 0)
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.model_type = c.get("model_type", "llama")
        self.attention_bias = bool(c.get("attention_bias", False))
        rope = dict(c.get("rope_parameters") or {})
        rope.update(c.get("rope_scaling") or {})
        self.theta = float(c.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        self.rope = rope
        self.rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if self.rope_type not in ("default", "linear", "llama3"):
            fail(f"rope type {self.rope_type!r} is not supported (default, linear, llama3)")
        if self.H % self.K:
            fail(f"{self.H} heads are not a multiple of {self.K} kv heads")

    def inv_freq(self):
        d = self.d
        f = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        r = self.rope
        if self.rope_type == "linear":
            f = f / r["factor"]
        elif self.rope_type == "llama3":
            factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
            old = r["original_max_position_embeddings"]
            wavelen = 2 * math.pi / f
            scaled = torch.where(wavelen > old / low, f / factor, f)
            s = (old / wavelen - low) / (high - low)
            smooth = (1 - s) * scaled / factor + s * scaled
            medium = ~(wavelen < old / high) & ~(wavelen > old / low)
            f = torch.where(medium, smooth, scaled)
        return f

    def qkv_bias(self):
        """Qwen2's q/k/v projections have biases; so does any model that says attention_bias."""
        return self.model_type == "qwen2" or self.attention_bias

    def names(self, qk_norm=False):
        """HF's names and shapes, in the order init draws them."""
        h, d, H, K, I, V = self.h, self.d, self.H, self.K, self.I, self.V
        out = [("model.embed_tokens.weight", [V, h])]
        for i in range(self.L):
            p = f"model.layers.{i}."
            out += [(p + "input_layernorm.weight", [h]),
                    (p + "self_attn.q_proj.weight", [H * d, h]),
                    (p + "self_attn.k_proj.weight", [K * d, h]),
                    (p + "self_attn.v_proj.weight", [K * d, h]),
                    (p + "self_attn.o_proj.weight", [h, H * d])]
            if self.qkv_bias():
                out += [(p + "self_attn.q_proj.bias", [H * d]), (p + "self_attn.k_proj.bias", [K * d]),
                        (p + "self_attn.v_proj.bias", [K * d])]
            if qk_norm:
                out += [(p + "self_attn.q_norm.weight", [d]), (p + "self_attn.k_norm.weight", [d])]
            out += [(p + "post_attention_layernorm.weight", [h]),
                    (p + "mlp.gate_proj.weight", [I, h]),
                    (p + "mlp.up_proj.weight", [I, h]),
                    (p + "mlp.down_proj.weight", [h, I])]
        out.append(("model.norm.weight", [h]))
        if not self.tied:
            out.append(("lm_head.weight", [V, h]))
        return out


def rms_norm(x, w, eps):
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def linear(P, x, name):
    return F.linear(x, P[name + ".weight"], P.get(name + ".bias"))


def forward(s, P, ids):
    """Logits [b, t, V] of token ids [b, t]."""
    b, t = ids.shape
    H, K, d = s.H, s.K, s.d
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), s.inv_freq())
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    x = F.embedding(ids, P["model.embed_tokens.weight"])
    for i in range(s.L):
        p = f"model.layers.{i}."
        y = rms_norm(x, P[p + "input_layernorm.weight"], s.eps)
        q = linear(P, y, p + "self_attn.q_proj").view(b, t, H, d)
        k = linear(P, y, p + "self_attn.k_proj").view(b, t, K, d)
        v = linear(P, y, p + "self_attn.v_proj").view(b, t, K, d)
        if p + "self_attn.q_norm.weight" in P:  # Qwen3: before the rotation
            q = rms_norm(q, P[p + "self_attn.q_norm.weight"], s.eps)
            k = rms_norm(k, P[p + "self_attn.k_norm.weight"], s.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // K, dim=1)
        v = v.repeat_interleave(H // K, dim=1)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1, dtype=torch.float32)
        o = torch.matmul(att, v).transpose(1, 2).reshape(b, t, H * d)
        x = x + linear(P, o, p + "self_attn.o_proj")
        y = rms_norm(x, P[p + "post_attention_layernorm.weight"], s.eps)
        g = F.silu(linear(P, y, p + "mlp.gate_proj")) * linear(P, y, p + "mlp.up_proj")
        x = x + linear(P, g, p + "mlp.down_proj")
    x = rms_norm(x, P["model.norm.weight"], s.eps)
    head = P["model.embed_tokens.weight"] if s.tied else P["lm_head.weight"]
    return F.linear(x, head)


def load_model(d):
    """(config, Shape, parameters by HF name) with every expected tensor checked."""
    cfg, tensors = load_dir(d)
    s = Shape(cfg)
    if s.tied:
        head = tensors.pop("lm_head.weight", None)  # some exports repeat the embedding
        if head is not None and not torch.equal(head, tensors.get("model.embed_tokens.weight")):
            fail(f"{d}: tie_word_embeddings but lm_head.weight is not the embedding")
    elif "lm_head.weight" not in tensors:
        fail(f"{d}: tie_word_embeddings is false but there is no lm_head.weight")
    qk_norm = "model.layers.0.self_attn.q_norm.weight" in tensors
    if s.model_type == "qwen3" and not qk_norm:
        fail(f"{d}: a qwen3 model without q_norm/k_norm weights")
    expected = dict(s.names(qk_norm=qk_norm))
    for name, shape in list(expected.items()):  # Qwen2's q/k/v biases (Llama's attention_bias)
        bias = name[:-len("weight")] + "bias"
        if ".layers." in name and "_proj." in name and bias in tensors:
            expected[bias] = shape[:1]
    for name, shape in expected.items():
        if name not in tensors:
            fail(f"{d}: missing tensor {name}")
        if list(tensors[name].shape) != shape:
            fail(f"{d}: {name} is {list(tensors[name].shape)}, expected {shape}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        fail(f"{d}: unexpected tensors: {', '.join(extra[:5])}")
    return cfg, s, {n: tensors[n].contiguous() for n in expected}


# ---- ob's data and recipe ----

def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def mix64(a, b=0, c=0):
    h = splitmix64((a & MASK64) ^ 0x6A09E667F3BCC908)
    h = splitmix64(h ^ (b & MASK64))
    return splitmix64(h ^ splitmix64((c + 0xBB67AE8584CAA73B) & MASK64))


def read_tokens(path):
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    width = 2 if path.endswith(".bin") else 4 if path.endswith(".u32") else 1
    if width == 2 and len(raw) >= 1024 and struct.unpack_from("<i", raw)[0] == 20240520:
        version = struct.unpack_from("<i", raw, 4)[0]
        if version not in (1, 2):
            fail(f"{path}: llm.c version {version}")
        width, raw = (2 if version == 1 else 4), raw[1024:]
    if not raw or len(raw) % width:
        fail(f"{path}: {len(raw)} bytes is no whole number of {width}-byte tokens")
    if width == 1:
        return torch.frombuffer(raw, dtype=torch.uint8).long()
    t = torch.frombuffer(raw, dtype=torch.int16 if width == 2 else torch.int32).long()
    return t & (0xFFFF if width == 2 else 0xFFFFFFFF)


def make_batch(tokens, seed, step, first, count, S):
    windows = tokens.numel() - S
    offs = [mix64(seed, step, i) % windows for i in range(first, first + count)]
    return (torch.stack([tokens[o:o + S] for o in offs]),
            torch.stack([tokens[o + 1:o + S + 1] for o in offs]))


def check_data(s, tokens, a):
    if a.seq_len <= 0 or tokens.numel() < a.seq_len + 1:
        fail(f"{a.data}: {tokens.numel()} tokens is too short for sequences of {a.seq_len}")
    if s.positions and a.seq_len > s.positions:
        fail(f"sequence length {a.seq_len} exceeds max_position_embeddings {s.positions}")
    if int(tokens.max()) >= s.V:
        fail(f"{a.data}: token {int(tokens.max())} does not fit the vocabulary of {s.V}")
    if a.micro_batch <= 0 or a.global_batch % a.micro_batch:
        fail(f"global batch {a.global_batch} is not a multiple of micro-batch {a.micro_batch}")


def step_loss(s, P, tokens, a, step, backward):
    """The global batch's mean loss (double); with backward, its gradient accumulated."""
    total = 0.0
    for first in range(0, a.global_batch, a.micro_batch):
        x, y = make_batch(tokens, a.seed, step, first, a.micro_batch, a.seq_len)
        loss = F.cross_entropy(forward(s, P, x).reshape(-1, s.V), y.reshape(-1))
        weight = a.micro_batch / a.global_batch
        if backward:
            (loss * weight).backward()
        total += loss.item() * weight
    return total


def learning_rate(a, step, total):
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    if a.lr_schedule == "constant":
        return a.lr
    progress = min(1.0, (step - a.warmup_steps) / max(1, total - a.warmup_steps))
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1.0 + math.cos(math.pi * progress))


def adamw(P, state, lr, t, b1=0.9, b2=0.95, eps=1e-8, wd=0.1):
    with torch.no_grad():
        for name, p in P.items():
            g = p.grad
            m, v = state.setdefault(name, (torch.zeros_like(p), torch.zeros_like(p)))
            if p.dim() >= 2:
                p.mul_(1 - lr * wd)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
            p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


# ---- subcommands ----

def cmd_init(a):
    cfg = dict(PRESETS[a.model])
    cfg.update(attention_bias=False, hidden_act="silu", torch_dtype=TORCH_DTYPE[a.dtype])
    for kv in a.set or []:  # a shape of no preset: --set num_hidden_layers=3
        key, _, value = kv.partition("=")
        if not key or not _:
            fail(f"--set {kv!r}: not KEY=JSON")
        cfg[key] = json.loads(value)
        if value == "null":
            del cfg[key]
    s = Shape(cfg)
    gen = torch.Generator().manual_seed(a.seed)
    tensors = {}
    for name, shape in s.names(qk_norm=cfg["model_type"] == "qwen3"):
        if name.endswith("norm.weight"):  # norms: 1 + N(0, 0.1), so that they matter
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            t = 0.02 * torch.randn(shape, generator=gen)
        tensors[name] = t.to(DTYPES[a.dtype])
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    if a.shards <= 1:
        write_safetensors(os.path.join(a.out_dir, "model.safetensors"), tensors)
        return
    names = sorted(tensors)
    per = -(-len(names) // a.shards)
    weight_map, total = {}, 0
    for k in range(a.shards):
        file = f"model-{k + 1:05d}-of-{a.shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k * per:(k + 1) * per]}
        total += write_safetensors(os.path.join(a.out_dir, file), part)
        weight_map.update({n: file for n in part})
    with open(os.path.join(a.out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def cmd_train(a):
    _, s, P = load_model(a.hf_dir)
    tokens = read_tokens(a.data)
    check_data(s, tokens, a)
    total = a.schedule_steps if a.schedule_steps is not None else a.first_step + a.steps
    for p in P.values():
        p.requires_grad_(True)
    state = {}  # fresh AdamW: zero moments, count from 1 (an import's state)
    for t, step in enumerate(range(a.first_step, a.first_step + a.steps), start=1):
        lr = learning_rate(a, step, total)
        for p in P.values():
            p.grad = None
        loss = step_loss(s, P, tokens, a, step, backward=True)
        with torch.no_grad():
            norm = math.sqrt(sum(float(p.grad.norm(2)) ** 2 for p in P.values()))
            coef = a.clip / (norm + 1e-6)
            if a.clip > 0 and coef < 1:
                for p in P.values():
                    p.grad.mul_(coef)
        adamw(P, state, lr, t)
        print(f"step={step} loss={loss:.9g}", flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        write_safetensors(os.path.join(a.out, "model.safetensors"),
                          {n: p.detach() for n, p in P.items()})
        shutil.copyfile(os.path.join(a.hf_dir, "config.json"), os.path.join(a.out, "config.json"))


def cmd_loss(a):
    _, s, P = load_model(a.hf_dir)
    tokens = read_tokens(a.data)
    check_data(s, tokens, a)
    with torch.no_grad():
        print(f"loss={step_loss(s, P, tokens, a, a.step, backward=False):.9g}")


def cmd_compare(a):
    _, ta = load_dir(a.dir_a)
    _, tb = load_dir(a.dir_b)
    if set(ta) != set(tb):
        fail(f"tensor names differ: only in A {sorted(set(ta) - set(tb))[:5]}, "
             f"only in B {sorted(set(tb) - set(ta))[:5]}", 2)
    # ||a - b|| / ||b|| over all parameters as one vector (checked against
    # --rel), and per tensor (the worst printed; checked against --each when
    # given). Not the largest element: AdamW divides every gradient by its
    # own running RMS, so an element whose gradient is near zero moves by up
    # to lr whatever the last bits of that gradient, and a largest-element
    # measure judges the rounding of fp32 sums taken in another order (ob's
    # kernels, this script's) rather than the arithmetic: after 10 steps of
    # qwen3-tiny, 2 of k_proj's 16,384 elements differ by 3e-5 where the
    # step is 1e-3, and no other by more than 1e-6.
    worst, worst_name, diff2, norm2 = 0.0, None, 0.0, 0.0
    for name in sorted(ta):
        x, y = ta[name].double(), tb[name].double()
        if x.shape != y.shape:
            fail(f"{name}: shape {list(x.shape)} vs {list(y.shape)}", 2)
        if not x.numel():
            continue
        d2, n2 = float((x - y).pow(2).sum()), float(y.pow(2).sum())
        diff2, norm2 = diff2 + d2, norm2 + n2
        rel = (d2 ** 0.5) / max(n2 ** 0.5, 1e-30)
        if rel > worst or worst_name is None:
            worst, worst_name = rel, name
    whole = (diff2 ** 0.5) / max(norm2 ** 0.5, 1e-30)
    print(f"rel={whole:.3e} worst_tensor={worst_name} ({worst:.3e}) tensors={len(ta)}")
    if whole > a.rel:
        fail(f"the parameters differ by {whole:.3e} (relative), above {a.rel:g}")
    if a.each is not None and worst > a.each:
        fail(f"{worst_name} differs by {worst:.3e} (relative), above {a.each:g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init")
    p.add_argument("--model", required=True, choices=sorted(PRESETS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="F32", choices=sorted(DTYPES))
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--set", action="append", metavar="KEY=JSON", help="a config.json key over the preset's")
    p.add_argument("out_dir")
    train, loss = sub.add_parser("train"), sub.add_parser("loss")
    for p in (train, loss):  # the data and batch of a step, as ob-launch's
        p.add_argument("hf_dir")
        p.add_argument("--data", required=True)
        for opt in ("--seq-len", "--micro-batch", "--global-batch"):
            p.add_argument(opt, type=int, required=True)
        p.add_argument("--seed", type=int, default=0)
    loss.add_argument("--step", type=int, required=True)
    train.add_argument("--steps", type=int, required=True)
    train.add_argument("--first-step", type=int, default=1)
    train.add_argument("--out")
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--min-lr", type=float, default=0.0)
    train.add_argument("--warmup-steps", type=int, default=0)
    train.add_argument("--lr-schedule", default="cosine", choices=["cosine", "constant"])
    train.add_argument("--schedule-steps", type=int, help="ob-launch --steps (default first-step + steps)")
    train.add_argument("--clip", type=float, default=1.0)
    p = sub.add_parser("compare")
    p.add_argument("dir_a")
    p.add_argument("dir_b")
    p.add_argument("--rel", type=float, default=1e-5)
    p.add_argument("--each", type=float, default=None)
    a = ap.parse_args()
    if sys.byteorder != "little":
        fail("safetensors are little-endian; this host is not")
    {"init": cmd_init, "train": cmd_train, "loss": cmd_loss, "compare": cmd_compare}[a.cmd](a)


if __name__ == "__main__":
    main()
