"""llama.cpp itself: which build a profile needs, building it, and what a binary can do.

flavours.py      mainline or PrismML's fork: which build a profile's files need, and which file a build loads
options.py       llama-server's option table, read from its --help (and the pinned build's table, shipped)
capabilities.py  what a probed binary can do: speculative types, flags, devices, backend
spec_types.py    several speculative types at once: the order llama-server tries them in, one draft model
binaries.py      running a binary's --help/--version/--list-devices once per change (cached probe)
choice.py        the one answer to "which llama-server": the user's (BONSAI_LLAMA_SERVER/BIN) or our build
replay.py        a token stream through the pin's own n-gram drafters (ngram_replay.cpp, compiled per build)
builds/          `bonsai build`: the pinned source, our patches, the toolchain, cmake and the install
"""
