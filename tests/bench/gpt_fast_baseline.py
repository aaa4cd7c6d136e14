"""A gpt-fast-style PyTorch baseline for lamina-bench-serve: one decode step of a Llama model of
config.json's shape with random bf16 weights, a static KV cache of every sequence at `--context`
tokens, attention as scaled_dot_product_attention over the whole cache with a mask (as gpt-fast
does), the step compiled with torch.compile(mode="reduce-overhead") (CUDA graphs). Greedy tokens.

Prints one line a batch: "batch B ms_per_step X" (the median of 20 steps after warm-up).
  python3 gpt_fast_baseline.py [--model DIR] [--batches 1,32,128] [--context 2048]
"""
import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=os.path.join(here, "../../deploy/models/llama-3.1-8b-shape"))
    parser.add_argument("--batches", default="1,32,128")
    parser.add_argument("--context", type=int, default=2048)
    args = parser.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        c = json.load(f)
    hidden, layers = c["hidden_size"], c["num_hidden_layers"]
    heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    head_dim = c.get("head_dim", hidden // heads)
    inter, vocab = c["intermediate_size"], c["vocab_size"]
    eps, theta = c.get("rms_norm_eps", 1e-5), c.get("rope_theta", 10000.0)
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)

    def rand(*shape):
        return (torch.rand(*shape, device=dev, dtype=dt) - 0.5) * 0.04

    w = [dict(wqkv=rand((heads + 2 * kv_heads) * head_dim, hidden), wo=rand(hidden, heads * head_dim),
              w13=rand(2 * inter, hidden), w2=rand(hidden, inter),
              n1=torch.ones(hidden, device=dev, dtype=dt), n2=torch.ones(hidden, device=dev, dtype=dt))
         for _ in range(layers)]
    embed, head = rand(vocab, hidden), rand(vocab, hidden)
    final_norm = torch.ones(hidden, device=dev, dtype=dt)

    def rms(x, g):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(dt) * g

    def rope(x, cos, sin):  # x [B, H, 1, D]
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(dt)

    for batch in [int(b) for b in args.batches.split(",")]:
        max_seq = args.context + 64
        kc = [torch.randn(batch, kv_heads, max_seq, head_dim, device=dev, dtype=dt) * 0.1 for _ in range(layers)]
        vc = [torch.randn(batch, kv_heads, max_seq, head_dim, device=dev, dtype=dt) * 0.1 for _ in range(layers)]
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=dev).float() / head_dim))
        freqs = torch.outer(torch.arange(max_seq, device=dev).float(), inv)
        cos_all, sin_all = freqs.cos(), freqs.sin()
        mask_all = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool, device=dev))

        def step(tokens, pos):
            x = embed[tokens].unsqueeze(1)  # [B, 1, hidden]
            cos, sin = cos_all[pos].view(1, 1, 1, -1), sin_all[pos].view(1, 1, 1, -1)
            mask = mask_all[pos].view(1, 1, 1, max_seq)
            for i in range(layers):
                lw = w[i]
                qkv = rms(x, lw["n1"]) @ lw["wqkv"].t()
                q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
                q = rope(q.view(batch, 1, heads, head_dim).transpose(1, 2), cos, sin)
                k = rope(k.view(batch, 1, kv_heads, head_dim).transpose(1, 2), cos, sin)
                v = v.view(batch, 1, kv_heads, head_dim).transpose(1, 2)
                kc[i].index_copy_(2, pos, k)
                vc[i].index_copy_(2, pos, v)
                o = F.scaled_dot_product_attention(q, kc[i], vc[i], attn_mask=mask, enable_gqa=True)
                x = x + o.transpose(1, 2).reshape(batch, 1, heads * head_dim) @ lw["wo"].t()
                gu = rms(x, lw["n2"]) @ lw["w13"].t()
                g, u = gu.chunk(2, -1)
                x = x + (F.silu(g) * u) @ lw["w2"].t()
            return (rms(x, final_norm) @ head.t()).argmax(-1).view(batch)

        compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        tokens = torch.zeros(batch, dtype=torch.long, device=dev)
        times = []
        with torch.no_grad():
            for s in range(28):
                pos = torch.tensor([args.context + (s % 32)], device=dev)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                tokens = compiled(tokens, pos).clone()
                end.record()
                torch.cuda.synchronize()
                if s >= 8:
                    times.append(start.elapsed_time(end))
        print(f"batch {batch} ms_per_step {statistics.median(times):.3f}", flush=True)
        del kc, vc, compiled
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
