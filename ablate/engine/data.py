"""Token data: the embedded default corpus, text files, llm.c `.bin` shards, BPE.

Every source ends up as token files in llm.c's shard format (a 256 x int32 header with
magic 20240520, version 1 and the token count, then uint16 tokens), memory-mapped, so the
corpus is never held in Python objects. Converted sources are cached under
$ABLATE_CACHE (default ~/.cache/ablate), keyed by the files' names, sizes and mtimes.
A cache entry is trusted only while it verifies: its meta file carries a checksum of its
own fields and the token file's stat (size, mtime, inode, ctime); a token file whose stat
changed is hashed again and kept only if its fingerprint is the recorded one; anything
else (edited meta, tampered or missing tokens) is rebuilt from the sources. So the
fingerprint a run records is the one of the tokens it trains on.

Batches are a pure function of (seed, step): resuming needs no loader state, and two
variants trained with the same seed see the same batches in the same order.
"""
from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ablate.core.bounded_read import kind_of, read_json
from ablate.core.errors import ConfigError
from ablate.core.paths import cache_root
from ablate.core.rundir import replace_atomic, write_json_atomic

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
VAL_FRACTION = 0.05
TEXT_SUFFIXES = {".txt", ".md", ".py", ".rst", ".json", ".csv", ".html", ".tex", ".c", ".h"}
_SPLIT_SALT = {"train": 0, "val": 1}


def _cache_error(path: Path, e: OSError) -> ConfigError:
    where = f"ABLATE_CACHE={os.environ['ABLATE_CACHE']}" if "ABLATE_CACHE" in os.environ else "the token cache"
    return ConfigError(f"{where}: cannot write {path} ({e.strerror}); valid: a folder you can write to "
                       "(ABLATE_CACHE, default ~/.cache/ablate)")


# ---------------------------------------------------------------- verified cache entries


def _stat_of(path: Path) -> list[int]:
    """What changes when a file is rewritten or replaced, even with its size and mtime kept."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def _checksum(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _write_meta(path: Path, fields: dict) -> None:
    write_json_atomic(path, {**fields, "check": _checksum(fields)})


def _read_meta(path: Path) -> dict | None:
    """A meta file's fields, None when it is missing, damaged or edited (its checksum differs)."""
    try:
        meta = read_json(path)  # bounded: a FIFO, a device, deep nesting are damage too
        fields = {k: v for k, v in meta.items() if k != "check"}
        return fields if meta.get("check") == _checksum(fields) else None
    except (OSError, ValueError, AttributeError):
        return None


# ---------------------------------------------------------------- llm.c shard format


def write_shard(path: Path, tokens: np.ndarray) -> None:
    """Write uint16 tokens as an llm.c shard, atomically."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        raise ValueError("shard tokens must fit in uint16")
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = (MAGIC, VERSION, tokens.size)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f):
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())

    replace_atomic(path, write)  # mode 0666 less umask: a shared cache others can read


def read_shard(path: Path) -> np.ndarray:
    """Memory-map an llm.c shard's tokens (uint16), checking its header."""
    path = Path(path)
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if header.size < 3 or header[0] != MAGIC:
        raise ConfigError(f"{path} is not an llm.c token shard (magic {header[0] if header.size else 'missing'}, expected {MAGIC})")
    if header[1] != VERSION:
        raise ConfigError(f"{path}: shard version {header[1]} is not supported; valid: {VERSION}")
    n = int(header[2])
    expected = HEADER_INTS * 4 + 2 * n
    if path.stat().st_size != expected:
        raise ConfigError(f"{path}: header says {n} tokens but the file holds {(path.stat().st_size - HEADER_INTS * 4) // 2}")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_INTS * 4, shape=(n,))


# ---------------------------------------------------------------- sources


def stdlib_files() -> list[Path]:
    """The running interpreter's standard-library `.py` sources, in a fixed order.
    Installed packages (site-packages) are excluded: they differ between machines."""
    root = sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = []
    for folder, dirs, names in os.walk(root):  # os.walk: a grid worker pays this per cell
        dirs[:] = [d for d in dirs if d not in skip]
        files.extend(os.path.join(folder, n) for n in names if n.endswith(".py"))
    return [Path(f) for f in sorted(files, key=lambda f: os.path.relpath(f, root).replace(os.sep, "/"))]


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise ConfigError(f"data folder {path} holds no text files; valid suffixes: {', '.join(sorted(TEXT_SUFFIXES))}")
    return files


def _listing_key(files: list[Path], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for p in files:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _read_bytes(files: list[Path]) -> bytes:
    return b"".join(p.read_bytes() for p in files)


# ---------------------------------------------------------------- tokenizers


def _train_bpe(chunks: list[str], vocab_size: int, out: Path):
    """A byte-level BPE of `vocab_size` trained on the corpus (Hugging Face tokenizers), from
    the decoded text rather than the files: tokenizers' file reader refuses a file that is not
    UTF-8, and the stdlib itself ships some (test/encoded_modules, test_source_encoding.py)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(chunks, trainer, length=len(chunks))
    if tok.get_vocab_size() > vocab_size:
        raise ConfigError(f"BPE produced {tok.get_vocab_size()} tokens, more than vocab_size {vocab_size}")
    text = tok.to_str()
    replace_atomic(out, lambda f: f.write(text.encode()))
    return tok


def _encode(text_files: list[Path], tokenizer: str, vocab_size: int, cache: Path) -> np.ndarray:
    raw = _read_bytes(text_files)
    if tokenizer == "bytes":
        return np.frombuffer(raw, dtype=np.uint8).astype(np.uint16)
    # Bytes that are not UTF-8 become U+FFFD, in training and encoding alike.
    text = raw.decode("utf-8", errors="replace")
    # Line-aligned chunks, so that tokenizers can parallelise and memory stays flat.
    lines = text.splitlines(keepends=True)
    chunks = ["".join(lines[i : i + 2000]) for i in range(0, len(lines), 2000)]
    tok_path = cache / f"bpe-{vocab_size}.json"
    if tok_path.exists():
        tok = Tokenizer.from_file(str(tok_path))
    else:
        tok = _train_bpe(chunks, vocab_size, tok_path)
    ids = [np.asarray(e.ids, dtype=np.uint16) for e in tok.encode_batch(chunks)]
    return np.concatenate(ids) if ids else np.zeros(0, dtype=np.uint16)


# ---------------------------------------------------------------- the dataset


@dataclass
class TokenData:
    train: list[np.ndarray]  # memory-mapped uint16 token arrays (one per shard)
    val: list[np.ndarray]
    source: str  # stdlib | text | shards
    path: str | None
    tokenizer: str
    vocab_size: int
    fingerprint: str
    unigram_entropy: float | None = None  # nats/token of the token frequencies: the loss of a context-free model
    max_token: int | None = None  # the largest token id (shards; tokenized text fits its vocabulary)

    def describe(self) -> dict:
        return {
            "source": self.source, "path": self.path, "fingerprint": self.fingerprint,
            "tokenizer": self.tokenizer, "vocab_size": self.vocab_size,
            "train_tokens": int(sum(a.size for a in self.train)),
            "val_tokens": int(sum(a.size for a in self.val)),
            "unigram_entropy": self.unigram_entropy,
        }

    def batch(self, split: str, index: int, seed: int, batch_size: int, seq_len: int, device="cpu"):
        """Batch `index` of `split` for `seed`: inputs and next-token targets, int64."""
        arrays = self.train if split == "train" else self.val
        windows = np.array([max(a.size - seq_len, 0) for a in arrays])
        if windows.sum() == 0:
            raise ConfigError(f"{split} split is shorter than seq_len {seq_len} + 1 tokens")
        rng = np.random.default_rng([seed, index, _SPLIT_SALT[split]])
        picks = rng.integers(0, windows.sum(), size=batch_size)
        bounds = np.cumsum(windows)
        shard_of = np.searchsorted(bounds, picks, side="right")
        rows = np.empty((batch_size, seq_len + 1), dtype=np.int64)
        span = np.arange(seq_len + 1)
        for i, (s, p) in enumerate(zip(shard_of, picks)):
            start = p - (bounds[s] - windows[s])
            rows[i] = arrays[s][start + span]
        t = torch.from_numpy(rows)
        if t.max() >= self.vocab_size:
            raise ConfigError(f"token id {int(t.max())} is outside the model's vocabulary of {self.vocab_size}; valid: a larger vocab_size")
        t = t.to(device, non_blocking=True)
        return t[:, :-1], t[:, 1:]


def _fingerprint(arrays: list[np.ndarray]) -> str:
    return _scan(arrays)[0]


def _scan(arrays: list[np.ndarray]) -> tuple[str, int]:
    """(sha256 fingerprint, largest token id) of token arrays, in one pass over them."""
    h = hashlib.sha256()
    top = 0
    for a in arrays:
        for i in range(0, a.size, 1 << 24):
            chunk = np.ascontiguousarray(a[i : i + (1 << 24)])
            h.update(chunk.tobytes())
            top = max(top, int(chunk.max()))
    return "sha256:" + h.hexdigest(), top


def _shard_scan(files: list[Path], arrays: list[np.ndarray]) -> tuple[str, int]:
    """_scan of llm.c shards, cached by their paths, sizes and mtimes: shards can hold billions
    of tokens, and every run start (each cell of a grid) would otherwise read them all."""
    meta_path = cache_root() / f"shards-{_listing_key(files, 'shards|v2')}.json"
    stats = [_stat_of(f) for f in files]
    meta = _read_meta(meta_path)
    if meta is not None and meta.get("stats") == stats:
        try:
            return str(meta["fingerprint"]), int(meta["max_token"])
        except (KeyError, TypeError, ValueError):
            pass
    fingerprint, top = _scan(arrays)
    try:
        meta_path.parent.mkdir(parents=True, exist_ok=True)
        _write_meta(meta_path, {"fingerprint": fingerprint, "max_token": top, "stats": stats})
    except OSError:
        pass  # a read-only cache only costs the scan next time
    return fingerprint, top


def unigram_entropy(tokens: np.ndarray) -> float:
    """Entropy (nats) of the token frequencies. A model whose loss stays near it has learnt
    nothing from context: the plateau that post-norm gets stuck on."""
    counts = np.bincount(np.asarray(tokens), minlength=1).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def _verified_tokens(tokens_path: Path, meta: dict | None) -> np.ndarray | None:
    """The cached tokens when they are the ones `meta` describes, else None (rebuild them)."""
    if meta is None or not isinstance(meta.get("fingerprint"), str):
        return None
    try:
        stat = _stat_of(tokens_path)
        tokens = read_shard(tokens_path)
    except (OSError, ConfigError):  # missing, unreadable, or not a shard any more
        return None
    if meta.get("stat") == stat:
        return tokens
    if _fingerprint([tokens]) != meta["fingerprint"]:  # rewritten since: other tokens
        return None
    try:  # the same tokens in a new file (a copied cache): remember its stat, skip this hash next time
        _write_meta(tokens_path.with_suffix(".json"), {**meta, "stat": stat})
    except OSError:
        pass
    return tokens


def _cached_tokens(files: list[Path], tokenizer: str, vocab_size: int, tag: str) -> tuple[np.ndarray, dict]:
    key = _listing_key(files, f"{tag}|{tokenizer}|{vocab_size}|v3")
    cache = cache_root() / f"{tag}-{key}"
    tokens_path, meta_path = cache / f"tokens-{tokenizer}-{vocab_size}.bin", cache / f"tokens-{tokenizer}-{vocab_size}.json"
    meta = _read_meta(meta_path)
    tokens = _verified_tokens(tokens_path, meta)
    if tokens is None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            write_shard(tokens_path, _encode(files, tokenizer, vocab_size, cache))
            stat = _stat_of(tokens_path)
            tokens = read_shard(tokens_path)
            meta = {"fingerprint": _fingerprint([tokens]), "files": len(files),
                    "unigram_entropy": unigram_entropy(tokens), "stat": stat}
            _write_meta(meta_path, meta)
        except OSError as e:
            if e.filename and not str(e.filename).startswith(str(cache_root())):
                raise  # a source file, not the cache
            raise _cache_error(Path(e.filename) if e.filename else cache, e) from None
    return tokens, meta


def _split(tokens: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Hold out the last 5% of the stream for validation."""
    n_val = max(int(tokens.size * VAL_FRACTION), 1)
    return [tokens[:-n_val]], [tokens[-n_val:]]


def load_data(path: str | None, tokenizer: str, vocab_size: int) -> TokenData:
    """The token data for a config's `data` option and a model size's tokenizer."""
    if path is None:
        tokens, meta = _cached_tokens(stdlib_files(), tokenizer, vocab_size, "stdlib")
        train, val = _split(tokens)
        return TokenData(train, val, "stdlib", None, tokenizer, vocab_size, meta["fingerprint"], meta.get("unigram_entropy"))
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"data path {path!r} does not exist; valid: a text file, a folder of text files, or llm.c .bin shards")
    if not p.is_dir() and not p.is_file():  # a FIFO, a device: there, but nothing to read tokens from
        raise ConfigError(f"data path {path!r} is {kind_of(p.stat().st_mode)}; valid: a text file, a folder of text "
                          "files, or llm.c .bin shards")
    shards = [p] if p.suffix == ".bin" else sorted(p.glob("*.bin")) if p.is_dir() else []
    if shards:
        # llm.c's convention: shards with "val" in their name hold the validation split.
        val_files = [s for s in shards if "val" in s.name]
        train_files = [s for s in shards if s not in val_files]
        train = [read_shard(s) for s in train_files]
        if val_files:
            val = [read_shard(s) for s in val_files]
        else:
            train, val = _split(train[-1]) if len(train) == 1 else (train[:-1], train[-1:])
        fp, top = _shard_scan(train_files + val_files, train + val)
        return TokenData(train, val, "shards", str(p), "pretokenized", max(vocab_size, 50257), fp, max_token=top)
    tokens, meta = _cached_tokens(_text_files(p), tokenizer, vocab_size, "text")
    train, val = _split(tokens)
    return TokenData(train, val, "text", str(p), tokenizer, vocab_size, meta["fingerprint"], meta.get("unigram_entropy"))
