"""The console's two roles and who a request acts as (docs/console-ui.md#roles).

Pages need ``broker.view_console``; actions that change data need ``broker.operate_console``,
which implies view. Superusers hold both. Only staff users reach the console at all:
anonymous visitors are sent to the login page, other signed-in users get a 403.
"""

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_POST
from django.views.defaults import permission_denied

from broker.core import audit, errors
from broker.core.records import Actor, Principal

VIEW = "broker.view_console"
# A page about something that is not there (any more) answers 404 with the core's message.
NOT_FOUND = (
    errors.TopicNotFound,
    errors.GroupNotFound,
    errors.PartitionNotFound,
    errors.MessageNotFound,
    errors.ScheduledNotFound,
    errors.DeadLetterNotFound,
    errors.ApiKeyNotFound,
    errors.RedriveJobNotFound,
)
OPERATE = "broker.operate_console"

View = Callable[..., HttpResponseBase]
T = TypeVar("T")


def can_view(user: Any) -> bool:
    return bool(user.is_active and user.is_staff and (user.has_perm(VIEW) or can_operate(user)))


def can_operate(user: Any) -> bool:
    return bool(user.is_active and user.is_staff and user.has_perm(OPERATE))


def _guard(check: Callable[[Any], bool]) -> Callable[[View], View]:
    def decorator(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not check(request.user):
                # The 403 page itself: a raised PermissionDenied is logged with its traceback,
                # thirty lines in the server's log for a visitor without the role.
                return permission_denied(request, PermissionDenied())
            try:
                return view(request, *args, **kwargs)
            except NOT_FOUND as exc:
                response = render(
                    request,
                    "console/not_found.html",
                    {"message": exc.message, "can_operate": can_operate(request.user)},
                )
                response.status_code = 404
                return response

        return wrapper

    return decorator


def console_view(view: View) -> View:
    """A page or partial: staff with the view (or operate) permission."""
    return _guard(can_view)(view)


def console_operate(view: View) -> View:
    """An action: a POST (CSRF-checked by the middleware) from staff allowed to operate."""
    return require_POST(_guard(can_operate)(view))


def principal(request: HttpRequest) -> Principal:
    """The core principal a console request acts as: the signed-in user, with every topic."""
    return Principal(name=f"user:{request.user.get_username()}", is_system=True)


def actor(request: HttpRequest) -> Actor:
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    return Actor(
        name=f"user:{request.user.get_username()}",
        source="dashboard",
        client_ip=(forwarded.split(",")[0].strip() or request.META.get("REMOTE_ADDR", ""))[:64],
        user_agent=request.META.get("HTTP_USER_AGENT", "")[:300],
    )


def perform(
    request: HttpRequest,
    action: str,
    target: str,
    params: dict[str, Any],
    call: Callable[[], T],
    success: Callable[[T], str],
    summarize: Callable[[T], dict[str, Any]] | None = None,
) -> T | None:
    """Run one core write through the audit log and flash its outcome; None when refused.

    summarize picks what the audit entry keeps of the result (ids, counts), never secrets.
    """
    try:
        result = audit.audited(actor(request), action, target, params, call, summarize)
    except errors.BrokerError as exc:
        messages.error(request, exc.message)
        return None
    messages.success(request, success(result))
    return result


def flash_error(request: HttpRequest, exc: errors.BrokerError) -> None:
    """A form the core would refuse anyway, refused before the call (not audited: no call)."""
    messages.error(request, exc.message)
