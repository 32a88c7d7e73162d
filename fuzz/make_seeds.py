#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<fuzzer>/seed-*: a handful of small
inputs whose first bytes pick each layout, dtype pair and mode (the byte
order of fuzz/ragged_case.cc's MakeRaggedCase and paged_attention_fuzzer's
MakeCase), the rest deterministic pseudo-random bytes, which map mostly to
in-range metadata. Regression inputs (fuzz/regressions) are copied in too.
Run from the repository root: python3 fuzz/make_seeds.py"""
import os
import random
import shutil

ROOT = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(ROOT, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes(data))


def body(rng, n=120):
    # Bytes < 216 keep metadata in range; the fuzzer finds the rest.
    return [rng.randrange(0, 216) for _ in range(n)]


def main():
    rng = random.Random(20240607)
    # Ragged and KV write: layout, q dtype, kv dtype, flags, perturb, heads,
    # head_dim, page_size, pages, max_num_seqs, pages_per_seq, tokens.
    ragged = [
        [0, 0, 0, 0x00, 0, 4, 15, 3, 8, 3, 5, 20],   # combined f32/f32
        [1, 1, 1, 0x18, 0, 7, 31, 7, 8, 4, 6, 24],   # NHD bf16/bf16, sinks + lse
        [2, 2, 2, 0x02, 0, 5, 7, 0, 6, 2, 4, 12],    # HND f16/f16, odd views
        [0, 1, 3, 0x00, 0, 8, 39, 241, 4, 2, 2, 16],  # fp8 e4m3, page_size 16
        [1, 0, 4, 0x01, 0, 2, 9, 2, 7, 3, 6, 18],    # fp8 e5m2, NaN mode
        [2, 0, 5, 0x04, 0, 1, 1, 4, 5, 5, 3, 10],    # int8, raw options
        [0, 2, 1, 0x00, 230, 3, 12, 3, 4, 2, 3, 8],  # a static perturbation
        [1, 1, 0, 0x00, 0, 4, 16, 1, 0, 0, 0, 0],    # empty everything
    ]
    for target in ("ragged_attention_fuzzer", "kv_write_fuzzer"):
        for i, head in enumerate(ragged):
            write(target, "seed-%d" % i, head + body(rng))
    # Paged: q dtype, kv dtype, flags, perturb, heads, head_dim, page_size,
    # pages, pages_per_sequence, batch.
    paged = [
        [0, 0, 0x00, 0, 4, 15, 3, 8, 4, 3],
        [1, 1, 0x00, 0, 7, 31, 7, 6, 2, 6],
        [2, 3, 0x01, 0, 5, 7, 0, 5, 3, 2],
        [0, 5, 0x04, 0, 1, 1, 241, 3, 1, 4],
        [1, 4, 0x00, 230, 3, 12, 3, 4, 2, 1],
        [0, 2, 0x00, 0, 2, 8, 2, 0, 0, 0],
    ]
    for i, head in enumerate(paged):
        write("paged_attention_fuzzer", "seed-%d" % i, head + body(rng))
    reg = os.path.join(ROOT, "regressions")
    for name in sorted(os.listdir(reg)) if os.path.isdir(reg) else []:
        target = ("kv_write_fuzzer" if name.startswith("kv_write") else
                  "mla_fuzzer" if name.startswith("mla") else
                  "paged_attention_fuzzer" if name.startswith("paged") else
                  "ragged_attention_fuzzer")
        shutil.copy(os.path.join(reg, name),
                    os.path.join(ROOT, "corpus", target, "regression-" + name))


if __name__ == "__main__":
    main()
