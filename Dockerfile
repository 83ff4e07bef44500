# orderpay: multi-stage build. The runtime image holds one static-ish binary and runs as a
# non-root user. (Written for users; the machines this project is built on have no Docker engine,
# so this file is checked by reading, not by running.)

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so that source edits do not rebuild them: the workspace's manifests with
# empty sources (cargo loads every member, and the tests' path, to resolve the workspace), built
# once. A failure here fails the image: nothing hides it.
COPY Cargo.toml Cargo.lock ./
COPY clients/rust/Cargo.toml clients/rust/Cargo.toml
COPY model/Cargo.toml model/Cargo.toml
COPY tools/fault-proxy/Cargo.toml tools/fault-proxy/Cargo.toml
RUN for member in . clients/rust model tools/fault-proxy; do \
      mkdir -p "$member/src" && touch "$member/src/lib.rs" && echo 'fn main() {}' > "$member/src/main.rs"; \
    done \
    && mkdir -p tests/api && touch tests/api/main.rs \
    && cargo build --release --locked --bin orderpay
COPY src src
COPY migrations migrations
COPY assets assets
COPY openapi.yaml openapi.yaml
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin orderpay

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home orderpay
COPY --from=build /src/target/release/orderpay /usr/local/bin/orderpay
USER orderpay
# MIMALLOC_ALLOW_THP=0: mimalloc turns transparent huge pages off for the process, even on a
# host whose kernel grants them to every process (`always`); a mostly empty 2 MiB page counts
# whole in the service's memory (docs/operations.md).
ENV ORDERPAY_LISTEN=0.0.0.0:8080 \
    ORDERPAY_LOG_FORMAT=json \
    MIMALLOC_ALLOW_THP=0
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["orderpay"]
CMD ["serve"]
