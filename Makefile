# One line per target; the logic lives in scripts/ (STYLE.md §7).
.PHONY: run test test-fast lint services serve bench

run:        ## set up, then serve the embedded default on 127.0.0.1:$${PORT:-8000}
	scripts/run

test:       ## set up, lint, then the whole suite on SQLite and on PostgreSQL
	scripts/test

test-fast:  ## the SQLite suite only, no set-up checks
	.venv/bin/pytest -q

lint:       ## ruff check, format check, mypy and the import contracts
	scripts/lint

services:   ## start PostgreSQL on loopback for the production setup (prints DATABASE_URL)
	scripts/postgres start "$${FERRY_SERVICES_DIR:-./var/services}" "$${PGPORT:-55432}"

bench:      ## the benchmarks under bench/, printing their figures
	scripts/bench
