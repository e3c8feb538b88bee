"""`bonsai config`: every effective setting and where its value came from.

Examples:
    bonsai config
    BONSAI_SPECULATIVE=yes bonsai config --profile demo --json
"""

from __future__ import annotations

from bonsai_launch.cli._options import FamilyOpt, JsonOpt, ProfileOpt, SizeOpt


def command(
    profile: ProfileOpt = None, family: FamilyOpt = None, size: SizeOpt = None, json_output: JsonOpt = False
) -> None:
    """Show each BONSAI_* setting's value and its source (flag, env, profile, default)."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.config.settings import SETTINGS
    from bonsai_launch.server.inputs import select

    selection = select({"profile": profile, "family": family, "size": size})
    rows = []
    for setting in SETTINGS:
        resolved = selection.settings.values[setting.key]
        value = resolved.value
        if setting.kind == "secret" and value:
            value = "***"
        if value is None:
            value = setting.default_text or None
        rows.append({"env": setting.env, "value": value, "source": resolved.source, "description": setting.description})
    from bonsai_launch.server.prepare import describe_for_config

    tuning = describe_for_config(selection)
    if json_output:
        emit_json({"profile": selection.profile.name, "settings": rows, "tuning": tuning})
        return
    from rich.table import Table

    table = Table(title=f"profile {selection.profile.name}")
    for col in ("variable", "value", "source", "meaning"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["env"], "" if row["value"] is None else str(row["value"]), row["source"], row["description"])
    out = console()
    out.print(table)
    if tuning.get("table"):
        from bonsai_launch.cli._decision import print_decision

        print_decision(out, tuning, title=f"tuning decision {tuning['id']} ({tuning['prompts']}, {tuning['created']})")
    out.print(
        tuning["message"].replace("BONSAI_SPECULATIVE=auto: ", "tuning (BONSAI_SPECULATIVE=auto): ", 1), markup=False
    )
