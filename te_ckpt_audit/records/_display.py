"""How a record shows itself at a Python prompt: `print(report)` is the table the command line
prints, a notebook shows the HTML report's table (`_repr_html_`), and `repr` is one short line.
The text comes from the renderers, imported when asked for (they import the records)."""

from __future__ import annotations

from typing import Any


class Shown:
    """A record that prints as its table. The record's own fields stay its data (`to_dict`)."""

    __slots__ = ()

    def __str__(self) -> str:
        from ..render import text_of

        return text_of(self)

    def _repr_html_(self) -> str:
        from ..render import html_of

        return html_of(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._summary()}; print() it for the table>"

    def _summary(self) -> str:
        target: Any = getattr(self, "target", "")
        return f"of {target!r}"
