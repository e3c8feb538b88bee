"""Model files: reading GGUF headers, where files live, and getting them (Hub, PyPI, conversion).

gguf.py      what the launcher needs from a GGUF header; whether a drafter fits its target
mtp.py       multi-token-prediction layers: does a file carry ones llama-server's draft-mtp can run
draft_head.py  which LM head rows a drafter drafts from on a CPU (patches 0015-0016): where the cut applies
gguf_cache.py  header facts cached by path, size and mtime (a vocabulary walk costs ~0.1 s)
bonsai2_file.py  what a Bonsai 2 file needs (fold, codec) and the layouts that would answer gibberish
codec_types.py   the Bonsai 2 weight types: ids, block sizes, names (no numpy: every start reads them)
ternary_codecs.py  Q2_0, PQ2_0 and PTQ1_0 at the byte level, and the lossless move to Q2_0
codec_repack.py  PQ2_0/PTQ1_0 files rewritten once as Q2_0, cached under BONSAI_HOME
weight_path.py   which form of the weights a build holds (as they are, or the Q2_0 repack) and its bytes: pure
gguf_format.py  the format at the byte level: value types and the one header cursor bonsai reads with
store.py     where downloaded models live, what is known about them, who may write them
hub.py       the Hugging Face Hub through huggingface_hub: the listing, tokens, resumable downloads
resolve.py   which file of a repository a profile entry means (a name, or patterns in order): pure
lock.py      what each profile's files resolved to (BONSAI_HOME/models.lock.json), for offline starts
progress.py  progress bars for downloads, conversions and quantizing
demo.py      the offline demo model, assembled from its PyPI package
pull.py      `bonsai pull` as a library: which files a profile needs, from the Hub or its PyPI package
fetch.py     one profile's files from the Hub: sizes and sha256 checked, resumable, never half-written
chat_template.py  the guard in front of a model's chat template for reasoning efforts it refuses
tiny_writer.py  tiny GGUF files written atomically: the primitives of the self-test's models
tiny_dense.py   a tiny dense qwen3/llama target: the self-test's dense speculative pair, and the suite's
tiny_hybrid.py  a tiny qwen35 hybrid target (optionally with an MTP layer): the build self-test's, and the suite's
drafters/    legacy DSpark drafters converted to the dflash layout llama-server loads, and their cache
"""
