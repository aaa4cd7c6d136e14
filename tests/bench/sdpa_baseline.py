"""PyTorch's scaled_dot_product_attention at the decode shapes of lamina-bench-kernels: one query
token per sequence against a contiguous bf16 KV cache, head_dim 128. Writes CSV rows
q_heads,kv_heads,batch,context,us,graph_us for `lamina-bench-kernels --sdpa`: a call alone (median
of 50 event-timed runs) and one among 20 captured in a CUDA graph (median of 11 replays). As in
lamina-bench-kernels, calls take copies of the cache in turn (at least 2, together at least twice
the L2), so that none finds its cache lines in L2.
Usage: python3 sdpa_baseline.py OUT.csv
"""
import math
import sys

import torch
import torch.nn.functional as F

SHAPES = [(32, 8, 1, 4096), (32, 8, 4, 2048), (32, 8, 8, 2048), (32, 8, 16, 2048), (32, 8, 64, 2048),
          (32, 8, 128, 4096), (32, 32, 1, 4096), (32, 32, 128, 4096)]


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


def graphed_us(fn, calls=20):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # warm-up outside the capture, as torch.cuda.graphs asks
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return median_us(graph.replay, runs=11) / calls


def main():
    out = open(sys.argv[1], "w")
    out.write("q_heads,kv_heads,batch,context,us,graph_us\n")
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    for hq, hkv, batch, ctx in SHAPES:
        q = torch.randn(batch, hq, 1, 128, dtype=torch.bfloat16, device="cuda")
        kv_bytes = 2 * batch * hkv * ctx * 128 * 2
        copies = max(2, math.ceil(2 * l2_bytes / kv_bytes))
        caches = [(torch.randn(batch, hkv, ctx, 128, dtype=torch.bfloat16, device="cuda"),
                   torch.randn(batch, hkv, ctx, 128, dtype=torch.bfloat16, device="cuda")) for _ in range(copies)]
        turn = [0]

        def call():
            k, v = caches[turn[0] % copies]
            turn[0] += 1
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)

        us, graph_us = median_us(call), graphed_us(call)
        out.write(f"{hq},{hkv},{batch},{ctx},{us:.2f},{graph_us:.2f}\n")
        print(f"sdpa {hq}/{hkv} batch {batch} context {ctx}: {us:.1f} us alone, {graph_us:.1f} us in a graph",
              file=sys.stderr)


if __name__ == "__main__":
    main()
