"""journal._json's two modes, for tests: ``using("stdlib")`` (the standard library's
codec, never switching) or ``using("orjson")``, restoring the process's mode after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from journal import _json


@contextlib.contextmanager
def using(mode: str) -> Iterator[None]:
    saved = (_json._orjson, _json._options, _json._items_left)
    if mode == "orjson":
        _json.bulk()
    else:
        _json._orjson, _json._options, _json._items_left = None, 0, 2**62
    try:
        yield
    finally:
        _json._orjson, _json._options, _json._items_left = saved
