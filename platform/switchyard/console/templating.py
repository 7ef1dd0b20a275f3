"""The console's Jinja environment: the package's templates, autoescaped, with its filters."""

from __future__ import annotations

import time

from jinja2 import Environment, PackageLoader, select_autoescape


def utc(t: float | None) -> str:
    return "" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(t)))


def template_env() -> Environment:
    env = Environment(loader=PackageLoader("switchyard.console", "templates"), autoescape=select_autoescape())
    env.filters["utc"] = utc
    return env
