"""Shared pydantic base and constrained types for the domain models."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    """Immutable, strict, self-documenting: frozen and hashable, unknown keys refused,
    field docstrings become the JSON schema's descriptions."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
# No descriptions on reusable types: pydantic prefers them to the field's own docstring.
Degree = Annotated[int, Field(ge=1)]
"""The size of one parallel dimension."""
Bytes = int
Seconds = float
