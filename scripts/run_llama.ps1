# Ask a Bonsai model one question in the terminal: a thin wrapper around `bonsai run`.
#
# Uses the running server of the profile (see `bonsai ps`), or starts a temporary one.
# Same environment variables as start_llama_server.ps1; arguments go to `bonsai run`.
#
#   .\scripts\run_llama.ps1 "Write a haiku about bonsai trees"
#   $env:BONSAI_PROFILE = "demo"; $env:BONSAI_SPECULATIVE = "1"; .\scripts\run_llama.ps1 "List 1 to 50" --max-tokens 200
#
# Windows PowerShell 5.1 and PowerShell 7 (pwsh) on any OS.

# Not "Stop": Windows PowerShell 5.1 would turn a probe's stderr (2>$null) into a fatal error.
$ErrorActionPreference = "Continue"

if ($args.Count -eq 0) {
    [Console]::Error.WriteLine("usage: run_llama.ps1 ""PROMPT"" [bonsai run options]")
    exit 2
}

function Find-Bonsai {
    $cmd = Get-Command bonsai -CommandType Application -ErrorAction SilentlyContinue | Select-Object -First 1
    if ($cmd) { return @($cmd.Source) }
    $root = Split-Path -Parent $PSScriptRoot
    foreach ($candidate in @((Join-Path $root ".venv\Scripts\bonsai.exe"), (Join-Path $root ".venv/bin/bonsai"))) {
        if (Test-Path $candidate -PathType Leaf) { return @($candidate) }
    }
    foreach ($py in @("py", "python3", "python")) {
        $found = Get-Command $py -CommandType Application -ErrorAction SilentlyContinue | Select-Object -First 1
        if ($found) {
            & $found.Source -c "import bonsai_launch" 2>$null | Out-Null  # the answer is the exit code, not output
            if ($LASTEXITCODE -eq 0) { return @($found.Source, "-m", "bonsai_launch") }
        }
    }
    return $null
}

# @(...): PowerShell unrolls a returned array, so a one-element answer (bonsai.exe on PATH)
# would arrive as a plain string, and $bonsai[0] would be its first letter.
$bonsai = @(Find-Bonsai | Where-Object { $_ })
if ($bonsai.Count -eq 0) {
    [Console]::Error.WriteLine("error: bonsai is not installed (no 'bonsai' command on PATH, no python with bonsai_launch)")
    [Console]::Error.WriteLine("  install it:            pip install 'bonsai-launch[demo]'")
    [Console]::Error.WriteLine("  or from this checkout: pip install '.[demo]'")
    [Console]::Error.WriteLine("then run this script again.")
    exit 127
}

$exe = $bonsai[0]
$prefix = @($bonsai | Select-Object -Skip 1)
& $exe @prefix run @args
exit $LASTEXITCODE
