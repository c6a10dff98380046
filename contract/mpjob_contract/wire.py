"""The base of every API model: camelCase on the wire, snake_case in Python, unknown fields
rejected. Its own module so that the API's parts in other modules (`tracking`) share it with
`api` without importing `api` (which imports them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The object as it appears on the wire (camelCase, unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
