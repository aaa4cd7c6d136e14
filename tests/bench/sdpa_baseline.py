"""PyTorch's scaled_dot_product_attention at the decode shapes of lamina-bench-kernels: one query
token per sequence against a contiguous bf16 KV cache, head_dim 128. Writes CSV rows
q_heads,kv_heads,batch,context,us (median of 50 event-timed runs) for `lamina-bench-kernels --sdpa`.
Usage: python3 sdpa_baseline.py OUT.csv
"""
import sys

import torch
import torch.nn.functional as F

SHAPES = [(32, 8, 1, 4096), (32, 8, 16, 2048), (32, 8, 64, 2048), (32, 8, 128, 4096),
          (32, 32, 1, 4096), (32, 32, 128, 4096)]


def median_us(fn, runs=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000)
    times.sort()
    return times[len(times) // 2]


def main():
    out = open(sys.argv[1], "w")
    out.write("q_heads,kv_heads,batch,context,us\n")
    for hq, hkv, batch, ctx in SHAPES:
        q = torch.randn(batch, hq, 1, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(batch, hkv, ctx, 128, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(batch, hkv, ctx, 128, dtype=torch.bfloat16, device="cuda")
        us = median_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv))
        out.write(f"{hq},{hkv},{batch},{ctx},{us:.2f}\n")
        print(f"sdpa {hq}/{hkv} batch {batch} context {ctx}: {us:.1f} us", file=sys.stderr)


if __name__ == "__main__":
    main()
