"""Where the server listens: loopback unless the user opts in, and never beyond it without a key."""

from __future__ import annotations

import ipaddress

from bonsai_launch.config.settings import Settings
from bonsai_launch.core.errors import BonsaiError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(settings: Settings) -> None:
    """Where it listens: one TCP address; beyond loopback only with the opt-in and a key."""
    host = settings["host"]
    origin = "-- --host" if settings.source("host") == "passthrough" else "BONSAI_HOST"
    if "," in host or host.endswith(".sock"):
        raise BonsaiError(
            f"{origin}={host!r}: bonsai serves on one TCP address (it checks and reports that address)",
            "give one address, e.g. 127.0.0.1, or run a second server for another address",
        )
    if not is_loopback(host) and not settings["allow_remote"]:
        raise BonsaiError(
            f"{origin}={host!r} is not a loopback address and remote access is not allowed",
            "set BONSAI_ALLOW_REMOTE=1 (an API key is then required) or use 127.0.0.1",
        )
    if not is_loopback(host) and not settings.get("api_key"):
        raise BonsaiError(
            f"{origin}={host!r} is reachable from the network but no API key is set",
            "set BONSAI_API_KEY, or let `bonsai start` generate one",
        )
