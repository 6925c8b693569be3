"""mqsite/settings.py: a secret key per data directory, private files, HTTPS settings."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRINT = (
    "import json; from mqsite import settings as s; print(json.dumps({"
    "'key': s.SECRET_KEY, 'session_secure': getattr(s, 'SESSION_COOKIE_SECURE', False), "
    "'csrf_secure': getattr(s, 'CSRF_COOKIE_SECURE', False), "
    "'hsts': getattr(s, 'SECURE_HSTS_SECONDS', 0), "
    "'proxy': getattr(s, 'SECURE_PROXY_SSL_HEADER', None)}))"
)


def site_settings(data_dir: Path, **env: str) -> dict:
    data_dir.mkdir(mode=0o700, exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "FERRY_"))}
    clean.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", PRINT],
        cwd=ROOT,
        env={**clean, "FERRY_DATA_DIR": str(data_dir), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secret_key__made_per_data_directory_and_kept_private(tmp_path):
    first = site_settings(tmp_path / "a")["key"]
    assert first == site_settings(tmp_path / "a")["key"]
    assert first != site_settings(tmp_path / "b")["key"]
    assert len(first) >= 50
    assert "insecure" not in first
    assert (tmp_path / "a" / "secret_key").read_text().strip() == first
    assert mode(tmp_path / "a" / "secret_key") == 0o600


def test_missing_data_directory__not_made_by_settings(tmp_path):
    """A command pointed at a wrong FERRY_DATA_DIR must say so, not start an empty broker."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "FERRY_"))}
    clean.pop("DATABASE_URL", None)
    subprocess.run(
        [sys.executable, "-c", PRINT],
        cwd=ROOT,
        env={**clean, "FERRY_DATA_DIR": str(tmp_path / "missing")},
        capture_output=True,
        check=True,
    )
    assert not (tmp_path / "missing").exists()


def test_scripts_run__makes_the_data_directory_private():
    assert 'mkdir -p -m 700 "$FERRY_DATA_DIR"' in (ROOT / "scripts" / "run").read_text()


def test_secret_key__the_environment_wins(tmp_path):
    assert site_settings(tmp_path, DJANGO_SECRET_KEY="from-env")["key"] == "from-env"
    assert not (tmp_path / "secret_key").exists()


def test_sqlite_file__created_private(tmp_path):
    site_settings(tmp_path)
    assert mode(tmp_path / "ferry.sqlite3") == 0o600


def test_sqlite_file__stays_private_once_migrated(tmp_path):
    tmp_path.chmod(0o700)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "FERRY_"))}
    clean.pop("DATABASE_URL", None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
        cwd=ROOT,
        env={**clean, "FERRY_DATA_DIR": str(tmp_path)},
        check=True,
    )
    files = sorted(tmp_path.glob("ferry.sqlite3*"))
    assert files
    assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}


def test_https__secure_cookies_and_hsts_behind_a_setting(tmp_path):
    plain = site_settings(tmp_path)
    assert (plain["session_secure"], plain["csrf_secure"], plain["hsts"]) == (False, False, 0)
    secure = site_settings(tmp_path, FERRY_HTTPS="1")
    assert (secure["session_secure"], secure["csrf_secure"]) == (True, True)
    assert secure["hsts"] == 365 * 24 * 3600
    assert secure["proxy"] == ["HTTP_X_FORWARDED_PROTO", "https"]
