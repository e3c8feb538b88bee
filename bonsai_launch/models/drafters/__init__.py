"""Legacy DSpark drafters (PrismML's `dspark` layout) as dflash drafters mainline llama.cpp loads.

convert.py  reading the legacy file, writing the dflash one, quantizing it (`bonsai convert-drafter`)
cache.py    conversions made once and reused: for a profile's drafter and for `--drafter LEGACY.gguf`
"""
