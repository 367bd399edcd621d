"""ablate.engine.data: the token cache is checked, not trusted."""
from __future__ import annotations

import json
import os

import numpy as np


def test_a_tampered_token_cache_is_detected_and_rebuilt(cache, text_file):
    from ablate.engine import data

    clean = data.load_data(str(text_file), "bytes", 256)
    want_fp, want_tokens = clean.fingerprint, np.concatenate([clean.train[0], clean.val[0]]).copy()
    (bin_path,) = cache.rglob("tokens-*.bin")
    meta_path = bin_path.with_suffix(".json")

    def check():
        again = data.load_data(str(text_file), "bytes", 256)
        assert again.fingerprint == want_fp
        assert np.array_equal(np.concatenate([again.train[0], again.val[0]]), want_tokens)

    # Other tokens of the same size, written in place with the old mtime put back.
    st = bin_path.stat()
    with open(bin_path, "r+b") as f:
        f.seek(1024)
        f.write(b"\x07\x00" * 100)
    os.utime(bin_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert bin_path.stat().st_size == st.st_size
    check()
    # An edited fingerprint in the meta file.
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "fingerprint": "sha256:" + "0" * 64}))
    check()
    # A deleted token file with its meta kept.
    bin_path.unlink()
    check()
    # A copied cache (new inode, same tokens) is verified by hashing, not rebuilt.
    os.replace(bin_path, bin_path.with_name("x"))
    bin_path.with_name("x").rename(bin_path)
    check()


def test_a_poisoned_max_token_in_the_shard_meta_is_not_trusted(cache, tmp_path):
    from ablate.engine import data

    shard = tmp_path / "shards" / "data.bin"
    data.write_shard(shard, np.arange(5000, dtype=np.uint16) % 300)
    assert data.load_data(str(shard.parent), "bytes", 256).max_token == 299
    (meta_path,) = cache.glob("shards-*.json")
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "max_token": 3}))
    assert data.load_data(str(shard.parent), "bytes", 256).max_token == 299
