"""Which share of a text's tokens an MTP draft head over the first K rows can draft (patch 0015).

Patch 0015 computes the qwen35 MTP drafter's logits over the LM head's first
LLAMA_DRAFT_HEAD_ROWS rows only (65536 on a CPU): a token with a larger id is never drafted,
so at most the share of tokens below K can be accepted. A BPE vocabulary is ordered by merge
rank, its first ids the most frequent pieces; this measures how much of real text they carry.

It tokenizes each text with Qwen2's vocabulary (`models/ggml-vocab-qwen2.gguf` of the pinned
source, the 151936-token vocabulary of Qwen3 and Bonsai 1; llama.cpp's own vocabulary test
file) through the `tokenizers` library (the `fleet` extra brings it), rebuilt from the file's
tokens, merges and Qwen2's pre-tokenizer pattern, and prints the share of tokens below each K.
Bonsai 2's qwen35 vocabulary (248320 tokens) is not on this machine: its shares are not
measured here.

The default texts are files a Debian machine with vim has, none of them this repository's:
the GPL-3 and Apache-2.0 licences and the READMEs under /usr/share/doc (English prose), modules
of Python's standard library and two C headers (code), vim's tutor in German, French, Spanish,
Italian and Portuguese (European languages), and Python's CJK codec test texts with vim's
Japanese, Chinese, Korean and Russian tutors (other scripts). `--text NAME=PATH[,PATH...]`
replaces them.

    python benchmarks/draft_vocab_coverage.py
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_kernels import after_bin

ROWS = (8192, 16384, 32768, 49152, 65536, 98304)
# Qwen2's pre-tokenizer (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def default_texts() -> dict[str, list[str]]:
    stdlib = sysconfig.get_paths()["stdlib"]
    tutor = "/usr/share/vim/vim*/tutor/tutor"
    return {
        "English prose": [
            "/usr/share/common-licenses/GPL-3",
            "/usr/share/common-licenses/Apache-2.0",
            *sorted(glob.glob("/usr/share/doc/*/README*"))[:20],
        ],
        "code (Python, C)": [
            *sorted(glob.glob(f"{stdlib}/json/*.py")),
            f"{stdlib}/http/server.py",
            f"{stdlib}/asyncio/tasks.py",
            f"{stdlib}/argparse.py",
            "/usr/include/stdio.h",
            "/usr/include/string.h",
        ],
        "German, French, Spanish, Italian, Portuguese": [
            p for lang in ("de", "fr", "es", "it", "pt") for p in glob.glob(f"{tutor}.{lang}.utf-8")
        ],
        "Chinese, Japanese, Korean, Russian": [
            *sorted(glob.glob(f"{stdlib}/test/cjkencodings/*-utf8.txt")),
            *[p for lang in ("ru", "ja", "zh", "ko") for p in glob.glob(f"{tutor}.{lang}.utf-8")],
        ],
    }


def read_text(path: str) -> str:
    data = Path(path).read_bytes()
    if path.endswith(".gz") or data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def qwen2_tokenizer(vocab_file: Path):
    from gguf import GGUFReader
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    reader = GGUFReader(vocab_file)

    def strings(key: str) -> list[str]:
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges])
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=Path, help="a GGUF with a Qwen2-style BPE vocabulary (default: the pin's)")
    ap.add_argument(
        "--text", action="append", default=[], help="NAME=PATH[,PATH...] (repeatable; replaces the defaults)"
    )
    ap.add_argument("--json", type=Path, help="write the shares here too")
    args = ap.parse_args()
    vocab = args.vocab
    if vocab is None:
        manifest = json.loads((after_bin().parent / "manifest.json").read_text())
        vocab = Path(manifest["source"]["path"]) / "models" / "ggml-vocab-qwen2.gguf"
    if not vocab.is_file():
        sys.exit(f"--vocab {vocab}: no such file; pass a GGUF with a Qwen2 vocabulary")
    texts = {n: p.split(",") for n, p in (t.split("=", 1) for t in args.text)} if args.text else default_texts()
    tokenizer = qwen2_tokenizer(vocab)
    print(f"## Share of tokens below K ({vocab.name})\n")
    print("| text | files | tokens | " + " | ".join(f"K = {k}" for k in ROWS) + " |")
    print("|---|---:|---:|" + "---:|" * len(ROWS))
    result = {}
    for name, paths in texts.items():
        present = [p for p in paths if Path(p).is_file()]
        if not present:
            print(f"| {name} | 0 | - |" + " - |" * len(ROWS))
            continue
        ids = [i for p in present for i in tokenizer.encode(read_text(p)).ids]
        shares = {k: sum(i < k for i in ids) / len(ids) for k in ROWS}
        result[name] = {"files": present, "tokens": len(ids), "share_below": shares}
        print(
            f"| {name} | {len(present)} | {len(ids)} | " + " | ".join(f"{100 * s:.1f}%" for s in shares.values()) + " |"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
