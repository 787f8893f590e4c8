#!/usr/bin/env python3
"""seeds.py -- writes the fuzz targets' seed corpora under tests/corpus/:
json/ and workload/ (the real workload files, records as the tools write
them, small valid inputs and edge cases), mask/ (valid specs with their
lengths) and cache/ (small stof caches, 512-byte pages so that rows spill
into overflow pages: sound, with a freelist, truncated, damaged, a WAL
pair, not a cache). Deterministic: run it again after changing it, and
commit what it writes. Inputs a fuzzer found that are worth keeping go in
by hand (build/fuzz/found-TARGET, build/fuzz/*crash*): this leaves them.

usage: python3 tests/fuzz/seeds.py   (from the repository root)
"""
import hashlib
import json
import os
import shutil
import sqlite3
import struct
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "corpus")

# The cache's schema, as cache/cache.c creates it (schema version 1).
SCHEMA = """
CREATE TABLE IF NOT EXISTS kernels (
 key TEXT PRIMARY KEY, op TEXT NOT NULL, name TEXT NOT NULL, entry TEXT NOT NULL,
 arch TEXT NOT NULL, nvrtc_version TEXT NOT NULL, stof_version TEXT NOT NULL,
 options TEXT NOT NULL, params TEXT NOT NULL, source TEXT NOT NULL, log TEXT NOT NULL,
 cubin BLOB NOT NULL, ptx BLOB NOT NULL, checksum TEXT NOT NULL, compile_ms REAL NOT NULL,
 created INTEGER NOT NULL, last_used INTEGER NOT NULL, hits INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS kernels_lru ON kernels(last_used);
CREATE TABLE IF NOT EXISTS tuning (
 op TEXT NOT NULL, mask_hash TEXT NOT NULL, shape TEXT NOT NULL, dtype TEXT NOT NULL,
 arch TEXT NOT NULL, stof_version TEXT NOT NULL, record TEXT NOT NULL,
 created INTEGER NOT NULL,
 PRIMARY KEY (op, mask_hash, shape, dtype, arch, stof_version));
PRAGMA user_version=1;
"""


def put(folder, name, data):
    path = os.path.join(OUT, folder)
    os.makedirs(path, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)


def key_of(i):
    return hashlib.sha256(b"seed kernel %d" % i).hexdigest()


def kernel_row(i, cubin_len, ptx_len, stof="0.1.0", nvrtc="13.0"):
    cubin = bytes((i * 7 + j * 13) % 256 for j in range(cubin_len))
    ptx = (b".version 8.0\n.target sm_90a\n" * (ptx_len // 28 + 1))[:ptx_len]
    return (key_of(i), "mha" if i % 2 else "layernorm", "attn.cu", "stof_attn", "sm_90a", nvrtc,
            stof, "-std=c++17", "BM=64;BN=64", "// source %d\n" % i, "", cubin, ptx,
            hashlib.sha256(cubin + ptx).hexdigest(), 12.5 * i, 1700000000 + i,
            1700000100 + i, i)


def tuning_row(i, kernel_key, size=60):
    mask = hashlib.sha256(b"mask %d" % i).hexdigest()
    rec = json.dumps({"winner": {"kind": "block", "bm": 64, "bn": 64, "ms": 0.5,
                                 "kernel": kernel_key},
                      "mask": "window:256+global:64", "pad": "x" * size},
                     separators=(",", ":"))
    return ("mha", mask, "b=1,h=2,lq=%d,lk=%d,d=64,layout=bhld" % (128 * (i + 1), 128 * (i + 1)),
            "fp16", "sm_90a", "0.1.0", rec, 1700000200 + i)


def make_cache(path, kernels, tuning, wal=False, keep_open=False):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA page_size=512")
    if wal:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA wal_autocheckpoint=0")
    db.executescript(SCHEMA)
    for row in kernels:
        db.execute("INSERT INTO kernels VALUES (%s)" % ",".join("?" * 18), row)
    for row in tuning:
        db.execute("INSERT INTO tuning VALUES (?,?,?,?,?,?,?,?)", row)
    if keep_open:
        return db
    db.close()
    return None


def read(path):
    with open(path, "rb") as f:
        return f.read()


def caches(tmp):
    rows = [kernel_row(0, 40, 30), kernel_row(1, 1500, 700), kernel_row(2, 3000, 0),
            kernel_row(3, 200, 100, stof="0.0.9")]
    tun = [tuning_row(0, key_of(1)), tuning_row(1, key_of(9), size=900)]

    p = os.path.join(tmp, "sound.db")
    make_cache(p, rows, tun)
    sound = read(p)
    put("cache", "sound.db", sound)
    put("cache", "truncated-half.db", sound[: len(sound) // 2 // 512 * 512])
    put("cache", "truncated-odd.db", sound[: len(sound) * 2 // 3 + 77])
    put("cache", "first-page.db", sound[:512])

    p = os.path.join(tmp, "freed.db")
    make_cache(p, rows, tun)
    db = sqlite3.connect(p)
    db.execute("DELETE FROM kernels WHERE key=?", (key_of(1),))
    db.execute("UPDATE kernels SET hits = hits + 1000000 WHERE key=?", (key_of(2),))
    db.commit()
    db.close()
    put("cache", "freelist.db", read(p))

    damaged = bytearray(sound)
    damaged[len(damaged) // 2] ^= 0x5A
    put("cache", "flipped.db", bytes(damaged))

    p = os.path.join(tmp, "wal.db")
    db = make_cache(p, rows[:2], tun[:1], wal=True, keep_open=True)
    db.execute("INSERT INTO kernels VALUES (%s)" % ",".join("?" * 18), kernel_row(5, 900, 90))
    main, wal = read(p), read(p + "-wal")
    db.close()
    put("cache", "wal-pair.bin", b"STOFWAL1" + struct.pack("<I", len(main)) + main + wal)
    put("cache", "wal-torn.bin",
        b"STOFWAL1" + struct.pack("<I", len(main)) + main + wal[: len(wal) - 100])

    p = os.path.join(tmp, "foreign.db")
    db = sqlite3.connect(p)
    db.executescript("PRAGMA page_size=512; CREATE TABLE notes (x TEXT); "
                     "INSERT INTO notes VALUES ('not a cache');")
    db.close()
    put("cache", "foreign.db", read(p))
    put("cache", "text.db", "SQLite format 2, or so it says\n")
    put("cache", "empty.db", b"")


def masks():
    specs = ["dense", "causal", "window:256", "window:256+global:64",
             "window:192+global:64+random:3:64:1", "window:256+strided:8", "dilated:256:2",
             "causal&docs:1024,2048,1000", "docs:1024,2048,1000", "causal&window:512",
             "causal_window:128", "global:1", "strided:1", "random:1:1:0",
             "random:2:16:18446744073709551615", "window:4+window:2&causal", " causal & dense ",
             "dilated:8:3+strided:5&global:7", "docs:1,2,3,4,5,6", "window:2&causal_window:3+dense"]
    for i, spec in enumerate(specs):
        # lengths: ff ff = Lk as Lq; a short one (bit 14 set), or a long one
        lq = 0x4000 | (64 + 37 * i) if i % 3 else 8192 % 5000 + i
        lk = 0xFFFF if i % 2 else 0x4000 | (80 + 11 * i)
        if spec.startswith("docs") or "&docs" in spec:
            total = sum(int(x) for x in spec.split("docs:")[1].split(","))
            lq, lk = total - 1, 0xFFFF
        put("mask", "spec-%02d" % i, struct.pack("<HH", lq, lk) + spec.encode())


def json_seeds():
    for name in ("attention.json", "layers.json"):
        shutil.copy(os.path.join(ROOT, "bench", "workloads", name), os.path.join(OUT, "json", name))
    put("json", "record.json", tuning_row(0, key_of(1))[6])
    put("json", "device.json", '{"device":"NVIDIA H100 80GB HBM3","sm_count":132,"clock_mhz":1980,'
                               '"mma_tflops":250.0,"wgmma_tflops":370.0,"ws_tflops":460.0,'
                               '"mem_gbs":3000,"measured":1}')
    put("json", "escapes.json", '["\\u0000\\ud83d\\ude00\\t\\"\\\\", -0, 1e308, 0.5e-10, '
                                '{"": null, "a": [true, false, {}]}, "\\u00e9"]')
    put("json", "deep.json", "[" * 100 + "1" + "]" * 100)
    put("json", "deep-objects.json", '{"a":' * 70 + "0" + "}" * 70)
    # Nesting past 63 with siblings: the writer once wrote these as invalid JSON.
    put("json", "deep-siblings.json", "[" * 80 + "1" + "]" + ",2]" * 79)
    put("json", "deep-members.json",
        "".join('{"k%d":' % i for i in range(80)) + "1" + ',"z":2}' * 80)
    put("json", "numbers.json", "[0, -1, 12345678901234567890, 1.7976931348623157e308, 5e-324]")
    put("json", "utf8.json", '{"naïve": "日本語", "emoji": "😀"}')


def workload_seeds():
    for name in ("attention.json", "layers.json", "llm.json"):
        shutil.copy(os.path.join(ROOT, "bench", "workloads", name),
                    os.path.join(OUT, "workload", name))
    put("workload", "small-suite.json", json.dumps({
        "suites": [{"name": "s", "batch": 2, "heads": 4, "head_dim": 64, "dtype": "bf16",
                    "seq": [128, 256], "masks": {"c": "causal", "w": "window:32+global:8"}}]}))
    put("workload", "small-layer.json", json.dumps({
        "models": {"m": {"hidden": 256, "heads": 4, "ffn": 4.0, "activation": "relu",
                         "norm": "pre_ln"}},
        "cases": [{"model": "m", "batch": 2, "seq": [128], "masks": ["causal", "dense"]}]}))
    put("workload", "mha-line", "--mha b=8,h=12,l=2048,d=64,fp16,window:256+global:64")
    put("workload", "mha-line-lqlk", "--mha b=1,h=2,lq=128,lk=256,d=128,bf16,causal")
    put("workload", "ln-line", "--ln rows=16384,hidden=768,fp16")
    put("workload", "ln-line-fp32", "--ln rows=1,hidden=16384,fp32")
    put("workload", "small-decoder.json", json.dumps({
        "models": {"d": {"kind": "decoder", "hidden": 512, "heads": 8, "kv_heads": 2,
                         "ffn_hidden": 1376, "qkv_bias": True}},
        "cases": [{"model": "d", "batch": 1, "seq": [333], "dtype": "bf16",
                   "masks": ["causal", "causal_window:64"]}]}))
    put("workload", "decoder-line",
        "--decoder b=1,s=4096,hidden=4096,h=32,kv=8,ffn=14336,bf16,causal_window:4096")
    put("workload", "small-decode.json", json.dumps({
        "decode": [{"name": "q", "batch": [1, 8], "cache": [64, 333], "new": 2, "heads": 8,
                    "kv_heads": 2, "head_dim": 64, "dtype": "fp16", "softcap": 30,
                    "masks": {"c": "causal", "w": "causal_window:32"}}]}))
    put("workload", "decode-line", "--decode b=8,h=32,kv=8,d=128,cache=32768,new=4,bf16,"
        "causal_window:4096")


def main():
    for folder in ("json", "workload", "mask", "cache"):
        os.makedirs(os.path.join(OUT, folder), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        caches(tmp)
    masks()
    json_seeds()
    workload_seeds()
    for folder in ("json", "workload", "mask", "cache"):
        names = sorted(os.listdir(os.path.join(OUT, folder)))
        size = sum(os.path.getsize(os.path.join(OUT, folder, n)) for n in names)
        print("%-9s %3d files, %7d bytes" % (folder, len(names), size))


if __name__ == "__main__":
    main()
