"""Legacy DSpark drafters (PrismML's `dspark` layout) as dflash drafters mainline llama.cpp loads.

legacy.py      reading: the legacy file (gguf.GGUFReader) and a target's key/value section
plan.py        what the conversion will do, decided before anything is written (and refusals)
convert.py     writing the dflash file, streamed and hashed; the whole job (`bonsai convert-drafter`)
quantize.py    shrinking it with our build's llama-quantize
provenance.py  what a conversion records about its source and target; legacy or stale?
cache.py       conversions made once and reused: for a profile's drafter and for `--drafter LEGACY.gguf`
"""
