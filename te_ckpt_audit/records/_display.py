"""How a record shows itself at a Python prompt: `print(report)` is the table the command line
prints, a notebook shows the HTML report's table (`_repr_html_`), and `repr` is one short line.

The records do not import the renderers (the renderers import the records): the renderers hand
their two functions in when they are imported (`te_ckpt_audit.render`, which the package imports),
through `shown_by`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_SHOWN: dict[str, Callable[[Any], str]] = {}


def shown_by(text: Callable[[Any], str], html: Callable[[Any], str]) -> None:
    """The renderers' functions from a record to its text and to its notebook HTML."""
    _SHOWN.update(text=text, html=html)


class Shown:
    """A record that prints as its table. The record's own fields stay its data (`to_dict`)."""

    __slots__ = ()

    def __str__(self) -> str:
        return _SHOWN["text"](self) if "text" in _SHOWN else repr(self)

    def _repr_html_(self) -> str:
        return _SHOWN["html"](self) if "html" in _SHOWN else repr(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._summary()}; print() it for the table>"

    def _summary(self) -> str:
        target: Any = getattr(self, "target", "")
        return f"of {target!r}"
