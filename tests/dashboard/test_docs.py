"""docs/console-ui.md's examples run as written."""

import re
from pathlib import Path

from django.contrib.auth.models import User
from django.core.management import call_command

DOC = Path(__file__).resolve().parents[2] / "docs" / "console-ui.md"


def test_console_ui_doc__grant_view_role(db, client):
    snippet = re.search(r'manage\.py shell -c "\n(.*?)\n"\n', DOC.read_text(), re.S)
    assert snippet is not None
    call_command("shell", command=snippet.group(1))
    user = User.objects.get(username="vera")
    assert user.has_perm("broker.view_console")
    assert not user.has_perm("broker.operate_console")
    client.force_login(user)
    assert client.get("/").status_code == 200
    assert client.post("/topics/create/", {"name": "x"}).status_code == 403
