"""Settings: what the user asked for, from flags, BONSAI_* variables and profiles.

settings.py  the registry of every BONSAI_* variable: kind, default, bounds; resolve() applies
             precedence (flag > environment > profile > default) and refuses bad values in one line
profiles.py  the model profiles (profiles/*.yaml and BONSAI_PROFILES_DIR): files, sampling, settings
envdoc.py    environment_variables.md, generated from the registry
"""
