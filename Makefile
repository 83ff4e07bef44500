# orderpay developer commands. `make help` lists them.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.ONESHELL:
.DEFAULT_GOAL := help

PG_HOST ?= 127.0.0.1
PG_PORT ?= 5432
# The NATS (with JetStream) `make test` uses and `make run` publishes events to when it answers.
NATS_HOST ?= 127.0.0.1
NATS_PORT ?= 4222
export DATABASE_URL ?= postgres://postgres@$(PG_HOST):$(PG_PORT)/orderpay
export ORDERPAY_LISTEN ?= 127.0.0.1:8080
export MOCK_PROVIDER_LISTEN ?= 127.0.0.1:8081
export ORDERPAY_PROVIDER_URL ?= http://$(MOCK_PROVIDER_LISTEN)
# The server make run and make demo use for their own database, dropped and created anew by
# each make run (the mock provider's state and the run's secrets are fresh each time too).
PG_SERVER_URL ?= postgres://postgres@$(PG_HOST):$(PG_PORT)
DEMO_DATABASE ?= orderpay_demo
DEMO_DATABASE_URL := $(PG_SERVER_URL)/$(DEMO_DATABASE)
# The localstripe (a local stand-in for Stripe's API) make test-stripe runs against.
LOCALSTRIPE_VERSION ?= 1.15.10
# Whether a NATS server answers at NATS_HOST:NATS_PORT (it greets every client with INFO).
NATS_ANSWERS := timeout 2 bash -c 'exec 3<>/dev/tcp/$(NATS_HOST)/$(NATS_PORT) && head -c 4 <&3' 2>/dev/null | grep -q INFO

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

.PHONY: db
db: ## make sure a PostgreSQL answers at PG_HOST:PG_PORT, starting the local cluster if needed
	@if pg_isready -q -h $(PG_HOST) -p $(PG_PORT) 2>/dev/null; then exit 0; fi
	if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql/ >/dev/null 2>&1; then
	  version=$$(ls /etc/postgresql | sort -V | tail -1)
	  echo "no PostgreSQL at $(PG_HOST):$(PG_PORT); starting the local cluster $$version/main"
	  pg_ctlcluster --skip-systemctl-redirect $$version main start || pg_ctlcluster $$version main start
	  for _ in $$(seq 1 30); do pg_isready -q -h $(PG_HOST) -p $(PG_PORT) && exit 0; sleep 1; done
	fi
	echo "No PostgreSQL answers at $(PG_HOST):$(PG_PORT) and none could be started here." >&2
	echo "Install one (Debian/Ubuntu: apt install postgresql; macOS: brew install postgresql@15)," >&2
	echo "allow the user in DATABASE_URL to connect, or point DATABASE_URL at a running server." >&2
	exit 1

.PHONY: nats
nats: ## make sure a NATS with JetStream answers at NATS_HOST:NATS_PORT, starting nats-server -js if it is installed
	@if $(NATS_ANSWERS); then exit 0; fi
	if command -v nats-server >/dev/null; then
	  mkdir -p target/nats
	  echo "no NATS at $(NATS_HOST):$(NATS_PORT); starting nats-server -js (store and log in target/nats/)"
	  nohup nats-server -js -a $(NATS_HOST) -p $(NATS_PORT) -sd target/nats -l target/nats/nats-server.log \
	    >/dev/null 2>&1 &
	  for _ in $$(seq 1 50); do $(NATS_ANSWERS) && exit 0; sleep 0.2; done
	  echo "nats-server did not answer at $(NATS_HOST):$(NATS_PORT); see target/nats/nats-server.log" >&2
	  exit 1
	fi
	echo "No NATS answers at $(NATS_HOST):$(NATS_PORT) and nats-server is not installed: the NATS tests" >&2
	echo "will say they were skipped. Install it (Debian/Ubuntu: apt install nats-server; macOS: brew" >&2
	echo "install nats-server) or start one with JetStream: nats-server -js." >&2

.PHONY: build
build: ## build the orderpay binary (debug)
	cargo build --bin orderpay

.PHONY: run
run: db ## run the mock provider and the service on a fresh database (DEMO_DATABASE), with a demo account and a walk-through
	@bin=$$(tests/scripts/cargo-exe.sh --bin orderpay)
	# Both ports must be free before anything is created: say which is taken and how to move.
	for address in $(ORDERPAY_LISTEN) $(MOCK_PROVIDER_LISTEN); do
	  if (exec 3<>"/dev/tcp/$${address%:*}/$${address##*:}") 2>/dev/null; then
	    echo "Something already listens on $$address (make run needs $(ORDERPAY_LISTEN) and $(MOCK_PROVIDER_LISTEN))." >&2
	    echo "Stop it, or run on other ports:" >&2
	    echo "  make run ORDERPAY_LISTEN=127.0.0.1:9080 MOCK_PROVIDER_LISTEN=127.0.0.1:9081" >&2
	    exit 1
	  fi
	done
	# A fresh database each run: the mock provider's state and this run's secrets are fresh too,
	# so nothing of an earlier run (its payments, its endpoints' sealed secrets) is left behind.
	export DATABASE_URL=$(DEMO_DATABASE_URL)
	PGOPTIONS='-c client_min_messages=warning' psql -q "$(PG_SERVER_URL)/postgres" \
	  -c 'DROP DATABASE IF EXISTS "$(DEMO_DATABASE)" WITH (FORCE)'
	RUST_LOG=warn "$$bin" migrate
	key=$$(RUST_LOG=warn "$$bin" accounts create demo)
	if [ "$${ORDERPAY_PROVIDER:-mock}" = stripe ]; then
	  # Stripe in test mode instead of the mock (docs/providers.md#going-live): the key and the
	  # endpoint's signing secret are the user's; no mock is started.
	  : "$${ORDERPAY_PROVIDER_API_KEY:?set ORDERPAY_PROVIDER_API_KEY to a test-mode secret key (sk_test_...)}"
	  : "$${ORDERPAY_PROVIDER_WEBHOOK_SECRET:?set ORDERPAY_PROVIDER_WEBHOOK_SECRET to the webhook signing secret (whsec_...; stripe listen prints one)}"
	  base="http://$(ORDERPAY_LISTEN)"
	  cat <<-MSG | sed -e "s/^|//"
	|
	|  orderpay on Stripe: $$base (database $(DEMO_DATABASE), made afresh for this run)
	|  Stripe's events reach it through the Stripe CLI, in another terminal:
	|    stripe listen --forward-to $$base/provider/webhooks
	|  (its whsec_ secret is the one ORDERPAY_PROVIDER_WEBHOOK_SECRET must hold). Then:
	|
	|    export KEY=$$key
	|    ORDER=\$$(curl -s $$base/orders -H "Authorization: Bearer \$$KEY" -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-order-1' -d '{"currency":"USD","items":[{"sku":"tee","quantity":2,"unit_price":"19.99"}]}' | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
	|    curl -si $$base/payments -H "Authorization: Bearer \$$KEY" -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-pay-1' -d "{\"order_id\":\"\$$ORDER\",\"payment_method\":\"pm_card_visa\"}"
	|
	|  The payment is a PaymentIntent in your Stripe test dashboard; pm_card_chargeDeclined declines.
	|
	MSG
	  ORDERPAY_WEBHOOK_ALLOW_PRIVATE=true ORDERPAY_WEBHOOK_REQUIRE_HTTPS=false exec "$$bin" serve
	fi
	# The provider's webhooks: a fresh secret shared by both processes, the mock posting its
	# signed events to the service.
	webhook_secret="whsec_$$(openssl rand -base64 32)"
	# Merchant webhooks: secrets sealed under a fresh key, endpoints on this machine and over
	# plain http allowed.
	encryption_key="$$(openssl rand -base64 32)"
	base="http://$(ORDERPAY_LISTEN)"
	# make drops blank recipe lines and the indentation after the tab: every line of the text
	# starts with | (removed by sed), so that both reach the terminal.
	cat <<-MSG | sed -e "s/^|//"
	|
	|  orderpay: $$base (database $(DEMO_DATABASE), made afresh for this run)
	|  mock payment provider: http://$(MOCK_PROVIDER_LISTEN)
	|  Ctrl-C stops both. In another terminal, paste the steps below one at a time.
	|
	|  0. The demo account's API key (shown this once), and a helper that prints the id of an
	|     answer, or the whole answer when the request was refused:
	|
	|    export KEY=$$key
	|    id_of() { python3 -c 'import json, sys; b = json.load(sys.stdin); print(b["id"]) if "id" in b else sys.exit(f"refused: {b}")'; }
	|
	|  1. Create an order and keep its id:
	|
	|    ORDER=\$$(curl -s $$base/orders -H "Authorization: Bearer \$$KEY" -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-order-1' -d '{"currency":"USD","items":[{"sku":"tee","quantity":2,"unit_price":"19.99"}]}' | id_of) && echo \$$ORDER
	|
	|  2. Pay it and keep the payment's id (pm_card_ok succeeds; pm_card_declined,
	|     pm_provider_timeout and pm_provider_pending do what they say, on other orders):
	|
	|    PAYMENT=\$$(curl -s $$base/payments -H "Authorization: Bearer \$$KEY" -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-pay-1' -d "{\"order_id\":\"\$$ORDER\",\"payment_method\":\"pm_card_ok\"}" | id_of) && echo \$$PAYMENT
	|
	|  3. Replay: the same request with the same key, headers shown. The same answer comes back,
	|     marked Idempotent-Replayed: true, and the provider still holds one charge:
	|
	|    curl -si $$base/payments -H "Authorization: Bearer \$$KEY" -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-pay-1' -d "{\"order_id\":\"\$$ORDER\",\"payment_method\":\"pm_card_ok\"}"
	|    curl -s http://$(MOCK_PROVIDER_LISTEN)/_admin/charges
	|
	|  4. Give 10.00 back: the order becomes partially_refunded (run it again: a replay, still one
	|     refund at the provider):
	|
	|    curl -si $$base/refunds -H "Authorization: Bearer \$$KEY" -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-refund-1' -d "{\"payment_id\":\"\$$PAYMENT\",\"amount\":\"10.00\"}"
	|
	|  5. Ship first, then capture: authorize a new order (capture_method manual), then capture it
	|     (or POST .../void instead):
	|
	|    ORDER2=\$$(curl -s $$base/orders -H "Authorization: Bearer \$$KEY" -H 'Content-Type: application/json' -d '{"currency":"USD","items":[{"sku":"mug","quantity":1,"unit_price":"8.50"}]}' | id_of) && echo \$$ORDER2
	|    AUTH=\$$(curl -s $$base/payments -H "Authorization: Bearer \$$KEY" -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-auth-1' -d "{\"order_id\":\"\$$ORDER2\",\"payment_method\":\"pm_card_ok\",\"capture_method\":\"manual\"}" | id_of) && echo \$$AUTH
	|    curl -si $$base/payments/\$$AUTH/capture -H "Authorization: Bearer \$$KEY" -H 'Idempotency-Key: demo-capture-1' -X POST
	|
	|  6. The mock sends signed webhooks to $$base/provider/webhooks: a pm_provider_pending payment
	|     (202) is succeeded as soon as the provider settles it (MOCK_PROVIDER_SETTLE_MS, 3 s).
	|     The webhooks the mock sent, and the account's events:
	|
	|    curl -s http://$(MOCK_PROVIDER_LISTEN)/_admin/webhooks
	|    curl -s $$base/events -H "Authorization: Bearer \$$KEY"
	|
	|  7. Merchant webhooks: register an endpoint (its secret is shown once); every later event of
	|     the account is POSTed to it, signed. \`python3 -m http.server 9000\` logs them arriving;
	|     it answers 501, so they are retried, and the operator command lists the endpoint:
	|
	|    curl -s $$base/webhook_endpoints -H "Authorization: Bearer \$$KEY" -H 'Content-Type: application/json' -d '{"url":"http://127.0.0.1:9000/hooks","enabled_events":["*"]}'
	|    DATABASE_URL=$(DEMO_DATABASE_URL) $$bin webhooks failing
	|
	|  The API description: $$base/openapi.yaml, rendered at $$base/docs
	|
	MSG
	MOCK_PROVIDER_WEBHOOK_URL="$$base/provider/webhooks" MOCK_PROVIDER_WEBHOOK_SECRET="$$webhook_secret" \
	  "$$bin" mock-provider & mock=$$!
	trap 'kill $$mock 2>/dev/null || true' EXIT
	if [ -z "$${ORDERPAY_NATS_URL:-}" ] && $(NATS_ANSWERS); then
	  export ORDERPAY_NATS_URL=nats://$(NATS_HOST):$(NATS_PORT)
	fi
	if [ -n "$${ORDERPAY_NATS_URL:-}" ]; then
	  prefix=$${ORDERPAY_NATS_SUBJECT_PREFIX:-orderpay.events}
	  echo "  Events are published to NATS JetStream at $$ORDERPAY_NATS_URL (stream"
	  echo "  $${ORDERPAY_NATS_STREAM:-ORDERPAY_EVENTS}, subjects $$prefix.<type>); with the nats CLI: nats sub '$$prefix.>'"
	else
	  echo "  No NATS at $(NATS_HOST):$(NATS_PORT): running without the NATS relay (make nats starts one)."
	fi
	ORDERPAY_PROVIDER_WEBHOOK_SECRET="$$webhook_secret" ORDERPAY_ENCRYPTION_KEY="$$encryption_key" \
	  ORDERPAY_WEBHOOK_ALLOW_PRIVATE=true ORDERPAY_WEBHOOK_REQUIRE_HTTPS=false "$$bin" serve

.PHONY: test
test: db nats node ## run the tests (all but chaos) against the local PostgreSQL and NATS, one database per test; then clients-test
	if cargo nextest --version >/dev/null 2>&1; then
	  cargo nextest run --workspace --all-targets --no-fail-fast -E 'not test(/^chaos::/) and not test(/^stripe_wire::/)'
	else
	  cargo test --workspace --no-fail-fast -- --skip chaos:: --skip stripe_wire::
	fi
	$(MAKE) --no-print-directory clients-test

.PHONY: node
node: ## make sure Node.js and npm are installed (Debian's nodejs and npm when missing)
	@if command -v node >/dev/null && command -v npm >/dev/null; then exit 0; fi
	echo "installing Debian's nodejs and npm"
	apt-get install -y -q nodejs npm >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q nodejs npm >/dev/null; }

.PHONY: clients-build
clients-build: node ## build the TypeScript client (clients/typescript/dist; its packages installed when missing)
	cd clients/typescript
	[ -d node_modules ] || npm ci --no-audit --no-fund
	npm run --silent build

.PHONY: clients-test
clients-test: db node clients-build ## the TypeScript client's tests (the shared vectors; the real service through the fault proxy) and both checkout examples
	FAULT_PROXY_BIN=$$(tests/scripts/cargo-exe.sh -p orderpay-fault-proxy --bin fault-proxy)
	export FAULT_PROXY_BIN
	npm --prefix clients/typescript test
	tests/scripts/with-service.sh npm --prefix clients/typescript run --silent test:service
	tests/scripts/with-service.sh tests/scripts/clients-examples.sh
	# Both package (clients-package also builds the crate from its package, a minute more).
	cargo package --quiet -p orderpay-client --no-verify --allow-dirty
	(cd clients/typescript && npm pack --dry-run --silent >/dev/null)

.PHONY: clients-package
clients-package: clients-build ## package both clients: cargo package (built from the package) and npm pack, into target/
	cargo package -p orderpay-client
	cd clients/typescript && npm pack --pack-destination ../../target

.PHONY: clients-faults
clients-faults: db node clients-build ## both clients through 20% faults: 1,000 intents each with retries, at the defaults, and with none (CLIENT_FAULT_INTENTS); target/clients-faults.txt
	intents=$${CLIENT_FAULT_INTENTS:-1000}
	FAULT_PROXY_BIN=$$(tests/scripts/cargo-exe.sh -p orderpay-fault-proxy --bin fault-proxy)
	export FAULT_PROXY_BIN CLIENT_FAULT_INTENTS=$$intents CLIENT_FAULT_MODES=retries,defaults,naive
	if cargo nextest --version >/dev/null 2>&1; then
	  CLIENT_FAULT_REPORT=target/clients-faults-rust.txt cargo nextest run --test api --no-capture -E 'test(/^clients::faulted/)'
	else
	  CLIENT_FAULT_REPORT=target/clients-faults-rust.txt cargo test --test api -- clients::faulted --nocapture
	fi
	tests/scripts/with-service.sh node clients/typescript/test/fault-run.mjs $$intents retries,defaults,naive \
	  > target/clients-faults-typescript.txt
	cat target/clients-faults-rust.txt target/clients-faults-typescript.txt | tee target/clients-faults.txt

.PHONY: checkout-check
checkout-check: db build node clients-build ## the checkout example in headless Chromium: double click, reload while held, offline, a dropped answer
	FAULT_PROXY_BIN=$$(tests/scripts/cargo-exe.sh -p orderpay-fault-proxy --bin fault-proxy)
	export FAULT_PROXY_BIN
	. tests/scripts/chromium.sh
	cd examples/checkout && { [ -d node_modules ] || npm ci --no-audit --no-fund; } && cd ../..
	tests/scripts/with-service.sh npm --prefix examples/checkout test

.PHONY: demo
demo: node clients-build ## the checkout example (http://127.0.0.1:3000) beside `make run`'s service, with an account of its own
	@if ! curl -fsS "http://$(ORDERPAY_LISTEN)/readyz" >/dev/null 2>&1; then
	  echo "No orderpay answers at http://$(ORDERPAY_LISTEN): start it with \`make run\` in another terminal." >&2
	  exit 1
	fi
	cd examples/checkout && { [ -d node_modules ] || npm ci --no-audit --no-fund --omit=dev; } && cd ../..
	log=$$(mktemp)
	trap 'rm -f "$$log"' EXIT
	key=$$(DATABASE_URL=$(DEMO_DATABASE_URL) "$$(tests/scripts/cargo-exe.sh --bin orderpay)" accounts create "checkout demo" 2>"$$log") || { cat "$$log" >&2; exit 1; }
	echo "  The checkout: http://$${CHECKOUT_LISTEN:-127.0.0.1:3000}/ (its own account; Ctrl-C stops it)"
	ORDERPAY_URL="http://$(ORDERPAY_LISTEN)" ORDERPAY_KEY="$$key" node examples/checkout/server.mjs

.PHONY: chaos
chaos: db ## crash, fault, outage and database failover tests (CHAOS_ORDERS, CHAOS_KILLS make them bigger), the crash chaos again over the Stripe wire
	if cargo nextest --version >/dev/null 2>&1; then
	  cargo nextest run --test api --no-fail-fast --no-capture -E 'test(/^chaos::/)'
	  CHAOS_WIRE=stripe cargo nextest run --test api --no-fail-fast --no-capture \
	    -E 'test(/^chaos::(payments_stay_exactly_once|refunds_stay_within)/)'
	else
	  cargo test --test api --no-fail-fast -- chaos:: --nocapture
	  CHAOS_WIRE=stripe cargo test --test api --no-fail-fast -- chaos::payments_stay_exactly_once chaos::refunds_stay_within --nocapture
	fi

.PHONY: test-stripe
test-stripe: db ## the Stripe adapter against localstripe (pip-installed into target/localstripe-venv once), started on a free port for the run
	venv=target/localstripe-venv
	if [ ! -x $$venv/bin/localstripe ]; then
	  python3 -m venv $$venv
	  $$venv/bin/pip install --quiet localstripe==$(LOCALSTRIPE_VERSION)
	fi
	port=$$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	mkdir -p target/localstripe
	$$venv/bin/localstripe --port $$port --from-scratch >target/localstripe/localstripe.log 2>&1 &
	localstripe=$$!
	trap 'kill $$localstripe 2>/dev/null || true' EXIT
	for _ in $$(seq 1 100); do
	  curl -fsS -o /dev/null -u sk_test_ready: "http://127.0.0.1:$$port/v1/balance" && break
	  kill -0 $$localstripe 2>/dev/null || { cat target/localstripe/localstripe.log >&2; exit 1; }
	  sleep 0.1
	done
	export LOCALSTRIPE_URL=http://127.0.0.1:$$port
	if cargo nextest --version >/dev/null 2>&1; then
	  cargo nextest run --test api --no-fail-fast -E 'test(/^stripe_wire::/)'
	else
	  cargo test --test api --no-fail-fast -- stripe_wire::
	fi

.PHONY: bench
bench: db ## the full benchmark on a private tuned PostgreSQL (bench/results.md and charts; under 40 minutes)
	command -v wrk >/dev/null || apt-get install -y -q wrk
	bench/venv.sh
	ORDERPAY_BIN=$$(tests/scripts/cargo-exe.sh --release --bin orderpay) python3 bench/run.py

.PHONY: bench-quick
bench-quick: db ## the benchmark's quick mode for iterating, a few minutes (written to bench/quick/)
	command -v wrk >/dev/null || apt-get install -y -q wrk
	bench/venv.sh
	ORDERPAY_BIN=$$(tests/scripts/cargo-exe.sh --release --bin orderpay) BENCH_QUICK=1 python3 bench/run.py

.PHONY: bench-report
bench-report: ## render bench/results.md and the charts again from bench/last-run.json
	bench/venv.sh
	python3 bench/run.py --report

.PHONY: bench-wal
bench-wal: db build ## WAL bytes per new order, payment, refund and capture, by table and record (pg_walinspect)
	tests/scripts/with-service.sh python3 bench/wal.py

.PHONY: bench-settlement
bench-settlement: db build ## settlement reconciliation of SETTLEMENT_MOVEMENTS (1,000,000) provider movements: rate and peak memory
	tests/scripts/with-service.sh python3 bench/settlement.py

.PHONY: contract
contract: db build ## check the running service against openapi.yaml with schemathesis (installed into .venv)
	tests/scripts/with-service.sh tests/scripts/contract.sh

.PHONY: docs-check
docs-check: db build ## every link of the Markdown files resolves inside the repository; GET /docs shows every endpoint in headless Chromium
	tests/scripts/links-check.py
	tests/scripts/with-service.sh tests/scripts/docs-check.sh

.PHONY: schema
schema: db ## regenerate src/db/schema.rs from the migrations (diesel print-schema)
	tests/scripts/schema.sh

.PHONY: schema-check
schema-check: db ## fail if src/db/schema.rs is not what the migrations generate
	tests/scripts/schema.sh --check

.PHONY: alerts-check
alerts-check: db ## check deploy/: promtool check and test rules (promtool installed if missing), the dashboard, and that both name only exported metrics
	deploy/check.sh
	if cargo nextest --version >/dev/null 2>&1; then
	  cargo nextest run --test api --no-fail-fast -E 'test(/^monitoring::/)'
	else
	  cargo test --test api --no-fail-fast -- monitoring::
	fi

.PHONY: lint
lint: cargo-deny ## rustfmt check, clippy with warnings denied (every workspace member), SQL's one home, rust-version, licenses, bans and sources
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	tests/scripts/sql-style.sh
	tests/scripts/rust-version-check.py
	# Offline: licenses, banned crates and where crates come from read Cargo.lock and the local
	# registry only. The advisories need the network: make audit.
	cargo deny --offline --log-level error check licenses bans sources

.PHONY: cargo-deny
cargo-deny: ## install cargo-deny when it is missing (cargo install --locked: a few minutes of build, once)
	@if cargo deny --version >/dev/null 2>&1; then exit 0; fi
	echo "installing cargo-deny (cargo install --locked cargo-deny; it builds for a few minutes, once)"
	cargo install --locked cargo-deny

.PHONY: audit
audit: cargo-deny ## RustSec advisories against Cargo.lock (fetches the advisory database; not part of CI)
	@if ! cargo deny fetch db >target/audit-fetch.log 2>&1; then
	  echo "make audit: the RustSec advisory database could not be fetched (no network, or its host" >&2
	  echo "is not reachable from here), so NO advisory was checked. cargo deny said:" >&2
	  tail -n 5 target/audit-fetch.log >&2
	  exit 2
	fi
	cargo deny --offline check advisories

.PHONY: model
model: ## check the protocol's model (docs/model.md): the unit configurations, the large one, the mutants and the defects, with state counts and times
	cargo test -p orderpay-model
	model=$$(tests/scripts/cargo-exe.sh --release -p orderpay-model --bin orderpay-model)
	for check in unit large mutants defects; do
	  echo "== $$check"
	  start=$$(date +%s)
	  "$$model" $$check
	  echo "($$check: $$(( $$(date +%s) - start )) s)"
	done

.PHONY: model-conformance
model-conformance: db ## drive more of the model's paths through the service and the mock (tests/api/conformance.rs; make test drives 12)
	CONFORMANCE_PATHS=$${CONFORMANCE_PATHS:-100} CONFORMANCE_SECONDS=$${CONFORMANCE_SECONDS:-900} \
	  cargo nextest run --test api -E 'test(/^conformance::/)' --no-capture

.PHONY: clean-test-dbs
clean-test-dbs: db ## drop databases left by interrupted test runs
	psql -h $(PG_HOST) -p $(PG_PORT) -U postgres -Atc \
	  "SELECT datname FROM pg_database WHERE datname LIKE 'orderpay\_test\_%'" |
	while read -r name; do psql -h $(PG_HOST) -p $(PG_PORT) -U postgres -qc "DROP DATABASE \"$$name\" WITH (FORCE)"; done
