"""What a framework's launch config states about the layout it runs.

``search --baseline FILE`` places the layout a user runs today in the ranking; the
readers of Megatron-LM arguments, torchtitan TOML and MindFormers YAML each turn their
framework's config into the degrees ``--baseline`` takes, checked against the search's
batch and sequence, with a note wherever the ranking cannot reproduce the config exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ndplan.core.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class Problem:
    """The search a launch config is placed in."""

    num_layers: int
    is_moe: bool
    global_batch: int
    seq_length: int
    framework: str = ""
    """The search's ``--framework``: a config of that framework whose recompute the search
    cannot name is priced as what the framework states (``stated``)."""
    devices: int | None = None
    """The search's device count, where the caller gives it: torchtitan's FSDP degree -1
    takes the devices the other degrees leave, and its default global batch is
    local_batch_size × that data-parallel degree."""


@dataclass
class LaunchLayout:
    """The layout degrees a config states (as ``--baseline`` names them), and notes on
    what the ranking cannot reproduce exactly."""

    degrees: dict[str, int | bool | str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    split: tuple[int, ...] | None = None
    """Decoder layers per chunk where the config places them itself: the search ranks its
    own splits (even or balanced), and says so when the placed one differs."""


def positive(value: object, name: str, where: str) -> int:
    """A degree or count as stated: a positive integer, or one line naming it."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidInputError(f"{where}: {name} {value!r}: expected a positive integer")
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise InvalidInputError(
            f"{where}: {name} {value}: expected a positive integer (expand shell variables "
            "first, e.g. with bash -x)"
        )
    return int(text)


def check_batch(where: str, name: str, stated: int, problem: Problem) -> None:
    _check_matches(where, name, stated, problem.global_batch, "--gbs")


def check_sequence(where: str, name: str, stated: int, problem: Problem) -> None:
    _check_matches(where, name, stated, problem.seq_length, "--seq-len")


def _check_matches(where: str, name: str, stated: int, searched: int, flag: str) -> None:
    """A config is placed in this search only: its batch and sequence must be the search's."""
    if stated != searched:
        raise InvalidInputError(
            f"{where}: {name} {stated} differs from the search's {flag} {searched}; "
            f"search with {flag} {stated} or place another layout"
        )


def per_layer_recompute(
    result: LaunchLayout, where: str, what: str, framework: str, problem: Problem
) -> str:
    """The recompute policy that prices a setting no policy names (block recompute of some
    layers, other modules, every N-th layer): in a search of the config's own framework,
    the fastest setting that framework states (the config's is one of them), else the
    per-layer choice; a note says which."""
    if problem.framework == framework:
        policy, priced = "stated", f"the fastest setting {framework}'s config states that fits"
    else:
        policy, priced = "auto", "the search's per-layer choice"
    result.notes.append(
        f"{where}: {what} is priced as {priced} (recompute {policy}), which may be faster than it"
    )
    return policy
