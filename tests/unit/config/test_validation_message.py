"""One wording of a pydantic error for the CLI's config errors and the API's 422 bodies."""

from pydantic import BaseModel, ValidationError, field_validator

from source_backfill.config import validation_message


class _Model(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 0:
            msg = "must be 0 or more"
            raise ValueError(msg)
        return value


def _error(**data: object) -> dict:
    try:
        _Model(**data)
    except ValidationError as exc:
        return exc.errors()[0]
    raise AssertionError


def test_our_validators_message_stands_alone():
    assert validation_message(_error(n=-1)) == "must be 0 or more"


def test_pydantics_own_messages_are_kept():
    message = validation_message(_error(n="x"))
    assert message == "Input should be a valid integer, unable to parse string as an integer"


def test_no_message_is_invalid():
    assert validation_message({}) == "invalid"
