"""The HTML view under its earlier import path; it lives in :mod:`captum_attnflow.visualize.html`."""

from captum_attnflow.visualize.html import NEGATIVE, POSITIVE, Section, attribution_html, colour, figure_html, page_html

__all__ = ["NEGATIVE", "POSITIVE", "Section", "attribution_html", "colour", "figure_html", "page_html"]
