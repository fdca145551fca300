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
Degree = Annotated[int, Field(ge=1, description="size of one parallel dimension")]
Bytes = Annotated[int, Field(description="bytes")]
Seconds = Annotated[float, Field(description="seconds")]
