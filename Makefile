# Combined: every target creates .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Bytecode of the sources, written even where PYTHONDONTWRITEBYTECODE is set: every
# `combined` process the tests and benchmarks start then reads it instead of
# compiling each module again (about a CPU-second a process).
COMPILE = $(BIN)/python -m compileall -q -j 2 src >/dev/null
export COMBINED_TEST_PG_DSN ?= postgresql://postgres@127.0.0.1:5432/postgres
export COMBINED_TEST_MARIADB_DSN ?= mysql://root@127.0.0.1:3306/test

.PHONY: demo test check bench bench-mariadb bench-many bench-files bench-taps bench-cdc-shapes fmt clean schema orchestrators

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/combined demo

# The suite on two pytest-xdist workers (TEST_WORKERS), and beside it, one at a
# time, the tests marked `beside` (tests/conftest.py): the long end-to-end ones
# that mostly wait on other processes (Dagster, Airflow and dbt in their own
# virtualenvs, three workers sharing a catalog) and those sharing MariaDB's
# binary log. Their output follows (test-artifacts/side-tests.log); each group
# names its slowest tests.
TEST_WORKERS ?= 2

test: $(STAMP)
	@mkdir -p test-artifacts
	@$(COMPILE)
	@$(BIN)/python -m pytest -q -p no:cacheprovider -m beside --durations=15 \
	  >test-artifacts/side-tests.log 2>&1 & side=$$!; \
	trap 'kill $$side 2>/dev/null' INT TERM; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not beside" --durations=30; main=$$?; \
	wait $$side; side_rc=$$?; \
	echo "== beside it (-m beside)"; cat test-artifacts/side-tests.log; \
	test $$main -eq 0 && test $$side_rc -eq 0

check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	@$(COMPILE)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# Dagster's, Airflow's and dbt's own virtualenvs, for tests/orchestrators (built there
# too when missing; minutes the first time, then reused: docs/python.md).
orchestrators: $(STAMP)
	$(BIN)/python -m tests.orchestrators.envs dagster airflow dbt

# MariaDB's figures (bench/mariadb.py): floor, Combined and dlt side by side,
# the binlog backlog, and follow latency next to PostgreSQL's.
bench-mariadb: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	@$(COMPILE)
	$(BIN)/python -m bench.mariadb $(BENCH_ARGS)

# Many small tables (bench/many.py): what a table costs besides its rows, on
# PostgreSQL and MariaDB, next to a floor that reads every table into Parquet.
bench-many: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	@$(COMPILE)
	$(BIN)/python -m bench.many $(BENCH_ARGS)

# Files (bench/files.py): a CSV and a JSON lines file, first, unchanged and
# changed captures next to DuckDB reading the file into Parquet.
bench-files: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	@$(COMPILE)
	$(BIN)/python -m bench.files $(BENCH_ARGS)

# Record-at-a-time connectors (bench/taps.py): a Singer tap, an Airbyte source and an
# HTTP API on 127.0.0.1, first, unchanged and changed captures next to pyarrow's JSON read.
bench-taps: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	@$(COMPILE)
	$(BIN)/python -m bench.taps $(BENCH_ARGS)

# A CDC backlog on every table shape of bench/shapes.py (bench/cdc_shapes.py): every row
# updated, 1% deleted and inserted, drained by one capture at the defaults.
bench-cdc-shapes: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	@$(COMPILE)
	$(BIN)/python -m bench.cdc_shapes $(BENCH_ARGS)

# The JSON Schema of combined.yaml and its reference, both from the models
# (tests/config/test_config_reference.py fails when either is stale).
schema: $(STAMP)
	$(BIN)/combined schema --output schema/combined.schema.json
	$(BIN)/combined schema --reference --output docs/configuration.md

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .venv-orchestrators .combined lake .pytest_cache .mypy_cache .ruff_cache
