"""`bonsai bench`: an honest before/after benchmark of speculative decoding.

prompts.py   the bundled prompt suite (prompts/*.jsonl) and user JSONL files
measure.py   one streamed request, /metrics counters, process memory (the HTTP/process edge)
runner.py    which servers run, in which order, with which requests (launch and URL modes)
stats.py     medians, min-max, paired ratios and the noise rule behind every verdict
summary.py   raw measurements -> the report document (schema.json describes it)
report.py    that document as a terminal table, Markdown, JSON and an SVG chart (chart.py)
schema.py    the JSON schema and a small validator
pipeline.py  the whole run, as the CLI calls it
"""
