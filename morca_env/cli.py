"""argparse types for the scripts: a bad value is a usage error naming the value and what is valid."""

from __future__ import annotations

import argparse
import json


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer (valid: 1, 2, ...)")
    return value


def json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({error}); valid: a JSON object of env kwargs")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object of env kwargs")
    return value
