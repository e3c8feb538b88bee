"""The bottom wing: what every other part needs and that needs nothing of bonsai's own.

errors.py           BonsaiError (a mistake the user can fix, with the fix) and ActionFailed
paths.py            BONSAI_HOME and its folders, packaged data (profiles/, vendor/), executable names
hardware.py         cores, RAM, NVIDIA GPUs, Apple Silicon: what this machine has
console.py          the rich console every wing prints progress and tables through
log_files.py        logs and state files that Windows can still rename while a server holds them
process_control.py  start, stop and outlive child processes on each OS; what a fatal exit code means
watchdog.py         `python -m bonsai_launch.core.watchdog`: stops a server when bonsai dies (macOS)
shell.py            an argv as a POSIX or PowerShell command line to paste
json_cache.py       small answers kept as JSON under BONSAI_HOME/cache, stamped, written atomically
"""
