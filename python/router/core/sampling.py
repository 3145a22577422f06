"""llama.cpp's server's sampling fields: when it samples at random whatever the temperature.

Its sampler chain runs every sampler in order, then draws; temperature 0 leaves one candidate
for the draw. What comes before the temperature sampler may still draw at random: XTC does
(src/llama-sampling.cpp, llama_sample_xtc_apply); the other filters (top_k, top_p, min_p,
typical_p, top_n_sigma, penalties, DRY) are deterministic, and mirostat runs after a plain
temperature sampler, so it has one candidate left too.

The response cache (a greedy answer may be stored) and mid-stream resume (a deterministic
request may be regenerated) ask the same question of a request.
"""

from __future__ import annotations

from typing import Any

# llama.cpp's names of its temperature sampler (common_sampler_types_from_names, lowercased),
# and its letter in the string form (common_sampler_type_to_chr).
_TEMPERATURE_NAMES = frozenset({"temperature", "temp"})
_TEMPERATURE_CHAR = "t"
# Its XTC sampler's name and letter; the default chain runs it just before temperature.
_XTC_NAME = "xtc"
_XTC_CHAR = "x"
# XTC's default threshold (common_params_sampling); above 0.5 it does nothing.
_XTC_THRESHOLD = 0.1
_XTC_OFF_ABOVE = 0.5


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


def _number(value: Any) -> float | None:
    """A sampling field as the server reads it: a JSON number, else None (it takes its default
    for a value of another type)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _xtc_first(samplers: Any) -> bool:
    """Whether the chain runs XTC before the temperature sampler (the default chain does; a
    custom one without XTC never runs it)."""
    if isinstance(samplers, str):
        xtc = samplers.find(_XTC_CHAR)
        return xtc >= 0 and xtc < samplers.find(_TEMPERATURE_CHAR)
    if isinstance(samplers, list):
        names = [s.lower() if isinstance(s, str) else "" for s in samplers]
        if _XTC_NAME not in names:
            return False
        xtc = names.index(_XTC_NAME)
        # No temperature sampler at all is _without_temperature's case.
        return any(name in _TEMPERATURE_NAMES for name in names[xtc + 1 :])
    return True


def _xtc(probability: Any, threshold: Any, samplers: Any) -> bool:
    """XTC active before temperature: with `xtc_probability` above 0 and `xtc_threshold` at
    most 0.5 it draws whether to drop the likeliest tokens, so temperature 0 picks among what it
    left. A probability that is no number is taken as drawing (not worth trusting)."""
    if probability is None:
        return False
    chance = _number(probability)
    if chance is not None and chance <= 0:
        return False
    cut = _number(threshold)
    if cut is None:
        cut = _XTC_THRESHOLD
    return cut <= _XTC_OFF_ABOVE and _xtc_first(samplers)


def sampled_anyway(
    dynatemp_range: Any,
    samplers: Any,
    xtc_probability: Any = None,
    xtc_threshold: Any = None,
) -> bool:
    """Whether llama.cpp's server samples at random whatever the temperature: a dynamic
    temperature range, a `samplers` chain without the temperature sampler, or XTC active
    before it."""
    return (
        _dynamic(dynatemp_range)
        or _without_temperature(samplers)
        or _xtc(xtc_probability, xtc_threshold, samplers)
    )
