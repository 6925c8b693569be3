"""The console's URLs: pages, the partials htmx swaps in live, and the actions (POST only)."""

from django.urls import path

from dashboard import examples
from dashboard.views import (
    audit,
    dead_letters,
    groups,
    keys,
    messages,
    overview,
    scheduled,
    topics,
    transactions,
)

app_name = "dashboard"
urlpatterns = [
    path("", overview.overview, name="overview"),
    path("live/overview/", overview.overview_live, name="overview-live"),
    # Topics
    path("topics/", topics.topic_list, name="topics"),
    path("topics/create/", topics.topic_create, name="topic-create"),
    path("topics/<str:name>/", topics.topic_detail, name="topic"),
    path("topics/<str:name>/live/", topics.topic_live, name="topic-live"),
    path("topics/<str:name>/series.json", topics.topic_series, name="topic-series"),
    path("topics/<str:name>/settings/", topics.topic_alter, name="topic-alter"),
    path("topics/<str:name>/purge/", topics.topic_purge, name="topic-purge"),
    path("topics/<str:name>/delete/", topics.topic_delete, name="topic-delete"),
    # The message browser
    path("topics/<str:name>/messages/", messages.message_list, name="messages"),
    path("topics/<str:name>/messages/export/", messages.message_export, name="messages-export"),
    path("topics/<str:name>/messages/produce/", messages.message_produce, name="message-produce"),
    path(
        "topics/<str:name>/messages/<int:partition>/<int:offset>/",
        messages.message_detail,
        name="message",
    ),
    # Groups
    path("groups/", groups.group_list, name="groups"),
    path("groups/<str:name>/", groups.group_detail, name="group"),
    path("groups/<str:name>/live/", groups.group_live, name="group-live"),
    path("groups/<str:name>/series.json", groups.group_series, name="group-series"),
    path("groups/<str:name>/reset/preview/", groups.reset_preview, name="group-reset-preview"),
    path("groups/<str:name>/reset/", groups.group_reset, name="group-reset"),
    path("groups/<str:name>/settings/", groups.group_configure, name="group-configure"),
    path("groups/<str:name>/delete/", groups.group_delete, name="group-delete"),
    # Scheduled (delayed) messages
    path("scheduled/", scheduled.scheduled_list, name="scheduled"),
    path("scheduled/live/", scheduled.scheduled_live, name="scheduled-live"),
    path("scheduled/<int:id>/cancel/", scheduled.scheduled_cancel, name="scheduled-cancel"),
    path("scheduled/<int:id>/deliver/", scheduled.scheduled_deliver, name="scheduled-deliver"),
    path(
        "scheduled/<int:id>/reschedule/",
        scheduled.scheduled_reschedule,
        name="scheduled-reschedule",
    ),
    # Transactions
    path("transactions/", transactions.transaction_list, name="transactions"),
    path("transactions/live/", transactions.transaction_live, name="transactions-live"),
    path(
        "transactions/<int:id>/commit/",
        transactions.transaction_commit,
        name="transaction-commit",
    ),
    path(
        "transactions/<int:id>/rollback/",
        transactions.transaction_rollback,
        name="transaction-rollback",
    ),
    # Dead letters and redrives
    path("dead-letters/", dead_letters.dead_letter_list, name="dead-letters"),
    path("dead-letters/live/", dead_letters.dead_letter_live, name="dead-letters-live"),
    path("dead-letters/count/", dead_letters.redrive_count, name="dead-letters-count"),
    path("dead-letters/redrive/", dead_letters.redrive_start, name="dead-letters-redrive"),
    path("dead-letters/purge/", dead_letters.dead_letter_purge, name="dead-letters-purge"),
    path("dead-letters/redrives/<int:id>/", dead_letters.redrive_progress, name="redrive"),
    path(
        "dead-letters/redrives/<int:id>/cancel/", dead_letters.redrive_cancel, name="redrive-cancel"
    ),
    # API keys and the audit log
    path("keys/", keys.key_list, name="keys"),
    path("keys/create/", keys.key_create, name="key-create"),
    path("keys/revoke/", keys.key_revoke, name="key-revoke"),
    path("audit/", audit.audit_list, name="audit"),
    path("examples/subscribe/", examples.subscribe, name="example-subscribe"),
]
