"""The web console: server-rendered, read-only pages over the platform's records.

Sign-in takes a switchyard API key (in a form body, never a URL) and opens a session
(`sessions`); the cookie is HttpOnly and SameSite=Strict. Every page and its JSON twin under
`/api` is one `Route`: the action it needs and whether a team in its path scopes it, checked by
`switchyard.policy.roles.authorize` exactly as the admin API and the CLI check them. Sign-in and
sign-out are CSRF-protected (a per-form token bound to a cookie; a session's own token for
sign-out). Pages are never cached, and nothing on them loads from the network.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from switchyard.audit.query import parse_since
from switchyard.console import views
from switchyard.console.sessions import Session, SessionStore
from switchyard.console.sources import PlatformReader
from switchyard.console.templating import template_env
from switchyard.policy.keys import Principal
from switchyard.policy.roles import Action, Forbidden, allowed, authorize

log = logging.getLogger(__name__)

SESSION_COOKIE = "sy_console_session"
SIGN_IN_COOKIE = "sy_console_signin"  # the sign-in form's CSRF token, bound to this browser
MAX_FORM_BYTES = 4096
DEFAULT_SINCE = "24h"
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # No script, no remote anything: the charts are inline SVG.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'"
    ),
}


@dataclass(frozen=True)
class Route:
    """One console view: its path (relative to the console's root), the action it needs, and
    whether `{team}` in the path is the team that action is checked for (else: all teams)."""

    path: str
    name: str
    action: Action
    team_scoped: bool


ROUTES = (
    Route("/teams/{team}", "team", Action.VIEW_TEAM, True),
    Route("/teams/{team}/spend", "spend", Action.READ_SPEND, True),
    Route("/teams/{team}/jobs", "jobs", Action.VIEW_TEAM, True),
    Route("/teams/{team}/jobs/{workload_id}", "job", Action.VIEW_TEAM, True),
    Route("/teams/{team}/audit", "team_audit", Action.READ_AUDIT, True),
    Route("/operator", "operator", Action.OPERATE, False),
    Route("/audit", "auditor", Action.READ_AUDIT, False),
)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_console(reader: PlatformReader, sessions: SessionStore, clock: Callable[[], float] = time.time) -> FastAPI:
    app = FastAPI(title="switchyard console", docs_url=None, redoc_url=None, openapi_url=None)
    templates = template_env()

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        body = templates.get_template(template).render(root=root(request), **context)
        return HTMLResponse(body, status_code=status, headers=HEADERS)

    def session_of(request: Request) -> tuple[str, Session] | None:
        token = request.cookies.get(SESSION_COOKIE)
        session = sessions.resolve(token)
        return None if session is None or token is None else (token, session)

    def nav(who: Principal) -> list[tuple[str, str]]:
        """The views this principal may open, for the menu."""
        links = []
        for team in reader.teams():
            if allowed(who, Action.VIEW_TEAM, team):
                links.append((f"/teams/{team}", f"team {team}"))
        if allowed(who, Action.OPERATE):
            links.append(("/operator", "operator"))
        if allowed(who, Action.READ_AUDIT):
            links.append(("/audit", "audit"))
        return links

    async def form(request: Request) -> dict[str, str]:
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            raise _Refused(413, f"the form is over {MAX_FORM_BYTES} bytes")
        return {k: v[0] for k, v in parse_qs(body.decode("utf-8", errors="replace")).items()}

    # ------------------------------------------------------------------ sign-in and sign-out

    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request) -> HTMLResponse:
        return _sign_in_form(request, None, 200)

    def _sign_in_form(request: Request, error: str | None, status: int) -> HTMLResponse:
        token = secrets.token_urlsafe(32)
        response = render(request, "login.html", status, csrf=token, error=error, who=None)
        _set_cookie(request, response, SIGN_IN_COOKIE, token, max_age=3600)
        return response

    @app.post("/login")
    async def login(request: Request) -> Response:
        try:
            fields = await form(request)
        except _Refused as exc:
            return _sign_in_form(request, str(exc), exc.status)
        expected = request.cookies.get(SIGN_IN_COOKIE)
        if not expected or not hmac.compare_digest(expected, fields.get("csrf", "")):
            return _sign_in_form(request, "the sign-in form expired or came from another site; try again", 403)
        opened = sessions.open(fields.get("api_key", "").strip())
        if opened is None:
            return _sign_in_form(request, "that key is unknown, revoked or expired", 401)
        token, session = opened
        log.info("console sign-in: key %s (%s)", session.principal.key_id, session.principal.role.value)
        response = RedirectResponse(f"{root(request)}/", status_code=303, headers=HEADERS)
        # The session's whole TTL (it was just opened), not its expiry less this host's clock:
        # the expiry is by the database's clock, and a host ahead of it made the max-age negative.
        _set_cookie(request, response, SESSION_COOKIE, token, max_age=int(sessions.ttl_s))
        response.delete_cookie(SIGN_IN_COOKIE, path=_cookie_path(request))
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        found = session_of(request)
        try:
            fields = await form(request)
        except _Refused as exc:
            return render(request, "error.html", exc.status, message=str(exc), who=None)
        if found is not None:
            token, session = found
            if not session.csrf_matches(fields.get("csrf")):
                return render(request, "error.html", 403, message="sign-out needs the page's form", who=None)
            sessions.end(token)
        response = RedirectResponse(f"{root(request)}/login", status_code=303, headers=HEADERS)
        response.delete_cookie(SESSION_COOKIE, path=_cookie_path(request))
        return response

    @app.get("/")
    def home(request: Request) -> Response:
        found = session_of(request)
        if found is None:
            return RedirectResponse(f"{root(request)}/login", status_code=303, headers=HEADERS)
        _, session = found
        return render(request, "home.html", who=session.principal, csrf=session.csrf, nav=nav(session.principal))

    # ------------------------------------------------------------------ the views

    def guard(request: Request, route: Route, team: str | None) -> Session:
        found = session_of(request)
        if found is None:
            raise _Refused(401, "sign in first")
        session = found[1]
        try:
            authorize(session.principal, route.action, team if route.team_scoped else None)
        except Forbidden as exc:
            raise _Refused(403, exc.public) from exc
        if route.team_scoped and team not in reader.teams():
            raise _Refused(404, "no such team")
        return session

    def build(request: Request, route: Route, params: dict[str, str], who: Principal) -> views.View | None:
        now = clock()
        since = parse_since(request.query_params.get("since", DEFAULT_SINCE), now)
        team = params.get("team")
        flow = request.query_params.get("flow") or None
        bodies = request.query_params.get("bodies") == "1"
        match route.name:
            case "team":
                return views.team_overview(reader, str(team), since, now)
            case "spend":
                return views.team_spend(reader, str(team), now)
            case "jobs":
                return views.team_jobs(reader, str(team))
            case "job":
                return views.job_detail(reader, str(team), params["workload_id"])
            case "team_audit":
                return views.team_audit(reader, who, team, flow, since, bodies)
            case "operator":
                return views.operator(reader, since, now)
            case "auditor":
                team_filter = request.query_params.get("team") or None
                return views.auditor(reader, who, team_filter, flow, since, bodies)
        raise AssertionError(route.name)

    def resolve(request: Request, route: Route) -> tuple[dict[str, str], Session, views.View]:
        """The signed-in session and the view's content; `_Refused` says why not."""
        params = {k: str(v) for k, v in request.path_params.items()}
        try:
            session = guard(request, route, params.get("team"))
            view = build(request, route, params, session.principal)
        except Forbidden as exc:  # an audit query's own check
            raise _Refused(403, exc.public) from exc
        except ValueError as exc:  # a bad `since`
            raise _Refused(400, str(exc)) from exc
        if view is None:
            raise _Refused(404, "no such job for this team")
        return params, session, view

    def page(route: Route) -> Callable[..., Any]:
        def handler(request: Request) -> Response:
            try:
                params, session, view = resolve(request, route)
            except _Refused as exc:
                if exc.status == 401:
                    return RedirectResponse(f"{root(request)}/login", status_code=303, headers=HEADERS)
                return render(request, "error.html", exc.status, message=str(exc), who=None)
            return render(
                request,
                view.template,
                title=view.title,
                data=view.data,
                charts=view.charts,
                who=session.principal,
                csrf=session.csrf,
                nav=nav(session.principal),
                params=params,
                # What this key may do for the page's team: links it may not follow are left out.
                can={a.name for a in Action if allowed(session.principal, a, params.get("team"))},
            )

        return handler

    def api(route: Route) -> Callable[..., Any]:
        def handler(request: Request) -> JSONResponse:
            try:
                _, _, view = resolve(request, route)
            except _Refused as exc:
                return JSONResponse({"error": str(exc)}, exc.status, headers=HEADERS)
            return JSONResponse(view.data, headers=HEADERS)

        return handler

    for route in ROUTES:
        app.add_api_route(route.path, page(route), methods=["GET"], response_class=HTMLResponse, name=route.name)
        app.add_api_route(f"/api{route.path}", api(route), methods=["GET"], name=f"api_{route.name}")
    return app


def _cookie_path(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/") or "/"


def _set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=_cookie_path(request),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",  # a plain-HTTP localhost console could not send a Secure cookie back
    )
