"""llama.cpp's server's sampling fields: when it samples at random whatever the temperature.

The response cache (a greedy answer may be stored) and mid-stream resume (a deterministic
request may be regenerated) ask the same question of a request.
"""

from __future__ import annotations

from typing import Any

# llama.cpp's names of its temperature sampler (common_sampler_types_from_names, lowercased),
# and its letter in the string form (common_sampler_type_to_chr).
_TEMPERATURE_NAMES = frozenset({"temperature", "temp"})
_TEMPERATURE_CHAR = "t"


def _dynamic(dynatemp_range: Any) -> bool:
    """A dynamic temperature range: drawn from [temperature - range, temperature + range], so
    at temperature 0 too."""
    if dynatemp_range is None or isinstance(dynatemp_range, bool):
        return False
    return not isinstance(dynatemp_range, int | float) or dynatemp_range > 0


def _without_temperature(samplers: Any) -> bool:
    """A custom sampler chain that leaves out the temperature sampler: temperature 0 is never
    applied and the last sampler draws at random. A list of names or a string of letters
    replaces the default chain (which holds it); anything else is ignored by the server."""
    if isinstance(samplers, str):
        return _TEMPERATURE_CHAR not in samplers
    if isinstance(samplers, list):
        names = [s.lower() for s in samplers if isinstance(s, str)]
        # A name that is not a string fails the request there: not worth trusting either.
        return len(names) != len(samplers) or not _TEMPERATURE_NAMES.intersection(names)
    return False


def sampled_anyway(dynatemp_range: Any, samplers: Any) -> bool:
    """Whether llama.cpp's server samples at random whatever the temperature: a dynamic
    temperature range, or a `samplers` chain without the temperature sampler."""
    return _dynamic(dynatemp_range) or _without_temperature(samplers)
