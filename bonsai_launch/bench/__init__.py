"""`bonsai bench`: an honest before/after benchmark of speculative decoding.

prompts.py   the bundled prompt suite (suites/*.jsonl) and user JSONL files
data.py      what a run is made of: options, configurations, raw measurements, listeners, environment
servers.py   one server per configuration, launched and proven live, or attached by URL
requests.py  what each server is sent: warm-up, the suite, multi-turn and concurrency rounds
measure.py   one streamed request, /metrics counters, process memory (the HTTP/process edge)
streams.py   the token streams of measured requests (the server's own tokenizer), for replays
runner.py    which servers run, in which order, with which requests (launch and URL modes)
stats.py     medians, min-max, paired ratios and the noise rule behind every verdict
verdicts.py  the judgements: output equality, verdict lines, trade-offs, which setting for K users
summary.py   raw measurements -> the report document (schema.json describes it)
format.py    numbers and rows as the report writes them (terminal and Markdown alike)
terminal.py  the report as rich tables
report.py    the report as Markdown, JSON and an SVG chart (chart.py)
chart.py     the SVG charts
schema.py    the JSON schema and a small validator
pipeline.py  the whole run, as the CLI calls it
"""
