"""Shared pydantic base and constrained types for the domain models."""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache
from itertools import pairwise
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import DEFAULT_REF_TEMPLATE, GenerateJsonSchema, JsonSchemaMode


class DocumentedSchema(GenerateJsonSchema):
    """JSON schema whose field descriptions are the fields' docstrings.

    Read from the source when a schema is asked for, not at import: pydantic's
    ``use_attribute_docstrings`` reads every model's source as its class is built,
    a quarter of ndplan's own import time (80 ms of every command) for a schema few
    commands print. A field's docstring wins over a description on a shared type."""

    def model_schema(self, schema: Any) -> Any:
        json_schema = super().model_schema(schema)
        properties = json_schema.get("properties", {})
        fields = schema["cls"].model_fields
        for name, doc in field_docstrings(schema["cls"]).items():
            field = fields.get(name)
            prop = properties.get(field.alias or name) if field is not None else None
            if prop is not None:
                prop["description"] = doc
        return json_schema


def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each annotated field of ``cls`` and its bases (the subclass's
    own winning), as written."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if issubclass(klass, BaseModel) and klass is not BaseModel:
            docs.update(_own_field_docstrings(klass))
    return docs


@cache
def _own_field_docstrings(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # no source (a frozen install): no docs
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for stmt, after in pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


class Frozen(BaseModel):
    """Immutable, strict, self-documenting: frozen and hashable, unknown keys refused,
    NaN and infinities refused (a device file's ``.inf`` GiB would otherwise pass every
    bound), field docstrings become the JSON schema's descriptions (``DocumentedSchema``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @classmethod
    def model_json_schema(
        cls,
        by_alias: bool | None = None,
        ref_template: str = DEFAULT_REF_TEMPLATE,
        schema_generator: type[GenerateJsonSchema] = DocumentedSchema,
        mode: JsonSchemaMode = "validation",
        **kwargs: Any,
    ) -> dict[str, Any]:
        return super().model_json_schema(
            by_alias=by_alias,
            ref_template=ref_template,
            schema_generator=schema_generator,
            mode=mode,
            **kwargs,
        )


PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Degree = Annotated[int, Field(ge=1)]
"""The size of one parallel dimension."""
Bytes = int
Seconds = float
